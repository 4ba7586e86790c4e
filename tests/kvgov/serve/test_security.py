"""API keys and tenants: every route but /health needs a key, compared against all
keys; each key is a tenant with its own cache salt, so one tenant's requests never hit
another's prefix blocks (measured with the real engine's cached tokens)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from backends.local.backend import LocalBackend
from kvgov.serve.security import load_api_keys, tenant_id
from tests.kvgov.serve.api_support import idle_metrics, served_app

KEY_A, KEY_B = "sk-tenant-a", "sk-tenant-b"
CHAT = "/v1/chat/completions"
# a long shared system prompt: several full blocks that a cache hit would reuse
SYSTEM = {"role": "system", "content": "You are a careful planner. " * 20}


def ask(client: TestClient, key: str, question: str, **extra: object) -> dict[str, int]:
    body = {"messages": [SYSTEM, {"role": "user", "content": question}], "max_tokens": 1}
    response = client.post(CHAT, json={**body, **extra}, headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    return {
        "prompt": usage["prompt_tokens"],
        "cached": usage["prompt_tokens_details"]["cached_tokens"],
    }


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[TestClient, LocalBackend]]:
    with served_app(api_keys=(KEY_A, KEY_B)) as (app, backend), TestClient(app) as client:
        yield client, backend


def test_every_route_but_health_needs_a_valid_key(served: tuple[TestClient, LocalBackend]) -> None:
    client, _ = served
    assert client.get("/health").status_code == 200
    for headers in (
        {},
        {"Authorization": "Bearer sk-wrong"},
        {"Authorization": KEY_A},
        {"Authorization": "Basic c2stdGVuYW50LWE="},
        {"Authorization": "Bearer "},
    ):
        for method, path in [
            ("GET", "/v1/models"),
            ("POST", CHAT),
            ("GET", "/version"),
            ("GET", "/no-such-route"),
            ("POST", "/kvgov/v1/budgets"),
        ]:
            response = client.request(method, path, headers=headers, json={})
            assert response.status_code == 401, (headers, path)
            error = response.json()["error"]
            assert error["code"] == "invalid_api_key"
            assert KEY_A not in response.text and "sk-wrong" not in response.text
            assert response.headers["www-authenticate"] == "Bearer"
    for key in (KEY_A, KEY_B):
        ok = client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
        assert ok.status_code == 200


def test_tenants_never_share_prefix_blocks(served: tuple[TestClient, LocalBackend]) -> None:
    client, backend = served
    first = ask(client, KEY_A, "What is first?")
    assert first["cached"] == 0  # a cold cache
    full_blocks = (first["prompt"] // 16) * 16
    same_tenant = ask(client, KEY_A, "What is second?")
    other_tenant = ask(client, KEY_B, "What is first?")  # the very same prompt as A's first
    assert other_tenant["cached"] == 0
    # A's second prompt shares the system prompt's full blocks with A's first
    assert 0 < same_tenant["cached"] <= full_blocks
    assert ask(client, KEY_B, "What is first?")["cached"] == full_blocks  # B's own, now
    # a client's salt splits a tenant's cache further; it never joins another tenant's
    assert ask(client, KEY_B, "What is first?", cache_salt=tenant_id(KEY_A))["cached"] == 0
    assert idle_metrics(backend).num_blocks_in_use == 0


def test_events_name_the_tenant_never_the_key(served: tuple[TestClient, LocalBackend]) -> None:
    client, _ = served
    ask(client, KEY_B, "hello")
    events = client.app.state.kvgov.events.since(0)  # type: ignore[attr-defined]
    tenants = {e.fields["tenant"] for e in events if e.kind.startswith("request.")}
    assert tenant_id(KEY_B) in tenants
    assert not any(KEY_A in str(e.as_dict()) or KEY_B in str(e.as_dict()) for e in events)


def test_keys_come_from_options_file_and_environment(tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text("# team keys\nsk-file-1\n\n  sk-file-2  \nsk-cli\n")
    environ = {"KVGOV_API_KEY": "sk-env", "KVGOV_API_KEYS": "sk-env-1, sk-env-2,"}
    keys = load_api_keys(["sk-cli"], key_file=key_file, environ=environ)
    assert keys == ("sk-cli", "sk-file-1", "sk-file-2", "sk-env", "sk-env-1", "sk-env-2")
    assert load_api_keys([], environ={}) == ()
    with pytest.raises(ValueError, match="cannot read the API key file"):
        load_api_keys([], key_file=tmp_path / "missing", environ={})
    with pytest.raises(ValueError, match="whitespace"):
        load_api_keys(["sk one"], environ={})


def test_settings_never_show_the_keys() -> None:
    from kvgov.serve import ServeSettings

    assert KEY_A not in repr(ServeSettings(api_keys=(KEY_A,)))


def test_tenant_ids_are_stable_short_and_distinct() -> None:
    assert tenant_id(KEY_A) == tenant_id(KEY_A) != tenant_id(KEY_B)
    assert KEY_A not in tenant_id(KEY_A) and len(tenant_id(KEY_A)) == 16
