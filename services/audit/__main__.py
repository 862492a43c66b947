"""``python -m services.audit history|rebuild``: see :mod:`services.audit.cli`."""

from services.audit.cli import main

if __name__ == "__main__":
    main()
