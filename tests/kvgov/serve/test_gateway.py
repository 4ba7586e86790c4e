"""The gateway's direct path for the generation routes answers exactly as FastAPI's
router does: two apps on one engine, one serving ``/v1/chat/completions`` and
``/v1/completions`` directly (the default) and one routing them (``direct_routes=False``),
each under a real uvicorn server, sent the same requests. Answers, refusals, the events
they record, the body limit, keys and a bug's 500 must match; every answer names its
server's instance. Each app's router records the requests it runs: the direct app's
never sees a generation call, the routed app's sees every one the gateway lets through,
so an app that quietly took the routed path for both would fail here. (Disconnects on
both paths: ``test_disconnect``.)
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from backends.local.backend import LocalBackend
from backends.remote.wire import INSTANCE_HEADER
from governor.backend import GenerationRequest, GenerationResult
from kvgov.serve import ServeSettings, create_app
from kvgov.serve.background import serving
from kvgov.serve.limits import QueueGate
from kvgov.serve.state import ServerState
from tests.kvgov.serve.api_support import fresh_backend, idle_metrics, routed_requests

KEY = "sk-gateway"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT, TEXT = "/v1/chat/completions", "/v1/completions"
HELLO = [{"role": "user", "content": "Say hello to the gateway."}]
MAX_BODY = 64_000
# What a client may act on besides the body (the instance header is checked apart).
HEADERS = ("content-type", "x-should-retry", "retry-after", "www-authenticate", "allow")


@dataclass(frozen=True, slots=True)
class Served:
    state: ServerState
    gate: QueueGate
    client: httpx.Client
    routed: list[tuple[str, str]]  # (method, path) of each request the app's router ran


@contextmanager
def both_paths(backend: LocalBackend) -> Iterator[dict[str, Served]]:
    """The direct and the routed app on ``backend``, each under uvicorn, with a client."""
    settings = ServeSettings(api_keys=(KEY,), max_body_bytes=MAX_BODY)
    with ExitStack() as stack:
        served = {}
        for name, direct in (("direct", True), ("routed", False)):
            app = create_app(backend, settings, direct_routes=direct)
            routed = routed_requests(app)
            url = stack.enter_context(serving(app))
            client = stack.enter_context(httpx.Client(base_url=url, headers=AUTH, timeout=60))
            served[name] = Served(app.state.kvgov, app.state.kvgov_api.gate, client, routed)
        yield served
        # every model call that passed the queue gate left it, on either path
        assert [each.gate.num_in_flight for each in served.values()] == [0, 0]
        assert generation_calls(served["direct"].routed) == []  # never routed


def generation_calls(routed: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(method, path) for method, path in routed if method == "POST" and path in (CHAT, TEXT)]


@pytest.fixture(scope="module")
def paths() -> Iterator[tuple[dict[str, Served], LocalBackend]]:
    backend = fresh_backend()
    try:
        with both_paths(backend) as served:
            yield served, backend
    finally:
        backend.close()


@pytest.fixture
def served(paths: tuple[dict[str, Served], LocalBackend]) -> Iterator[dict[str, Served]]:
    yield paths[0]
    assert idle_metrics(paths[1]).num_blocks_in_use == 0


def send(served: dict[str, Served], method: str, path: str, **kwargs: Any) -> dict[str, Any]:
    """The same request on both paths; each answer as what must match, its own instance
    header checked against its server's instance."""
    answers = {}
    for name, each in served.items():
        response = each.client.request(method, path, **kwargs)
        assert response.headers[INSTANCE_HEADER] == each.state.instance_id, name
        answers[name] = {
            "status": response.status_code,
            "headers": {h: response.headers.get(h) for h in HEADERS},
            "body": comparable(response),
        }
    return answers


def comparable(response: httpx.Response) -> object:
    """The body less what differs by call (ids, timestamps, the engine's time); a stream
    event by event, less how its tokens were split among the chunks."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        return comparable_stream(
            [comparable_json(line[5:].strip()) for line in response.text.splitlines() if line]
        )
    return comparable_json(response.text)


_PIECES = ("content", "text", "token_ids")  # what a chunk's tokens bring
_CHOICE = {"index", "logprobs", "finish_reason", "delta"}


def comparable_stream(events: list[object]) -> dict[str, object]:
    """A stream's events with their token pieces taken out and joined per choice, and the
    chunks that carried nothing else dropped: how many tokens share a chunk is the
    engine's timing (a server sends what was produced by the time it writes), not the
    path's. Every other event and field must still match, in order."""
    events = copy.deepcopy(events)
    joined: dict[str, Any] = {}
    kept = []
    for event in events:
        choices = event.get("choices", []) if isinstance(event, dict) else []
        carried = False
        for choice in choices:
            fields = choice.get("delta") or choice
            for key in _PIECES:
                piece = fields.get(key)
                if isinstance(piece, str | list):
                    name = f"{choice.get('index')}.{key}"
                    joined[name] = joined.get(name, piece[:0]) + fields.pop(key)
                    carried = True
        bare = (
            isinstance(event, dict)
            and event.get("usage") is None
            and all(
                set(c) <= _CHOICE and all(c.get(k) in (None, {}) for k in _CHOICE - {"index"})
                for c in choices
            )
        )
        if not (carried and bare):
            kept.append(event)
    return {"events": kept, "tokens": joined}


def comparable_json(text: str) -> object:
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if isinstance(value, dict):
        value.pop("id", None)
        value.pop("created", None)
        if isinstance(value.get("usage"), dict):
            assert value["usage"].pop("kvgov_engine_ms") > 0
    return value


def events_since(state: ServerState, seq: int) -> list[tuple[object, ...]]:
    return [
        (e.kind, e.fields.get("status"), e.fields.get("code"), e.fields.get("finish_reason"))
        for e in state.events.since(seq)
    ]


def last_seqs(served: dict[str, Served]) -> dict[str, int]:
    return {
        name: (events[-1].seq if (events := each.state.events.since(0)) else 0)
        for name, each in served.items()
    }


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (CHAT, {"messages": HELLO, "max_tokens": 6, "temperature": 0}),
        (TEXT, {"prompt": "Once upon", "max_tokens": 5, "temperature": 0,
                "return_token_ids": True}),
        (CHAT, {"messages": HELLO, "max_tokens": 4, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}),
        (TEXT, {"prompt": [1, 2, 3], "max_tokens": 3, "temperature": 0, "stream": True,
                "return_token_ids": True}),
    ],
    ids=["chat", "text-ids", "chat-stream", "text-stream"],
)  # fmt: skip
def test_a_call_is_answered_alike(
    served: dict[str, Served], path: str, body: dict[str, Any]
) -> None:
    send(served, "POST", path, json=body)  # both warm: the same cached tokens after
    seen = last_seqs(served)
    num_routed = {name: len(each.routed) for name, each in served.items()}
    answers = send(served, "POST", path, json=body)
    routed = {name: each.routed[num_routed[name] :] for name, each in served.items()}
    assert routed == {"direct": [], "routed": [("POST", path)]}
    assert answers["direct"] == answers["routed"]
    assert answers["direct"]["status"] == 200
    kinds = {name: events_since(each.state, seen[name]) for name, each in served.items()}
    assert kinds["direct"] == kinds["routed"]
    assert [k for k, *_ in kinds["direct"]] == ["request.started", "request.finished"]


def test_streams_compare_whatever_chunks_their_tokens_came_in() -> None:
    def chunk(delta: dict[str, str], finish: str | None = None) -> dict[str, Any]:
        return {"object": "chat.completion.chunk", "usage": None,
                "choices": [{"index": 0, "logprobs": None, "finish_reason": finish,
                             "delta": delta}]}  # fmt: skip

    first = {"role": "assistant", "content": "ab"}
    together = [chunk(first), chunk({}, "length"), "[DONE]"]
    apart = [chunk({"role": "assistant", "content": "a"}), chunk({"content": "b"}),
             chunk({}, "length"), "[DONE]"]  # fmt: skip
    assert comparable_stream(together) == comparable_stream(apart)
    other = [chunk({"role": "assistant", "content": "a"}), chunk({"content": "c"}),
             chunk({}, "length"), "[DONE]"]  # fmt: skip
    assert comparable_stream(together) != comparable_stream(other)  # another text
    stopped = [chunk(first), chunk({}, "stop"), "[DONE]"]
    assert comparable_stream(together) != comparable_stream(stopped)  # another event
    assert together[0]["choices"][0]["delta"] == first  # the events are left as they were


JSON, PLAIN = {"content-type": "application/json"}, {"content-type": "text/plain"}
REFUSED: list[tuple[str, str, dict[str, Any]]] = [
    ("bad-json", CHAT, {"content": b'{"messages": [', "headers": JSON}),
    ("array", CHAT, {"json": [1, 2]}),
    ("text-plain", CHAT, {"content": json.dumps({"messages": HELLO}), "headers": PLAIN}),
    ("no-body", CHAT, {}),
    ("wrong-type", CHAT, {"json": {"messages": HELLO, "max_tokens": "5"}}),
    ("missing", TEXT, {"json": {"max_tokens": 2}}),
    ("unknown-field", CHAT, {"json": {"messages": HELLO, "max_token": 2}}),
    ("unsupported", CHAT, {"json": {"messages": HELLO, "n": 2}}),
    ("model", CHAT, {"json": {"messages": HELLO, "model": "nope"}}),
    ("budget", CHAT, {"json": {"messages": HELLO, "budget": "nobody", "max_tokens": 2}}),
    ("over-the-kv", TEXT, {"json": {"prompt": [7] * 5000, "max_tokens": 2}}),
    ("no-key", CHAT, {"json": {"messages": HELLO}, "headers": {"Authorization": ""}}),
    ("wrong-key", TEXT, {"json": {"prompt": "hi"}, "headers": {"Authorization": "Bearer sk-no"}}),
]  # fmt: skip


@pytest.mark.parametrize(("path", "kwargs"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_a_refusal_is_answered_alike(
    served: dict[str, Served], path: str, kwargs: dict[str, Any]
) -> None:
    seen = last_seqs(served)
    num_routed = {name: len(each.routed) for name, each in served.items()}
    answers = send(served, "POST", path, **kwargs)
    assert answers["direct"] == answers["routed"]
    assert 400 <= answers["direct"]["status"] < 500
    # the gateway refuses a key before any route; the rest reach the endpoint, by its path
    reached = [] if answers["direct"]["status"] == 401 else [("POST", path)]
    routed = {name: each.routed[num_routed[name] :] for name, each in served.items()}
    assert routed == {"direct": [], "routed": reached}
    assert set(answers["direct"]["body"]) == {"error"}
    events = {name: events_since(each.state, seen[name]) for name, each in served.items()}
    assert events["direct"] == events["routed"]


def test_other_methods_are_refused_alike(served: dict[str, Served]) -> None:
    for method in ("GET", "PUT", "DELETE"):
        answers = send(served, method, CHAT)
        assert answers["direct"] == answers["routed"]
        assert answers["direct"]["status"] == 405
        assert answers["direct"]["headers"]["allow"] == "POST"
        # only POST is served directly: the router answers the rest on both apps
        assert [each.routed[-1] for each in served.values()] == [(method, CHAT)] * 2


def test_bodies_over_the_limit_are_413_declared_or_chunked(served: dict[str, Served]) -> None:
    big = json.dumps({"messages": [{"role": "user", "content": "x" * MAX_BODY}]}).encode()
    headers = {"content-type": "application/json"}

    def chunks() -> Iterator[bytes]:  # no Content-Length: the bytes are counted
        for start in range(0, len(big), 1000):
            yield big[start : start + 1000]

    for path in (CHAT, TEXT):
        declared = send(served, "POST", path, content=big, headers=headers)
        chunked = {
            name: each.client.post(path, content=chunks(), headers=headers)
            for name, each in served.items()
        }
        for name, response in chunked.items():
            assert "content-length" not in response.request.headers
            assert response.headers[INSTANCE_HEADER] == served[name].state.instance_id
        assert declared["direct"] == declared["routed"]
        assert declared["direct"]["status"] == 413
        assert chunked["direct"].json() == chunked["routed"].json() == declared["direct"]["body"]
        assert {r.status_code for r in chunked.values()} == {413}


def test_every_answer_names_its_instance(served: dict[str, Served]) -> None:
    for name, each in served.items():
        for method, path, headers in [
            ("GET", "/health", {"Authorization": ""}),  # the open route, without a key
            ("GET", "/no-such-route", {}),
            ("POST", CHAT, {"Authorization": "Bearer sk-no"}),
        ]:
            response = each.client.request(method, path, headers=headers)
            assert response.headers[INSTANCE_HEADER] == each.state.instance_id, (name, path)


class _BrokenResult(LocalBackend):
    """A backend that breaks its contract: a finish reason that is not a string, which
    the routes trip on after the call (a bug, not an engine or governor error)."""

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        result = await super().agenerate(request)
        return GenerationResult(
            text=result.text,
            token_ids=result.token_ids,
            finish_reason=["length"],  # type: ignore[arg-type]
            prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens,
            cached_tokens=result.cached_tokens,
        )


def test_a_bug_is_a_logged_500_on_both_paths(caplog: pytest.LogCaptureFixture) -> None:
    # an engine of its own (another configuration): the module's backend drives the other
    backend = fresh_backend(max_num_seqs=8, kind=_BrokenResult)
    try:
        with both_paths(backend) as served, caplog.at_level(logging.ERROR, "kvgov.serve"):
            answers = send(served, "POST", CHAT, json={"messages": HELLO, "max_tokens": 2})
            assert answers["direct"] == answers["routed"]
            assert answers["direct"]["status"] == 500
            assert answers["direct"]["body"]["error"]["code"] == "internal_error"
        logged = [r for r in caplog.records if r.name == "kvgov.serve" and r.exc_info]
        assert len(logged) == 2  # one traceback per path
        assert idle_metrics(backend).num_blocks_in_use == 0
    finally:
        backend.close()
