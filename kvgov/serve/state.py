"""``ServerState``: what every route of ``kvgov serve`` shares, kept on ``app.state.kvgov``.

The server is the HTTP face of one ``LocalBackend``: every engine call a route makes goes
through the backend, whose engine thread serializes them between steps. A route never
waits on the engine on the event loop: bookkeeping routes are plain ``def`` handlers
(Starlette runs them on its thread pool) or ``await asyncio.to_thread(...)``; model calls
use the backend's ``agenerate``/``astream``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from backends.local.backend import LocalBackend
from governor import __version__
from kvgov.serve.events import EventLog
from kvgov.serve.settings import ServeSettings
from kvgov.serve.tenancy import TenantPins, tenant_id

__all__ = ["ServerState"]


@dataclass(slots=True)
class ServerState:
    backend: LocalBackend
    settings: ServeSettings
    # A new id each time a server starts: a client that sees it change knows the engine
    # restarted and its budgets, pins and holds are gone.
    instance_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started_at: float = field(default_factory=time.time)
    version: str = __version__
    events: EventLog = field(default_factory=EventLog)
    pins: TenantPins = field(default_factory=TenantPins)  # each pin's tenant
    admin_tenants: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        self.admin_tenants = frozenset(tenant_id(key) for key in self.settings.admin_api_keys)

    def is_bound(self, tenant: str) -> bool:
        """Whether the per-tenant shares bound this tenant's calls (``ServeSettings`` says
        which): a key's that is not an admin's; never on a server without keys."""
        return bool(tenant) and tenant not in self.admin_tenants

    @property
    def model_name(self) -> str:
        return self.settings.served_model_name or self.backend.model
