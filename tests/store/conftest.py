from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.redis_server import RedisServer

_names = itertools.count()


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One real redis-server per module, on a free loopback port."""
    server = RedisServer(Path(tmp_path_factory.mktemp("redis"))).start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def namespace(request: pytest.FixtureRequest) -> str:
    """A namespace of the test's own: tests share the server, never a budget."""
    return f"{request.node.name}-{next(_names)}"
