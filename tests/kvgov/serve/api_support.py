"""What the tests of the OpenAI routes share: engines built once per process, an app
around a fresh ``LocalBackend`` on one of them, and the check that nothing leaked.

Building the tiny-random engine takes seconds, so each engine configuration is built
once and wrapped by a new ``LocalBackend`` (a new engine thread) per app; the prefix
cache is reset between apps so one test's cache never shows in another's figures. An
engine takes one loop at a time, so while an app (a module's fixture) still drives it, the
next app gets another engine of the same configuration, built then and kept.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from backends.local.backend import LocalBackend
from governor.backend import BackendMetrics
from governor.errors import ConfigError
from kvgov.serve import ServeSettings, create_app
from kvgov.serve.gateway import ACCESS_LOGGER

__all__ = ["fresh_backend", "idle_metrics", "kept_logging", "routed_requests", "served_app"]

NUM_BLOCKS = 64  # 1,024 tokens of KV: small enough that a leak shows at once


_ENGINES: dict[tuple[int, int], list[Any]] = {}


def _new_engine(num_blocks: int, max_num_seqs: int) -> Any:
    from engine.engine import Engine

    engine = Engine.from_pretrained("tiny-random", num_blocks=num_blocks, max_num_seqs=max_num_seqs)
    _ENGINES.setdefault((num_blocks, max_num_seqs), []).append(engine)
    return engine


@contextmanager
def served_app(
    *,
    num_blocks: int = NUM_BLOCKS,
    max_num_seqs: int = 64,
    direct_routes: bool = True,
    **settings: Any,
) -> Iterator[tuple[FastAPI, LocalBackend]]:
    backend = fresh_backend(num_blocks=num_blocks, max_num_seqs=max_num_seqs)
    app = create_app(backend, ServeSettings(**settings), direct_routes=direct_routes)
    try:
        yield app, backend
        # every model call that entered the queue gate left it, however it ended
        assert app.state.kvgov_api.gate.num_in_flight == 0
    finally:
        backend.close()


def fresh_backend(
    *,
    num_blocks: int = NUM_BLOCKS,
    max_num_seqs: int = 64,
    kind: type[LocalBackend] = LocalBackend,
) -> LocalBackend:
    """A new backend (``kind``: ``LocalBackend`` or a class derived from it) on the shared
    engine of this configuration, its prefix cache emptied; the caller closes it."""
    from engine.engine_loop import EngineInUseError

    for engine in _ENGINES.get((num_blocks, max_num_seqs), []):
        try:
            backend = kind(engine)
        except ConfigError as exc:  # an app still open drives it: try the next
            if not isinstance(exc.__cause__, EngineInUseError):
                raise
        else:
            break
    else:
        backend = kind(_new_engine(num_blocks, max_num_seqs))
    backend._loop.call(backend._engine.reset_prefix_cache)  # on the engine's own thread
    return backend


def idle_metrics(backend: LocalBackend, timeout_s: float = 10.0) -> BackendMetrics:
    """The backend's metrics once no request runs or waits (aborts reach the engine
    thread asynchronously); whatever they are at the deadline otherwise."""
    deadline = time.monotonic() + timeout_s
    while True:
        metrics = backend.metrics()
        idle = metrics.num_requests_running == 0 and metrics.num_requests_waiting == 0
        if (idle and metrics.num_blocks_in_use == 0) or time.monotonic() > deadline:
            return metrics
        time.sleep(0.02)


def routed_requests(app: FastAPI) -> list[tuple[str, str]]:
    """The ``(method, path)`` of every HTTP request that ``app``'s router runs from now
    on, appended as it enters the router: what tells a request the gateway served
    directly (never routed) from one FastAPI routed."""
    seen: list[tuple[str, str]] = []
    inner = app.router.middleware_stack

    async def recorded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            seen.append((scope["method"], scope["path"]))
        await inner(scope, receive, send)

    app.router.middleware_stack = recorded
    return seen


_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", ACCESS_LOGGER)


@contextmanager
def kept_logging() -> Iterator[None]:
    """uvicorn configures these loggers as its ``Config`` is made (``kvgov serve``'s
    settings give them handlers on the streams of the moment: a ``CliRunner``'s, closed
    once it returns): put them back after, so no later test logs to a closed stream."""
    saved = {
        name: (list(lg.handlers), lg.level, lg.propagate)
        for name in _LOGGERS
        if (lg := logging.getLogger(name))
    }
    try:
        yield
    finally:
        for name, (handlers, level, propagate) in saved.items():
            lg = logging.getLogger(name)
            lg.handlers[:] = handlers
            lg.setLevel(level)
            lg.propagate = propagate
