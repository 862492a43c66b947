"""The projection schema: forward-only numbered migrations (``NNN-description.sql``), a runner.

See ``sql/README.md`` for the rules a migration follows and ``sql.migrate`` for the runner.
"""
