"""One tenant against another on a real ``kvgov serve`` (the app around the real engine,
tiny-random; over real sockets where calls must wait at once): a key's pins stay within
its share of the pool, a key's flood of calls never fills another key's share of the
queue, and a key's flood of events never empties another's live page (issue 32, item 13).
Admin keys and a server without keys keep their full power.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

from backends.local.backend import LocalBackend
from kvgov.serve.background import serving
from tests.kvgov.serve.api_support import idle_metrics, served_app

KEY_A, KEY_B, ADMIN = "sk-hostile-a", "sk-tenant-b", "sk-admin"
A, B, ADMIN_H = ({"Authorization": f"Bearer {key}"} for key in (KEY_A, KEY_B, ADMIN))
NUM_BLOCKS = 64  # 16 tokens each: two non-admin keys' share is 64 x 0.5 / 2 = 16 blocks
SHARE = 16


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[TestClient, LocalBackend]]:
    settings = {"api_keys": (KEY_A, KEY_B, ADMIN), "admin_api_keys": (ADMIN,)}
    with served_app(num_blocks=NUM_BLOCKS, **settings) as (app, backend), TestClient(app) as client:
        yield client, backend


def _pin(client: TestClient, headers: dict[str, str], tokens: int, salt: str) -> httpx.Response:
    prefix = list(range(1_000, 1_000 + tokens))
    return client.post(
        "/kvgov/v1/prefixes", json={"prefix": prefix, "cache_salt": salt}, headers=headers
    )


def test_a_keys_pins_stay_within_its_share(served: tuple[TestClient, LocalBackend]) -> None:
    """The attack, scaled to a 64-block pool: tenant A pins the same long prefix under
    new salts until the pool is nearly all pinned (4 x 32k tokens left 2 blocks free);
    then tenant B's prompt is refused, never to fit. Now A's third pin is refused (403,
    saying what to do), and B's prompt of more than half the pool runs."""
    client, backend = served
    pins = []
    for salt in ("s1", "s2"):
        pinned = _pin(client, A, 8 * 16, salt)  # 8 blocks each
        assert pinned.status_code == 201, pinned.text
        pins.append(pinned.json()["key"])
    for salt in ("s3", "s4"):
        refused = _pin(client, A, 8 * 16, salt)
        assert refused.status_code == 403, refused.text
        error = refused.json()["error"]
        assert error["code"] == "pin_share_exceeded" and error["type"] == "permission_error"
        assert f"share of {SHARE} blocks" in error["message"] and "unpin" in error["message"]
        assert error["kvgov"] == {  # what RemoteBackend raises: the class, its counts
            "error_class": "PinShareExceededError",
            "fields": {"num_held": SHARE, "num_asked": 8, "cap": SHARE},
            "retriable": False,
        }
        assert refused.headers["x-should-retry"] == "false"
    assert backend.capacity().num_pinned_blocks == SHARE  # nothing pinned by the refusals
    prompt = list(range(100, 100 + 36 * 16))  # 36 blocks: more than the pool less A's share
    answered = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1}, headers=B)
    assert answered.status_code == 200, answered.text
    # B's own share is whole whatever A pinned; A gets its share back by unpinning
    b_pin = _pin(client, B, SHARE * 16, "b")
    assert b_pin.status_code == 201, b_pin.text
    assert client.delete(f"/kvgov/v1/prefixes/{pins.pop()}", headers=A).status_code == 204
    again = _pin(client, A, 8 * 16, "s3")
    assert again.status_code == 201, again.text
    pins.append(again.json()["key"])
    for key in pins:
        assert client.delete(f"/kvgov/v1/prefixes/{key}", headers=A).status_code == 204
    assert client.delete(f"/kvgov/v1/prefixes/{b_pin.json()['key']}", headers=B).status_code == 204
    assert idle_metrics(backend).num_blocks_in_use == 0


def test_an_admin_key_pins_past_the_share(served: tuple[TestClient, LocalBackend]) -> None:
    client, backend = served
    big = _pin(client, ADMIN_H, 3 * SHARE * 16, "admin")
    assert big.status_code == 201, big.text
    assert backend.capacity().num_pinned_blocks == 3 * SHARE
    assert client.delete(f"/kvgov/v1/prefixes/{big.json()['key']}", headers=ADMIN_H).status_code
    assert idle_metrics(backend).num_blocks_in_use == 0


def test_a_server_without_keys_pins_as_before() -> None:
    with served_app(num_blocks=NUM_BLOCKS) as (app, backend), TestClient(app) as client:
        keys = []
        for salt in ("s1", "s2", "s3", "s4"):  # 48 blocks: no share without tenants
            pinned = client.post(
                "/kvgov/v1/prefixes", json={"prefix": list(range(12 * 16)), "cache_salt": salt}
            )
            assert pinned.status_code == 201, pinned.text
            keys.append(pinned.json()["key"])
        assert backend.capacity().num_pinned_blocks == 48
        for key in keys:
            assert client.delete(f"/kvgov/v1/prefixes/{key}").status_code == 204


def test_a_keys_flood_of_events_never_empties_anothers_live_page(
    served: tuple[TestClient, LocalBackend],
) -> None:
    """1,500 budgets opened by one tenant emptied another's live-page events (the log
    kept 200 for everyone); scaled: 220 events of A's after B's one."""
    client, _ = served
    assert client.post("/kvgov/v1/budgets", json={"name": "b-own", "max_blocks": 2}, headers=B)
    try:
        for i in range(110):
            name = f"flood-{i}"
            body = {"name": name, "max_blocks": 1}
            opened = client.post("/kvgov/v1/budgets", json=body, headers=A)
            assert opened.status_code == 201
            assert client.delete(f"/kvgov/v1/budgets/{name}", headers=A).status_code == 204
        events = client.get("/kvgov/v1/live", headers=B).json()["events"]
        assert ("budget.opened", "b-own") in [(e["kind"], e.get("budget")) for e in events]
        assert not any(str(e.get("budget")).startswith("flood-") for e in events)
    finally:
        client.delete("/kvgov/v1/budgets/b-own", headers=B)


CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hello"}]


async def _until_waiting(backend: LocalBackend, count: int, *watch: asyncio.Task[object]) -> None:
    """Until the engine has ``count`` requests waiting, or a watched call ended (then the
    caller's asserts say what it got)."""
    for _ in range(1_000):
        metrics = await asyncio.to_thread(backend.metrics)
        if metrics.num_requests_waiting >= count or any(task.done() for task in watch):
            return
        await asyncio.sleep(0.01)


def test_a_keys_flood_never_fills_anothers_share_of_the_queue() -> None:
    """One slot runs, the queue holds 2: tenant A's running call and two waiting fill it,
    and A's next is refused (429). B, with no call in flight, still gets its share (1 of
    2 while two keys call) and goes ahead; its second is then over its share (429)."""

    async def scenario(url: str, backend: LocalBackend) -> None:
        long = {"messages": HELLO, "max_tokens": 2000, "stream": True}
        short = {"messages": HELLO, "max_tokens": 1}
        async with (
            httpx.AsyncClient(base_url=url, timeout=60) as client,
            client.stream("POST", CHAT, json=long, headers=A) as running,
        ):
            assert running.status_code == 200
            waiting = [asyncio.create_task(client.post(CHAT, json=short, headers=A)) for _ in "ab"]
            await _until_waiting(backend, 2, *waiting)
            flood = await client.post(CHAT, json=short, headers=A)
            assert flood.status_code == 429, flood.text
            assert flood.headers["retry-after"] == "1"
            assert "its share of the queue" in flood.json()["error"]["message"]
            b_call = asyncio.create_task(client.post(CHAT, json=short, headers=B))
            await _until_waiting(backend, 3, b_call)
            assert not b_call.done(), b_call.result().text  # admitted: waiting its turn
            b_again = await client.post(CHAT, json=short, headers=B)
            assert b_again.status_code == 429, b_again.text
            for task in [*waiting, b_call]:
                task.cancel()
        await asyncio.to_thread(idle_metrics, backend)

    settings = {"api_keys": (KEY_A, KEY_B), "max_waiting_requests": 2}
    with served_app(max_num_seqs=1, **settings) as (app, backend):
        with serving(app) as url:
            asyncio.run(scenario(url, backend))
        assert idle_metrics(backend).num_blocks_in_use == 0
