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

from governor import __version__
from governor.local_backend import LocalBackend
from kvgov.serve.events import EventLog
from kvgov.serve.settings import ServeSettings
from kvgov.serve.tenancy import TenantPins

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

    @property
    def model_name(self) -> str:
        return self.settings.served_model_name or self.backend.model
