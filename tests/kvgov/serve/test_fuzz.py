"""Hypothesis over request bodies and headers: whatever arrives, the answer is never a
5xx other than 503, always OpenAI's error shape when it is an error, and the server
keeps serving with nothing held in the engine afterwards.

Bodies start from a valid call and are mutated: fields dropped, values swapped for any
JSON, unknown fields added; or they are arbitrary JSON, or arbitrary bytes. Token limits
stay tiny (a valid call here decodes at most 3 tokens), so the run is fast.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.local.backend import LocalBackend
from kvgov.serve.background import serving
from tests.kvgov.serve.api_support import idle_metrics, served_app

KEY = "sk-fuzz"
PATHS = ["/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize", "/v1/models"]
LIMIT_FIELDS = ("max_tokens", "max_completion_tokens")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
limits = st.integers(min_value=-3, max_value=3) | st.sampled_from([None, "2", 2.5, True, [], {}])
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "tool", "robot"])},
        optional={"content": st.text(max_size=40) | json_values, "name": json_values},
    ),
    max_size=3,
)
VALID = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    "/v1/completions": {"prompt": "hi", "max_tokens": 2},
    "/tokenize": {"prompt": "hi"},
    "/detokenize": {"tokens": [15339]},
    "/v1/models": {},
}
# plausible values per field, so that mutated calls often still run
GOOD: dict[str, st.SearchStrategy[Any]] = {
    "model": st.sampled_from(["tiny-random", "gpt-4o"]),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1),
    "seed": st.integers(0, 2**64),
    "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=3),
    "n": st.integers(0, 2),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "priority": st.integers(-(2**70), 2**70),
    "cache_salt": st.text(max_size=8),
    "budget": st.text(max_size=8),
    "ceiling_tokens": st.integers(-1, 40),
    "retain": st.booleans(),
    "return_token_ids": st.booleans(),
    "tokens": st.lists(st.integers(-5, 200_000), max_size=5),
    "prompt": st.text(max_size=20) | st.lists(st.integers(-1, 100_300), max_size=5),
    "user": st.text(max_size=5),
    "logprobs": st.booleans(),
    "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"}]),
    "unknown_field": json_values,
}


_GENERATION = sorted(set(GOOD) - {"tokens"})
FIELDS = {
    "/v1/chat/completions": [k for k in _GENERATION if k != "prompt"],
    "/v1/completions": _GENERATION,
    "/tokenize": ["model", "prompt", "unknown_field"],
    "/detokenize": ["model", "tokens", "unknown_field"],
    "/v1/models": ["unknown_field"],
}


@st.composite
def mutated(draw: st.DrawFn, path: str) -> dict[str, Any]:
    body = dict(VALID[path])
    for key in draw(st.lists(st.sampled_from(FIELDS[path]), max_size=3)):
        junk = draw(st.integers(0, 3)) == 0
        body[key] = draw(json_values) if junk else draw(GOOD[key])
    if path == "/v1/chat/completions" and draw(st.integers(0, 3)) == 0:
        body["messages"] = draw(messages)
    for key in draw(st.lists(st.sampled_from(LIMIT_FIELDS), max_size=2)):
        body[key] = draw(limits)
    if draw(st.integers(0, 4)) == 0 and body:
        body.pop(draw(st.sampled_from(sorted(body))))
    if path in ("/v1/chat/completions", "/v1/completions") and not any(
        isinstance(body.get(f), int) and not isinstance(body.get(f), bool) and body[f] <= 3
        for f in LIMIT_FIELDS
    ):
        body["max_tokens"] = draw(st.integers(1, 3))  # never a long decode
    return body


# Printable ASCII; no value that starts or ends in a space, which HTTP/1.1 does not allow
# and the client refuses to send (h11: "Illegal header value").
header_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=30).map(
    str.strip
)
requests = st.tuples(
    st.sampled_from(PATHS),
    st.sampled_from(["POST"] * 8 + ["GET", "DELETE"]),
    st.sampled_from(["mutated"] * 6 + ["json", "bytes", "none"]),
    st.dictionaries(
        st.sampled_from(["content-type", "authorization", "x-anything", "accept", "expect"]),
        header_text,
        max_size=2,
    )
    | st.just({}),
    st.integers(0, 5),  # 0: no valid key
)


def request_of(data: st.DataObject) -> tuple[str, str, bytes | None, dict[str, str]]:
    path, method, kind, headers, keyed = data.draw(requests)
    if path == "/v1/models" and method == "POST":
        method = "GET"
    raw: bytes | None = None
    if kind == "mutated" and path in VALID:
        raw = json.dumps(data.draw(mutated(path))).encode()
        headers = {"content-type": "application/json", **headers}
        if data.draw(st.integers(0, 3)):  # mostly a JSON content type
            headers["content-type"] = "application/json"
    elif kind == "json":
        raw = json.dumps(data.draw(json_values)).encode()
    elif kind == "bytes":
        raw = data.draw(st.binary(max_size=60))
    if keyed:
        headers = {**headers, "authorization": f"Bearer {KEY}"}
    return path, method, raw, headers


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[TestClient, LocalBackend]]:
    with served_app(api_keys=(KEY,)) as (app, backend), TestClient(app) as client:
        yield client, backend


def check(response: httpx.Response) -> None:
    status = response.status_code
    assert status < 500 or status == 503, response.text
    if status >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and "type" in error and "code" in error


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzzed_requests_never_break_the_server(
    served: tuple[TestClient, LocalBackend], data: st.DataObject
) -> None:
    client, _ = served
    path, method, raw, headers = request_of(data)
    check(client.request(method, path, content=raw, headers=headers))


def test_the_server_still_serves_after_the_fuzz(served: tuple[TestClient, LocalBackend]) -> None:
    client, backend = served
    reply = client.post(
        "/v1/chat/completions",
        json=VALID["/v1/chat/completions"],
        headers={"authorization": f"Bearer {KEY}"},
    )
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 2
    assert idle_metrics(backend).num_blocks_in_use == 0


def test_fuzzed_requests_on_a_live_server() -> None:
    with served_app(api_keys=(KEY,)) as (app, backend), serving(app) as url:
        with httpx.Client(base_url=url, timeout=30) as client:

            @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
            @given(data=st.data())
            def fuzz(data: st.DataObject) -> None:
                path, method, raw, headers = request_of(data)
                check(client.request(method, path, content=raw, headers=headers))

            fuzz()
            reply = client.get("/v1/models", headers={"authorization": f"Bearer {KEY}"})
            assert reply.status_code == 200
        assert idle_metrics(backend).num_blocks_in_use == 0
