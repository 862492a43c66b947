"""The one-command local stack: MariaDB, the broker (tansu on SeaweedFS or in memory), services.

``python -m services.stack up|down|status`` (or ``make up``). All state lives under
``HS_DATA_DIR`` (default ``var/``): SeaweedFS data, process logs and ``stack.json``.
"""
