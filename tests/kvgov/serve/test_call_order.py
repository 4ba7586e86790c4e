"""Which waiting call the engine runs next, as clients ask for it over HTTP: with one
running slot and two calls waiting, ``order_age_s`` puts the older first (issue 32, item
4); a key that is not an admin's cannot put its calls ahead of everyone's with a huge
``priority`` or ``order_age_s`` (item 13): they are lowered to the server's bounds.

The real engine (tiny-random, one running slot) behind a real uvicorn on loopback; the
order is read from the server's own ``request.finished`` events, which with one slot is
the order the calls ran in.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from backends.local.backend import LocalBackend
from kvgov.serve.background import serving
from tests.kvgov.serve.api_support import idle_metrics, served_app

KEY_A, KEY_B, ADMIN = "sk-order-a", "sk-order-b", "sk-order-admin"
A, B, ADMIN_H = ({"Authorization": f"Bearer {key}"} for key in (KEY_A, KEY_B, ADMIN))
CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hello"}]


def ran_first(
    first: tuple[dict[str, str], dict[str, Any]],
    second: tuple[dict[str, str], dict[str, Any]],
    **settings: Any,
) -> str:
    """Which of two calls ran first ("first" or "second"), queued in that order behind a
    long call of tenant A's that holds the one slot until both wait; each is
    ``(headers, extra body fields)``."""

    async def scenario(url: str, backend: LocalBackend, app: Any) -> list[str]:
        long = {"messages": HELLO, "max_tokens": 2000, "stream": True}
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            calls = []
            async with client.stream("POST", CHAT, json=long, headers=A) as running:
                assert running.status_code == 200
                for count, (headers, extra) in enumerate((first, second), start=1):
                    body = {"messages": HELLO, "max_tokens": 1, **extra}
                    call = client.post(CHAT, json=body, headers=headers)
                    calls.append(asyncio.create_task(call))
                    for _ in range(1_000):  # until the engine has it waiting
                        metrics = await asyncio.to_thread(backend.metrics)
                        if metrics.num_requests_waiting == count or calls[-1].done():
                            break
                        await asyncio.sleep(0.01)
                    assert not calls[-1].done(), calls[-1].result().text
            # the long call's client left: the slot is free, the engine picks the next
            answers = [await call for call in calls]
        assert [answer.status_code for answer in answers] == [200, 200]
        ids = {
            answer.json()["id"]: name
            for answer, name in zip(answers, ("first", "second"), strict=True)
        }
        events = app.state.kvgov.events.since(0)
        finished = [e.fields["id"] for e in events if e.kind == "request.finished"]
        return [ids[call_id] for call_id in finished if call_id in ids]

    with served_app(max_num_seqs=1, **settings) as (app, backend):
        with serving(app) as url:
            order = asyncio.run(scenario(url, backend, app))
        assert idle_metrics(backend).num_blocks_in_use == 0
    assert sorted(order) == ["first", "second"]
    return order[0]


def test_order_age_runs_the_older_call_first() -> None:
    """The second call says it is 100 s older (its program started then): it runs before
    the call that arrived before it. A server without keys: order_age_s as sent."""
    assert ran_first(({}, {}), ({}, {"order_age_s": 100.0})) == "second"


def test_an_admin_keys_order_age_is_not_bounded() -> None:
    keys = {"api_keys": (KEY_A, ADMIN), "admin_api_keys": (ADMIN,)}
    assert ran_first((A, {}), (ADMIN_H, {"order_age_s": 100.0}), **keys) == "second"


def test_a_keys_order_age_is_bounded() -> None:
    """order_age_s 1e308 put a caller first whatever else waited. Now a non-admin key's
    is lowered to tenant_max_order_age_s (60 s by default): an admin's call 120 s old,
    queued before it, still runs first."""
    keys = {"api_keys": (KEY_A, ADMIN), "admin_api_keys": (ADMIN,)}
    first = (ADMIN_H, {"order_age_s": 120.0})
    assert ran_first(first, (A, {"order_age_s": 1e308}), **keys) == "first"


def test_a_keys_priority_is_bounded() -> None:
    """priority 1e30 ran first and preempted everyone else. Now a non-admin key's is
    lowered to tenant_max_priority (0): first come, first served against B's call."""
    keys = {"api_keys": (KEY_A, KEY_B)}
    assert ran_first((B, {}), (A, {"priority": 10**30}), **keys) == "first"
    # a key may still lower its own calls' priority: B's call now waits for A's
    assert ran_first((B, {"priority": -1}), (A, {}), **keys) == "second"
