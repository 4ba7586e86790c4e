"""``LoadingApp``: ``kvgov serve`` listens at once and answers 503 while its engine loads.

A 9B model takes a minute or more to load. Listening first lets a load balancer or a
``RemoteBackend`` tell "loading" from "down": ``/health`` answers 503 with
``"loading": true`` and every other route an OpenAI-shaped 503 with ``Retry-After``
(``BackendUnavailable`` to a ``RemoteBackend``, which retries). The engine is built on a
thread of its own; when it is ready the app of ``create_app`` serves every request, and
if it fails ``/health`` says why and ``on_failed`` is told (``kvgov serve`` then stops
with exit code 2). Nothing is served from the engine before it is whole.

Thread-safety: the loader thread publishes the finished app with one assignment, which
the event loop reads; nothing else is shared.

The loader thread lives until ``close``: it ran the engine's first torch operations, so
it is an OpenMP master, and when such a thread exits, libgomp leaves the engine thread's
parallel regions spinning against each other. Measured on a loaded 2-core host, a
16-token call then took 1.6 s of CPU against 0.2 s with the loader kept alive (or the
engine built on the main thread, or ``OMP_WAIT_POLICY=passive``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from backends.local.backend import LocalBackend
from kvgov.serve.app import create_app
from kvgov.serve.errors import ApiError
from kvgov.serve.settings import ServeSettings

__all__ = ["LoadingApp"]

_RETRY_AFTER_S = 5


class LoadingApp:
    def __init__(
        self,
        settings: ServeSettings,
        load: Callable[[], LocalBackend],
        *,
        on_ready: Callable[[LocalBackend], None] = lambda backend: None,
        on_failed: Callable[[BaseException], None] = lambda error: None,
    ) -> None:
        self.settings = settings
        self._load = load
        self._on_ready = on_ready
        self._on_failed = on_failed
        self._app: FastAPI | None = None
        self._failure: str | None = None
        self._closed = False
        self._lock = threading.Lock()  # a leaf: guards backend and closed
        self._released = threading.Event()  # set by close: the loader thread may end
        self.backend: LocalBackend | None = None
        self._thread = threading.Thread(target=self._build, name="kvgov-load", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def ready(self) -> bool:
        return self._app is not None

    @property
    def instance_id(self) -> str | None:
        """The served app's instance id (``/version``), once the engine is loaded."""
        app = self._app
        return None if app is None else str(app.state.kvgov.instance_id)

    def close(self) -> None:
        """Close the engine, now or, if it is still loading, as soon as it is built."""
        with self._lock:
            self._closed = True
            backend, self.backend = self.backend, None
        if backend is not None:
            backend.close()
        self._released.set()

    def _build(self) -> None:
        try:
            backend = self._load()
        except BaseException as exc:  # reported on /health and to on_failed
            self._failure = f"the engine failed to load: {exc}"
            self._on_failed(exc)
            return
        with self._lock:
            closed = self._closed
            if not closed:
                self.backend = backend
        if closed:  # the server stopped while the engine loaded
            backend.close()
            return
        try:
            app = create_app(backend, self.settings)
        except BaseException as exc:
            self._failure = f"the server failed to start: {exc}"
            self._on_failed(exc)
            return
        self._on_ready(backend)
        self._app = app
        self._released.wait()  # see the module's docstring: this thread outlives the engine

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = self._app
        if app is not None:
            await app(scope, receive, send)
            return
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        detail = self._failure or "loading the model"
        if scope["path"] == "/health":
            body = {"ok": False, "detail": detail, "loading": self._failure is None}
            response = JSONResponse(body, status_code=503)
        else:
            retry = {"Retry-After": str(_RETRY_AFTER_S), "x-should-retry": "true"}
            message = (
                f"{detail}; retry in a few seconds"
                if self._failure is None
                else f"{detail}; the server is stopping"
            )
            code = "loading" if self._failure is None else "engine_failed"
            response = ApiError(503, message, code=code, headers=retry).response()
        await response(scope, receive, send)


async def _lifespan(receive: Receive, send: Send) -> None:
    """Startup and shutdown while loading: nothing to set up (the app of ``create_app``
    has no lifespan work of its own)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
