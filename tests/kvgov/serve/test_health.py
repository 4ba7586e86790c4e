"""``/health`` over a real server when the engine thread does not answer: a 503 with
its reason in a JSON body once the health timeout passes, while the engine is still
stuck, and the other routes answer meanwhile."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from backends.local import backend as local_backend
from kvgov.serve.background import serving
from tests.kvgov.serve.api_support import served_app

TIMEOUT_S = 0.5  # the health timeout, cut from its 5 s so the test stays short


def test_health_is_503_while_the_engine_thread_is_stuck(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_backend, "_HEALTH_TIMEOUT_S", TIMEOUT_S)
    with (
        served_app() as (app, backend),
        serving(app) as url,
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        assert client.get("/health").status_code == 200
        stuck, release = threading.Event(), threading.Event()

        def stall() -> None:  # a command that holds the engine thread until released
            stuck.set()
            release.wait(60)

        backend._loop.call_soon(stall)
        try:
            assert stuck.wait(30), "the engine thread never took the command"
            started = time.monotonic()
            response = client.get("/health", timeout=10)  # not the engine's stall
            waited = time.monotonic() - started
            assert not release.is_set()  # answered while the engine was still stuck
            assert response.status_code == 503
            assert response.headers["content-type"] == "application/json"
            assert response.json() == {
                "ok": False,
                "detail": f"the engine thread did not answer in {TIMEOUT_S} s",
                "instance_id": app.state.kvgov.instance_id,
            }
            assert waited >= TIMEOUT_S  # it gave the engine its time first
            # the event loop is free: a route that needs no engine answers at once
            assert client.get("/version").status_code == 200
        finally:
            release.set()
        assert client.get("/health").status_code == 200  # back once the engine answers
