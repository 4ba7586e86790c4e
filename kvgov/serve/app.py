"""``create_app``: the ASGI app of ``kvgov serve``, around one ``LocalBackend``.

Routes, one module each: ``openai_api`` (``/v1/...``, ``/tokenize``, ``/detokenize``),
``control`` (``/kvgov/v1/...``, the calls ``RemoteBackend`` makes), ``ops`` (``/health``,
``/version``). The app does not own the backend: whoever built it closes it after the
server stops (``kvgov serve`` does).
"""

from __future__ import annotations

from fastapi import FastAPI

from governor import __version__
from governor.local_backend import LocalBackend
from kvgov.serve import control, openai_api, ops, page
from kvgov.serve.settings import ServeSettings
from kvgov.serve.state import ServerState

__all__ = ["create_app"]


def create_app(backend: LocalBackend, settings: ServeSettings | None = None) -> FastAPI:
    state = ServerState(backend=backend, settings=settings or ServeSettings())
    app = FastAPI(title="kvgov serve", version=__version__, docs_url=None, redoc_url=None)
    app.state.kvgov = state
    app.include_router(ops.router)
    app.include_router(openai_api.router)
    app.include_router(control.router)
    app.include_router(page.router)
    return app
