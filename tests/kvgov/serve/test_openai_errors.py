"""Every refusal of the OpenAI routes: OpenAI's error body, the status the contract
gives it, the offending field as ``param``; and nothing held in the engine afterwards."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from backends.local.backend import LocalBackend
from backends.remote import wire
from kvgov.serve.background import serving
from tests.kvgov.serve.api_support import idle_metrics, served_app

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hello"}]
MAX_BODY = 200_000  # room for a prompt of the whole context as token ids


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[TestClient, LocalBackend]]:
    with served_app(max_body_bytes=MAX_BODY) as (app, backend), TestClient(app) as client:
        yield client, backend


@pytest.fixture
def client(served: tuple[TestClient, LocalBackend]) -> Iterator[TestClient]:
    client, backend = served
    yield client
    assert idle_metrics(backend).num_blocks_in_use == 0


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert {"message", "type", "param", "code"} <= set(error)
    assert isinstance(error["message"], str) and error["message"]
    wire.ErrorBody.model_validate(body)  # what RemoteBackend reads
    return error


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": HELLO, "max_tokens": "5"}, "max_tokens"),
        ({"messages": HELLO, "temperature": "hot"}, "temperature"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
        ({"messages": HELLO, "max_tokens": 0}, "max_tokens"),
        ({"messages": HELLO, "max_tokens": -3}, "max_tokens"),
        ({"messages": HELLO, "max_completion_tokens": 0}, "max_completion_tokens"),
        ({"messages": HELLO, "ceiling_tokens": 0}, "ceiling_tokens"),
        ({"messages": HELLO, "top_p": 0}, "top_p"),
        ({"messages": HELLO, "seed": -1}, "seed"),
        ({"messages": HELLO, "n": 2}, "n"),
        ({"messages": HELLO, "stop": ["ok", ""]}, "stop"),
        ({"messages": HELLO, "stream_options": {"include_usage": True}}, "stream_options"),
        ({"messages": HELLO, "retain": True}, "retain"),
        ({"messages": HELLO, "order_age_s": -1.0}, "order_age_s"),
        ({"messages": HELLO, "order_age_s": "soon"}, "order_age_s"),
        ({"messages": HELLO, "logprobs": True}, "logprobs"),
        ({"messages": HELLO, "tools": [{"type": "function"}]}, "tools"),
        ({"messages": []}, "messages"),
        ({}, "messages"),
    ],
)
def test_bad_values_are_400_naming_the_field(
    client: TestClient, body: dict[str, Any], param: str
) -> None:
    error = error_of(client.post(CHAT, json=body), 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param


def test_unknown_fields_are_refused_as_openai_refuses_them(client: TestClient) -> None:
    error = error_of(client.post(CHAT, json={"messages": HELLO, "max_token": 5}), 400)
    assert error["message"] == "Unrecognized request argument supplied: max_token"
    assert error["param"] == "max_token"
    # OpenAI's own fields that change nothing here are accepted
    ok = client.post(CHAT, json={"messages": HELLO, "max_tokens": 1, "user": "u", "store": False})
    assert ok.status_code == 200


def test_n_above_one_says_why(client: TestClient) -> None:
    error = error_of(client.post(CHAT, json={"messages": HELLO, "n": 3}), 400)
    assert "n=3" in error["message"] and "one choice" in error["message"]


def test_malformed_json_and_non_objects_are_400(client: TestClient) -> None:
    headers = {"content-type": "application/json"}
    error = error_of(client.post(CHAT, content=b'{"messages": [', headers=headers), 400)
    assert error["code"] == "invalid_json"
    error_of(client.post(CHAT, content=b"[1, 2]", headers=headers), 400)
    error_of(client.post(CHAT, content=b"hello", headers={"content-type": "text/plain"}), 400)


def test_prompt_over_the_context_is_context_length_exceeded(client: TestClient) -> None:
    limit = client.get("/v1/models").json()["data"][0]["max_model_len"]
    response = client.post("/v1/completions", json={"prompt": [11] * (limit + 5)})
    error = error_of(response, 400)
    assert error["code"] == "context_length_exceeded"
    assert response.headers["x-should-retry"] == "false"
    assert f"{limit} tokens" in error["message"] and f"{limit + 5} tokens" in error["message"]
    chat = client.post(CHAT, json={"messages": [{"role": "user", "content": "hi " * limit}]})
    assert error_of(chat, 400)["code"] == "context_length_exceeded"
    assert chat.headers["x-should-retry"] == "false"
    streamed = client.post("/v1/completions", json={"prompt": [11] * limit, "stream": True})
    assert error_of(streamed, 400)["code"] == "context_length_exceeded"


def test_unknown_model_is_404(client: TestClient) -> None:
    for path, body in [
        (CHAT, {"messages": HELLO, "model": "gpt-4o"}),
        ("/v1/completions", {"prompt": "hi", "model": "gpt-4o"}),
        ("/tokenize", {"prompt": "hi", "model": "gpt-4o"}),
    ]:
        error = error_of(client.post(path, json=body), 404)
        assert error["code"] == "model_not_found" and "gpt-4o" in error["message"]
    assert error_of(client.get("/v1/no-such-route"), 404)["code"] == "not_found"


def test_unknown_budget_is_404_with_the_engine_error(client: TestClient) -> None:
    error = error_of(client.post(CHAT, json={"messages": HELLO, "budget": "nobody"}), 404)
    assert error["kvgov"] == {
        "error_class": "UnknownBudgetError",
        "fields": {"name": "nobody"},
        "retriable": False,
    }


def test_bodies_over_the_limit_are_413_declared_or_chunked(client: TestClient) -> None:
    big = b'{"messages": [{"role": "user", "content": "' + b"x" * MAX_BODY + b'"}]}'
    headers = {"content-type": "application/json"}
    declared = client.post(CHAT, content=big, headers=headers)
    assert error_of(declared, 413)["code"] == "request_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: the bytes are counted
        for start in range(0, len(big), 1000):
            yield big[start : start + 1000]

    chunked = client.post(CHAT, content=chunks(), headers=headers)
    assert "content-length" not in chunked.request.headers
    assert error_of(chunked, 413)["code"] == "request_too_large"
    assert client.post(CHAT, json={"messages": HELLO, "max_tokens": 1}).status_code == 200


def test_refusals_are_recorded(client: TestClient) -> None:
    state = client.app.state.kvgov  # type: ignore[attr-defined]
    seen = state.events.since(0)[-1].seq if state.events.since(0) else 0
    client.post(CHAT, json={"messages": HELLO, "model": "nope"})
    client.post(CHAT, json={"messages": HELLO, "max_tokens": 0})
    client.post(CHAT, json={"messages": HELLO, "max_tokens": 2})
    events = [(e.kind, e.fields.get("status")) for e in state.events.since(seen)]
    assert events == [
        ("request.refused", 404),
        ("request.refused", 400),
        ("request.started", None),
        ("request.finished", None),
    ]
    finished = state.events.since(seen)[-1].fields
    assert finished["completion_tokens"] == 2 and finished["finish_reason"] == "length"
    assert finished["prompt_tokens"] == client.app.state.kvgov.backend.count_messages(HELLO)  # type: ignore[attr-defined]


def test_a_closed_engine_is_503() -> None:
    with served_app() as (app, backend), TestClient(app) as client:
        backend.close()
        response = client.post(CHAT, json={"messages": HELLO})
        error = error_of(response, 503)
        assert error["kvgov"]["retriable"] is True
        assert client.get("/health").status_code == 503


def test_a_full_waiting_queue_is_429_with_retry_after() -> None:
    """One request runs (max_num_seqs=1), one waits (max_waiting_requests=1): the next
    is refused until they are gone."""

    async def scenario(url: str, backend: LocalBackend) -> None:
        body = {"messages": HELLO, "max_tokens": 2000, "stream": True}
        async with (
            httpx.AsyncClient(base_url=url, timeout=60) as client,
            client.stream("POST", CHAT, json=body) as running,
        ):
            assert running.status_code == 200
            waiting = asyncio.create_task(client.post(CHAT, json=body))
            for _ in range(500):  # until the engine has it waiting
                metrics = await asyncio.to_thread(backend.metrics)
                if metrics.num_requests_waiting == 1:
                    break
                await asyncio.sleep(0.01)
            refused = await client.post(CHAT, json={"messages": HELLO, "max_tokens": 1})
            error = error_of(refused, 429)
            assert error["code"] == "queue_full"
            assert refused.headers["retry-after"] == "1"
            waiting.cancel()
        await asyncio.to_thread(idle_metrics, backend)
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            again = await client.post(CHAT, json={"messages": HELLO, "max_tokens": 1})
            assert again.status_code == 200

    with served_app(max_num_seqs=1, max_waiting_requests=1) as (app, backend):
        with serving(app) as url:
            asyncio.run(scenario(url, backend))
        assert idle_metrics(backend).num_blocks_in_use == 0
