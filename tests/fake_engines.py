"""Fake vLLM and SGLang servers: Starlette apps that answer in the engines' own shapes.

A FAKE, because neither engine runs on these machines (CUDA only). Each app serves the
recorded fixtures of tests/backends/fixtures/{vllm,sglang}/ (what each engine's source
at the version named in the README there emits) and a minimal ``/v1/chat/completions``,
``/v1/completions``, ``/v1/models`` and ``/tokenize``: one token per whitespace-separated
word, a reply of ``max_tokens`` words, and the engine's own 400 body when the prompt is
longer than the context. ``FakeEngine`` switches what it serves:

- ``restart()``: counters back to zero and a new start (vLLM's
  ``process_start_time_seconds`` and ``_created``, SGLang's ``startup_time``);
- ``missing``: metric families and routes to leave out, as an older or stripped-down
  server would (a route left out answers 404);
- ``fixtures``: which recorded set to serve (one rank, two ranks, an old version).
- ``dies_under_a_call``: the next generation waits in the engine (``call_arrived`` is set)
  until ``restart()``, then fails as a dying engine fails the calls it had: vLLM's server,
  when its engine core dies (``EngineDeadError``), answers each call in flight with a
  bare 500 and exits; a stream already under way gets an error event, then ``[DONE]``
  (its chat stream generator's ``except``). Once: the restarted engine answers.

``requests`` records every generation body received, for tests of what a client sent
(``priority``, ``cache_salt``, ``max_tokens``).
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

FIXTURES = Path(__file__).resolve().parent / "backends" / "fixtures"

# route -> fixture file, per engine and fixture set
VLLM_SETS = {
    "single": {"/metrics": "metrics.txt", "/v1/models": "models.json", "/version": "version.json"},
    "dp2": {"/metrics": "metrics_dp2.txt", "/v1/models": "models.json", "/version": "version.json"},
    "v0_8": {"/metrics": "metrics_v0_8.txt", "/v1/models": "models.json"},  # no /version read
}
SGLANG_SETS = {
    "single": {
        "/metrics": "metrics.txt",
        "/v1/models": "models.json",
        "/server_info": "server_info.json",
        "/v1/loads": "loads.json",
    },
    "dp2": {
        "/metrics": "metrics_dp2_priority.txt",
        "/v1/models": "models.json",
        "/server_info": "server_info_dp2_priority.json",
        "/v1/loads": "loads_dp2.json",
    },
    "legacy": {  # before /server_info and /v1/loads: /get_server_info and /get_load
        "/metrics": "metrics_dp2_priority.txt",
        "/v1/models": "models.json",
        "/get_server_info": "server_info_dp2_priority.json",
        "/get_load": "get_load_legacy.json",
    },
}
_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?P<labels>\{.*\})?\s+(?P<value>\S+)")


@dataclass(slots=True)
class FakeEngine:
    engine: str  # "vllm" or "sglang"
    fixtures: str = "single"
    missing: set[str] = field(default_factory=set)  # metric names and routes left out
    max_model_len: int | None = None  # None: the fixture's
    restarts: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)
    dies_under_a_call: bool = False
    call_arrived: threading.Event = field(default_factory=threading.Event)
    _restart_event: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def restart(self) -> None:
        with self._lock:
            self.restarts += 1
        self._restart_event.set()

    def _dies_now(self) -> bool:
        """This call is the one in flight when the engine dies (``dies_under_a_call``)."""
        with self._lock:
            dies, self.dies_under_a_call = self.dies_under_a_call, False
        if dies:
            self.call_arrived.set()
        return dies

    async def _until_restarted(self) -> None:
        if not await asyncio.to_thread(self._restart_event.wait, 10.0):
            raise RuntimeError("the test never restarted the fake engine (10 s)")

    def routes(self) -> dict[str, str]:
        sets = VLLM_SETS if self.engine == "vllm" else SGLANG_SETS
        return {
            route: name for route, name in sets[self.fixtures].items() if route not in self.missing
        }

    def metrics_text(self) -> str | None:
        name = self.routes().get("/metrics")
        if name is None:
            return None
        lines = []
        for line in (FIXTURES / self.engine / name).read_text().splitlines():
            match = _SAMPLE.match(line)
            family = line.split()[2] if line.startswith("# ") and len(line.split()) > 2 else None
            metric = match["name"] if match else family
            if metric is not None and any(
                metric == gone or metric.startswith(gone + "_") for gone in self.missing
            ):
                continue
            lines.append(self._restarted(line, match) if match and self.restarts else line)
        return "\n".join(lines) + "\n"

    def _restarted(self, line: str, match: re.Match[str]) -> str:
        name, value = match["name"], float(match["value"])
        if name.endswith("_total"):
            value = 0.0  # a counter starts again at zero
        elif name == "process_start_time_seconds" or name.endswith("_created"):
            value += 3600.0 * self.restarts
        else:
            return line
        return f"{name}{match['labels'] or ''} {value!r}"

    def json_body(self, route: str) -> Any | None:
        name = self.routes().get(route)
        if name is None:
            return None
        body = json.loads((FIXTURES / self.engine / name).read_text())
        if route in ("/server_info", "/get_server_info") and self.restarts:
            body["startup_time"]["scheduler_e2e"] += 0.001 * self.restarts
        if route == "/v1/models" and self.max_model_len is not None:
            body["data"][0]["max_model_len"] = self.max_model_len
        return body

    def context_length(self) -> int:
        body = self.json_body("/v1/models") or json.loads(
            (FIXTURES / self.engine / "models.json").read_text()
        )
        return int(body["data"][0]["max_model_len"])

    def too_long(self, prompt_tokens: int, max_tokens: int) -> dict[str, Any] | None:
        """The engine's own 400 body for a prompt longer than the context, else None."""
        limit = self.context_length()
        if self.engine == "vllm" and prompt_tokens > limit:
            return {
                "error": {
                    "message": f"This model's maximum context length is {limit} tokens. "
                    f"However, your prompt contains {prompt_tokens} input tokens, which "
                    "exceeds this limit even without any output tokens. Please reduce the "
                    f"length of the input prompt. (parameter=input_tokens, value={prompt_tokens})",
                    "type": "BadRequestError",
                    "param": "input_tokens",
                    "code": 400,
                }
            }
        if self.engine == "sglang" and prompt_tokens >= limit:
            return {
                "object": "error",
                "message": f"The input ({prompt_tokens} tokens) is longer than the model's "
                f"context length ({limit} tokens).",
                "type": "BadRequest",
                "param": None,
                "code": 400,
            }
        if self.engine == "sglang" and prompt_tokens + max_tokens > limit:
            return {
                "object": "error",
                "message": "Requested token count exceeds the model's maximum context length "
                f"of {limit} tokens. You requested a total of {prompt_tokens + max_tokens} "
                f"tokens: {prompt_tokens} tokens from the input messages and {max_tokens} "
                "tokens for the completion. Please reduce the number of tokens in the input "
                "messages or the completion to fit within the limit.",
                "type": "BadRequest",
                "param": None,
                "code": 400,
            }
        return None


def _words(body: dict[str, Any]) -> list[str]:
    if "messages" in body:
        return [w for m in body["messages"] for w in str(m.get("content", "")).split()]
    prompt = body.get("prompt", "")
    return prompt.split() if isinstance(prompt, str) else [str(t) for t in prompt]


def create_app(fake: FakeEngine) -> Starlette:
    async def metrics(request: Request) -> Response:
        text = fake.metrics_text()
        if text is None:
            return PlainTextResponse("Not Found", status_code=404)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def json_route(request: Request) -> Response:
        body = fake.json_body(request.url.path)
        if body is None:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        return JSONResponse(body)

    async def tokenize(request: Request) -> Response:
        body = await request.json()
        tokens = list(range(len(_words(body))))
        return JSONResponse(
            {"count": len(tokens), "max_model_len": fake.context_length(), "tokens": tokens}
        )

    async def generate(request: Request) -> Response:
        body = await request.json()
        with fake._lock:
            fake.requests.append(body)
        prompt_tokens = len(_words(body))
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        error = fake.too_long(prompt_tokens, max_tokens)
        if error is not None:
            return JSONResponse(error, status_code=400)
        chat = request.url.path.endswith("/chat/completions")
        # vLLM clamps max_tokens to the context left; so does this fake
        completion = min(max_tokens, fake.context_length() - prompt_tokens)
        text = " ".join(["tok"] * completion)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
        }
        finish = "length" if completion == max_tokens else "stop"
        base = {
            "id": f"cmpl-{len(fake.requests)}",
            "created": int(time.time()),
            "model": body.get("model"),
        }
        dies = fake._dies_now()
        if dies and body.get("stream"):
            return StreamingResponse(
                _dying_stream(fake, base, chat, text), media_type="text/event-stream"
            )
        if dies:
            await fake._until_restarted()
            return Response(status_code=500)
        if body.get("stream"):
            return StreamingResponse(
                _stream(base, chat, text, finish, usage), media_type="text/event-stream"
            )
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return JSONResponse(
            {
                **base,
                "object": "chat.completion" if chat else "text_completion",
                "choices": [choice],
                "usage": usage,
            }
        )

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    routes = [
        Route("/metrics", metrics),
        Route("/health", health),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/v1/chat/completions", generate, methods=["POST"]),
        Route("/v1/completions", generate, methods=["POST"]),
    ]
    for path in (
        "/v1/models",
        "/version",
        "/server_info",
        "/get_server_info",
        "/v1/loads",
        "/get_load",
    ):
        routes.append(Route(path, json_route))
    return Starlette(routes=routes)


async def _stream(base: dict[str, Any], chat: bool, text: str, finish: str, usage: dict[str, int]):
    kind = "chat.completion.chunk" if chat else "text_completion"
    delta = {"delta": {"role": "assistant", "content": text}} if chat else {"text": text}
    first = {**base, "object": kind, "choices": [{"index": 0, **delta, "finish_reason": None}]}
    yield f"data: {json.dumps(first)}\n\n"
    end = {"delta": {}} if chat else {"text": ""}
    last = {**base, "object": kind, "choices": [{"index": 0, **end, "finish_reason": finish}]}
    yield f"data: {json.dumps(last)}\n\n"
    yield f"data: {json.dumps({**base, 'object': kind, 'choices': [], 'usage': usage})}\n\n"
    yield "data: [DONE]\n\n"


async def _dying_stream(fake: FakeEngine, base: dict[str, Any], chat: bool, text: str):
    kind = "chat.completion.chunk" if chat else "text_completion"
    delta = {"delta": {"role": "assistant", "content": text}} if chat else {"text": text}
    first = {**base, "object": kind, "choices": [{"index": 0, **delta, "finish_reason": None}]}
    yield f"data: {json.dumps(first)}\n\n"
    await fake._until_restarted()
    error = {
        "message": "EngineCore encountered an issue. See stack trace (above) for the root cause.",
        "type": "InternalServerError",
        "param": None,
        "code": 500,
    }
    yield f"data: {json.dumps({'error': error})}\n\n"
    yield "data: [DONE]\n\n"


class ClientProbeHTTP:
    """``ProbeHTTP`` over any ``httpx.Client`` (a Starlette ``TestClient`` here): 404 is
    ``None``, as the backends' own transport reads it."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def get_text(self, path: str) -> str | None:
        response = self._client.get(path)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return response.text

    def get_json(self, path: str) -> Any | None:
        response = self._client.get(path)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return response.json()


@contextmanager
def serving(fake: FakeEngine) -> Iterator[str]:
    """The fake served by uvicorn on a free loopback port, in a thread; yields its URL."""
    import uvicorn

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = uvicorn.Config(create_app(fake), host="127.0.0.1", port=port, log_level="error")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10.0
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the fake engine did not start within 10 s")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10.0)
