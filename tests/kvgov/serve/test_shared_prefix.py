"""A prefix pinned as shared: the one exception to per-tenant cache salts.

Every tenant's call that starts with the shared prefix reuses its blocks; whatever follows
it stays salted per tenant, so tenant B never hits tenant A's blocks past the prefix. Only
an admin key may pin shared (kvgov.serve.control). Real engine (tiny-random), real keys.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from backends.local.backend import LocalBackend
from backends.remote import wire
from tests.kvgov.serve.api_support import idle_metrics, served_app

ADMIN, KEY_A, KEY_B, KEY_C = "sk-shared-admin", "sk-shared-a", "sk-shared-b", "sk-shared-c"
CHAT = "/v1/chat/completions"
SYSTEM = {"role": "system", "content": "You answer in one word and never explain. " * 8}
# several full blocks of a tenant's own after the shared prefix
QUESTION = "Which of these numbers is the largest? " + " ".join(str(n) for n in range(60))


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def ask(client: TestClient, key: str, question: str = QUESTION) -> dict[str, int]:
    body = {"messages": [SYSTEM, {"role": "user", "content": question}], "max_tokens": 1}
    response = client.post(CHAT, json=body, headers=_auth(key))
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    return {
        "prompt": usage["prompt_tokens"],
        "cached": usage["prompt_tokens_details"]["cached_tokens"],
    }


def pin_shared(client: TestClient, key: str, **extra: object) -> wire.Prefix:
    body = {"prefix": [SYSTEM], "shared": True, **extra}
    response = client.post("/kvgov/v1/prefixes", json=body, headers=_auth(key))
    assert response.status_code == 201, response.text
    return wire.Prefix(**response.json())


@pytest.fixture
def served() -> Iterator[tuple[TestClient, LocalBackend]]:
    keys = (ADMIN, KEY_A, KEY_B, KEY_C)
    with (
        served_app(api_keys=keys, admin_api_keys=(ADMIN,)) as (app, backend),
        TestClient(app) as client,
    ):
        yield client, backend


def test_every_tenant_hits_a_shared_prefix_and_nothing_of_another_past_it(
    served: tuple[TestClient, LocalBackend],
) -> None:
    client, backend = served
    prefix = pin_shared(client, ADMIN)
    assert prefix.shared and prefix.cache_salt is None
    pinned = prefix.num_pinned_tokens
    assert pinned == prefix.num_blocks * 16 >= 32
    first_a = ask(client, KEY_A)
    assert first_a["cached"] == pinned  # the shared blocks, nothing of A's yet
    b = ask(client, KEY_B)  # the very same prompt as A's, A's blocks are cached
    assert b["cached"] == pinned  # exactly the shared prefix: no hit on A's blocks after it
    full_blocks = (first_a["prompt"] - 1) // 16 * 16
    assert full_blocks >= pinned + 32  # A's own part is several blocks
    assert ask(client, KEY_A)["cached"] == full_blocks  # A still hits its own blocks
    assert ask(client, KEY_B)["cached"] == full_blocks  # and B its own
    events = [e for e in client.app.state.kvgov.events.since(0) if e.kind == "prefix.pinned"]  # type: ignore[attr-defined]
    assert [e.fields["shared"] for e in events] == [True]

    # only the admin key that pinned it unpins it; once unpinned, nobody shares it
    other = client.delete(f"/kvgov/v1/prefixes/{prefix.key}", headers=_auth(KEY_A))
    assert other.status_code == 404
    gone = client.delete(f"/kvgov/v1/prefixes/{prefix.key}", headers=_auth(ADMIN))
    assert gone.status_code == 204
    assert ask(client, KEY_C)["cached"] == 0
    assert idle_metrics(backend).num_blocks_in_use == 0


def test_without_a_shared_pin_tenants_share_nothing(
    served: tuple[TestClient, LocalBackend],
) -> None:
    client, _ = served
    assert ask(client, KEY_A)["cached"] == 0
    assert ask(client, KEY_B)["cached"] == 0
    # a tenant's own (salted) pin serves only that tenant
    own = client.post("/kvgov/v1/prefixes", json={"prefix": [SYSTEM]}, headers=_auth(KEY_C))
    assert own.status_code == 201 and own.json()["shared"] is False
    assert ask(client, KEY_C, "Another question?")["cached"] == own.json()["num_pinned_tokens"]
    assert ask(client, ADMIN, "Another question?")["cached"] == 0  # its first call


def test_only_an_admin_key_pins_shared(served: tuple[TestClient, LocalBackend]) -> None:
    client, backend = served
    before = backend.capacity().num_pinned_blocks
    body = {"prefix": [SYSTEM], "shared": True}
    refused = client.post("/kvgov/v1/prefixes", json=body, headers=_auth(KEY_A))
    assert refused.status_code == 403
    error = wire.ErrorBody(**refused.json()).error
    assert (error.code, error.param) == ("shared_pin_forbidden", "shared")
    assert "--admin-api-key" in error.message
    salted = client.post(
        "/kvgov/v1/prefixes", json={**body, "cache_salt": "x"}, headers=_auth(ADMIN)
    )
    assert salted.status_code == 400 and salted.json()["error"]["param"] == "cache_salt"
    assert backend.capacity().num_pinned_blocks == before
    assert ask(client, KEY_B)["cached"] == 0  # nothing was shared


def test_a_server_without_keys_lets_any_client_pin_shared() -> None:
    with served_app() as (app, _), TestClient(app) as client:
        prefix = pin_shared(client, "unused")
        body = {
            "messages": [SYSTEM, {"role": "user", "content": QUESTION}],
            "max_tokens": 1,
            "cache_salt": "a client's own salt",
        }
        usage = client.post(CHAT, json=body).json()["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] == prefix.num_pinned_tokens
        assert client.delete(f"/kvgov/v1/prefixes/{prefix.key}").status_code == 204


def test_admin_keys_must_be_api_keys() -> None:
    from kvgov.serve import ServeSettings

    with pytest.raises(ValueError, match="add it there too"):
        ServeSettings(api_keys=(KEY_A,), admin_api_keys=(ADMIN,))
