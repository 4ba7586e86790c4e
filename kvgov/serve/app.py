"""``create_app``: the ASGI app of ``kvgov serve``, around one ``LocalBackend``.

Routes, one module each: ``openai_api`` (``/v1/...``, ``/tokenize``, ``/detokenize``),
``control`` (``/kvgov/v1/...``, the calls ``RemoteBackend`` makes), ``ops`` (``/health``,
``/version``). The app does not own the backend: whoever built it closes it after the
server stops (``kvgov serve`` does).

Every request passes ``gateway.Gateway`` first, in front of FastAPI's own layers (names
the server's instance on every answer; 401 without a valid key, except ``/health``, and
sets the tenant; 413 for a body over the limit). It runs the two generation routes itself
and hands every other request to FastAPI; the errors of either are answered in OpenAI's
shape by the handlers ``errors.install_error_handlers`` installs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from backends.local.backend import LocalBackend
from governor import __version__
from kvgov.serve import control, openai_api, ops, page
from kvgov.serve.errors import install_error_handlers
from kvgov.serve.gateway import Endpoint, Gateway
from kvgov.serve.limits import QueueGate
from kvgov.serve.openai_calls import ApiContext
from kvgov.serve.settings import ServeSettings
from kvgov.serve.state import ServerState

__all__ = ["ServeApp", "create_app"]


class ServeApp(FastAPI):
    """FastAPI with the gateway in front of all of it: FastAPI's layers (its error
    middleware, telemetry, routing) see only what the gateway hands on."""

    gateway: Gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.gateway(scope, receive, send)

    def open_gateway(
        self,
        *,
        instance_id: str,
        api_keys: Iterable[str],
        max_body_bytes: int,
        direct: Mapping[str, Endpoint],
    ) -> None:
        """Put the gateway in front of the app (``Gateway`` says what each option does)."""
        self.gateway = Gateway(
            self,
            super().__call__,
            instance_id=instance_id,
            api_keys=api_keys,
            max_body_bytes=max_body_bytes,
            direct=direct,
        )


def create_app(
    backend: LocalBackend, settings: ServeSettings | None = None, *, direct_routes: bool = True
) -> ServeApp:
    """The app. ``direct_routes=False`` sends the generation routes through FastAPI's
    router as every other route (the same endpoints and answers; the tests compare the
    two paths), at more of the event loop's CPU per call."""
    settings = settings or ServeSettings()
    state = ServerState(backend=backend, settings=settings)
    app = ServeApp(title="kvgov serve", version=__version__, docs_url=None, redoc_url=None)
    app.state.kvgov = state
    app.state.kvgov_api = ApiContext(
        gate=QueueGate(backend=backend, max_waiting_requests=settings.max_waiting_requests),
        max_model_len=backend.capacity().max_model_len,
    )
    install_error_handlers(app)
    app.open_gateway(
        instance_id=state.instance_id,
        api_keys=settings.api_keys,
        max_body_bytes=settings.max_body_bytes,
        direct=openai_api.MODEL_ENDPOINTS if direct_routes else {},
    )
    app.include_router(ops.router)
    app.include_router(openai_api.router)
    app.include_router(control.router)
    app.include_router(page.router)
    return app
