"""``kvgov serve`` listens while its engine loads: ``/health`` says 503 "loading", every
other route an OpenAI-shaped 503 with ``Retry-After`` (which ``RemoteBackend`` treats as
retriable), until the engine is whole; a load that fails is reported, never served."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from backends import RemoteBackend
from backends.local.backend import LocalBackend
from governor import BackendUnavailable, GenerationRequest
from kvgov.serve import ServeSettings
from kvgov.serve.background import serving
from kvgov.serve.loading import LoadingApp

_DEADLINE_S = 60.0


def _wait(condition: object, what: str) -> None:
    deadline = time.monotonic() + _DEADLINE_S
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_503_while_loading_then_the_engine_serves() -> None:
    go = threading.Event()
    ready: list[LocalBackend] = []

    def load() -> LocalBackend:
        assert go.wait(_DEADLINE_S)
        return LocalBackend(config={"num_blocks": 32})

    loading = LoadingApp(ServeSettings(), load, on_ready=ready.append)
    loading.start()
    try:
        with serving(loading) as url:
            health = httpx.get(f"{url}/health", timeout=10)
            assert health.status_code == 503
            assert health.json()["loading"] is True
            chat = httpx.post(
                f"{url}/v1/chat/completions",
                json={"model": "tiny-random", "messages": [{"role": "user", "content": "hi"}]},
                timeout=10,
            )
            assert chat.status_code == 503
            assert chat.headers["retry-after"] == "5"
            assert chat.json()["error"]["code"] == "loading"
            with (
                RemoteBackend(url, timeout=10) as remote,
                pytest.raises(BackendUnavailable) as raised,
            ):
                remote.capacity()
            assert raised.value.retriable
            go.set()
            _wait(lambda: loading.ready, "the engine did not load")
            assert ready == [loading.backend]
            assert httpx.get(f"{url}/health", timeout=10).status_code == 200
            with RemoteBackend(url, timeout=60) as remote:
                assert remote.capacity().num_blocks == 32
                result = remote.generate(GenerationRequest(prompt="hello there", max_tokens=3))
                assert result.completion_tokens == 3
    finally:
        go.set()
        loading.close()
    assert loading.backend is None


def test_a_failed_load_is_reported_and_never_served() -> None:
    failures: list[BaseException] = []

    def load() -> LocalBackend:
        raise RuntimeError("no weights in /models/missing")

    loading = LoadingApp(ServeSettings(), load, on_failed=failures.append)
    loading.start()
    _wait(lambda: failures, "the failure was not reported")
    with serving(loading) as url:
        health = httpx.get(f"{url}/health", timeout=10)
        assert health.status_code == 503
        assert health.json()["loading"] is False
        assert "no weights in /models/missing" in health.json()["detail"]
        models = httpx.get(f"{url}/v1/models", timeout=10)
        assert models.status_code == 503 and models.json()["error"]["code"] == "engine_failed"
    assert not loading.ready and loading.backend is None


def test_closed_while_loading_closes_the_engine_once_built() -> None:
    go = threading.Event()
    built: list[LocalBackend] = []

    def load() -> LocalBackend:
        assert go.wait(_DEADLINE_S)
        built.append(LocalBackend(config={"num_blocks": 8}))
        return built[0]

    loading = LoadingApp(ServeSettings(), load)
    loading.start()
    loading.close()
    go.set()
    _wait(lambda: built and not built[0].health().ok, "the engine built after close stayed open")
    assert not loading.ready


def test_the_thread_that_built_the_engine_lives_until_close() -> None:
    """The loader thread ran the engine's first torch operations (an OpenMP master); were
    it to exit while the engine runs, the engine thread's parallel regions would spin
    against each other (8x the CPU per call on a loaded host). No timing is asserted: the
    invariant is that it is alive exactly as long as the engine is open."""
    loading = LoadingApp(ServeSettings(), lambda: LocalBackend(config={"num_blocks": 8}))
    loading.start()
    _wait(lambda: loading.ready, "the engine did not load")
    backend = loading.backend
    assert backend is not None
    backend.generate(GenerationRequest(prompt="hello", max_tokens=2))
    assert loading._thread.is_alive()
    loading.close()
    loading._thread.join(timeout=_DEADLINE_S)
    assert not loading._thread.is_alive() and not backend.health().ok
