from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends.local.backend import LocalBackend
from kvgov.serve.background import running_server
from tests.kvgov.serve.api_support import served_app
from tests.redis_server import RedisServer

NUM_BLOCKS = 64  # the engine's KV: the agents' ceilings are sized from it

_names = itertools.count()


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One real redis-server per module, on a free loopback port."""
    server = RedisServer(Path(tmp_path_factory.mktemp("redis"))).start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="module")
def serve() -> Iterator[tuple[str, LocalBackend]]:
    """kvgov serve on the tiny-random engine, in this process (whose engine the tests
    read directly), for the agent processes to call."""
    with served_app(num_blocks=NUM_BLOCKS) as (app, backend), running_server(app) as (url, _):
        yield url, backend


@pytest.fixture
def namespace(request: pytest.FixtureRequest) -> str:
    """A namespace of the test's own: tests share the server, never a budget."""
    return f"{request.node.name}-{next(_names)}"
