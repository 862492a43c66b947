"""The web UI served by ingest under ``/ui``: batches, job groups, jobs, billing, ops.

Mount it with :func:`setup` from the app factory; see :mod:`.routes` for the pages and
:mod:`.session` for cookie login and CSRF.
"""

from __future__ import annotations

from aiohttp import web

from services.common.settings import LogSettings, load_settings
from services.ingest.billing import Billing
from services.ingest.commands import Commands
from services.ingest.ops import Ops
from services.ingest.reads import Reads
from services.ingest.spending import Spending
from services.ingest.store import Store
from services.ingest.ui import routes
from services.ingest.ui.session import UserCache

__all__ = ["setup"]


async def _to_ui(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound(f"{routes.PREFIX}/batches")


def setup(app: web.Application, store: Store, reads: Reads, commands: Commands,
          billing: Billing, *, log: LogSettings | None = None) -> None:
    """Mount the UI on ``app`` at ``/ui``, reading through ``reads``/``billing`` and cancelling
    through ``commands``; consumer lag uses ``log`` (default: the HS_* settings)."""
    ui = routes.sub_app(reads, commands, billing, Ops(store, log or load_settings().log),
                        Spending(store), UserCache(store))
    app.router.add_get(routes.PREFIX, _to_ui)
    app.add_subapp(routes.PREFIX, ui)
