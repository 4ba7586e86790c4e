"""``create_app``: the ASGI app of ``kvgov serve``, around one ``LocalBackend``.

Routes, one module each: ``openai_api`` (``/v1/...``, ``/tokenize``, ``/detokenize``),
``control`` (``/kvgov/v1/...``, the calls ``RemoteBackend`` makes), ``ops`` (``/health``,
``/version``). The app does not own the backend: whoever built it closes it after the
server stops (``kvgov serve`` does).

Every request passes, outermost first: ``InstanceHeaderMiddleware`` (names the server's
instance on every answer), ``AuthMiddleware`` (401 without a valid key,
except ``/health``; sets the tenant), ``BodyLimitMiddleware`` (413), then the routes,
whose errors ``errors.install_error_handlers`` answers in OpenAI's shape.
"""

from __future__ import annotations

from fastapi import FastAPI

from governor import __version__
from governor.local_backend import LocalBackend
from kvgov.serve import control, openai_api, ops, page
from kvgov.serve.errors import install_error_handlers
from kvgov.serve.instance import InstanceHeaderMiddleware
from kvgov.serve.limits import BodyLimitMiddleware, QueueGate
from kvgov.serve.openai_calls import ApiContext
from kvgov.serve.security import AuthMiddleware
from kvgov.serve.settings import ServeSettings
from kvgov.serve.state import ServerState

__all__ = ["create_app"]


def create_app(backend: LocalBackend, settings: ServeSettings | None = None) -> FastAPI:
    settings = settings or ServeSettings()
    state = ServerState(backend=backend, settings=settings)
    app = FastAPI(title="kvgov serve", version=__version__, docs_url=None, redoc_url=None)
    app.state.kvgov = state
    app.state.kvgov_api = ApiContext(
        gate=QueueGate(backend=backend, max_waiting_requests=settings.max_waiting_requests),
        max_model_len=backend.capacity().max_model_len,
    )
    install_error_handlers(app)
    # add_middleware wraps what is there: the last added runs first.
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(AuthMiddleware, api_keys=settings.api_keys)
    app.add_middleware(InstanceHeaderMiddleware, instance_id=state.instance_id)
    app.include_router(ops.router)
    app.include_router(openai_api.router)
    app.include_router(control.router)
    app.include_router(page.router)
    return app
