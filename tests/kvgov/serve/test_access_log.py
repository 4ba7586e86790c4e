"""The access log: one line per request in uvicorn's words, written by the gateway once the
answer is sent (``kvgov.serve.gateway``), through uvicorn's handler and format under
``kvgov serve``'s uvicorn settings, with uvicorn's own access log off (no second line)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httpx
import pytest
from uvicorn.logging import AccessFormatter

from kvgov.cli.serve import uvicorn_config
from kvgov.serve.background import serving
from kvgov.serve.gateway import ACCESS_LOGGER
from tests.kvgov.serve.api_support import kept_logging, routed_requests, served_app


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.setFormatter(
            AccessFormatter(
                '%(client_addr)s - "%(request_line)s" %(status_code)s', use_colors=False
            )
        )

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_kvgov_serve_writes_one_line_per_request_in_uvicorns_words() -> None:
    lines = Lines()
    with (
        kept_logging(),
        served_app() as (app, _backend),
        serving(app, config=uvicorn_config) as url,
    ):
        logging.getLogger(ACCESS_LOGGER).addHandler(lines)
        # uvicorn's own access log is off: its logger has no handler, so no second line
        assert not logging.getLogger("uvicorn.access").hasHandlers()
        with httpx.Client(base_url=url, timeout=60) as client:
            assert client.get("/version?x=1").status_code == 200
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            assert client.post("/v1/chat/completions", json=body).status_code == 200
            assert client.post("/v1/chat/completions", content=b"{").status_code == 400
            assert client.get("/no such path").status_code == 404
        time.sleep(0.2)  # the last line is written after its answer was sent
    messages = [lines.format(r) for r in lines.records]
    port = lines.records[0].args[0].rsplit(":", 1)[1]  # type: ignore[index]
    assert messages == [
        f'127.0.0.1:{port} - "GET /version?x=1 HTTP/1.1" 200 OK',
        f'127.0.0.1:{port} - "POST /v1/chat/completions HTTP/1.1" 200 OK',
        f'127.0.0.1:{port} - "POST /v1/chat/completions HTTP/1.1" 400 Bad Request',
        f'127.0.0.1:{port} - "GET /no%20such%20path HTTP/1.1" 404 Not Found',
    ]


def _scope(method: str, path: str) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 5555),
        "server": ("127.0.0.1", 8000),
    }


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/version", b""),
        ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], '
                                         b'"max_tokens": 2}'),
    ],
    ids=["routed", "direct"],
)  # fmt: skip
def test_the_line_is_written_after_the_answer_is_sent(method: str, path: str, body: bytes) -> None:
    """On the routed path and the direct one: the answer's head and body go out first,
    then its line, so no caller waits for the log."""
    events: list[str] = []

    class Order(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            events.append(f"log {record.args[-1]}")  # type: ignore[index]

    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:  # the body was read: nothing more comes (no disconnect either)
            await asyncio.Event().wait()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        events.append(message["type"])

    access = logging.getLogger(ACCESS_LOGGER)
    handler, level = Order(), access.level
    access.addHandler(handler)
    access.setLevel(logging.INFO)
    try:
        with served_app() as (app, _backend):
            routed = routed_requests(app)
            asyncio.run(app(_scope(method, path), receive, send))
    finally:
        access.removeHandler(handler)
        access.setLevel(level)
    assert events[0] == "http.response.start" and events[-1] == "log 200"
    assert set(events[1:-1]) == {"http.response.body"}
    # each went its own way: a model call past FastAPI's router, the rest through it
    assert routed == ([] if method == "POST" else [(method, path)])
