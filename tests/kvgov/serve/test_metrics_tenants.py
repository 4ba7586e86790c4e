"""With API keys, ``/metrics`` and the live page's JSON show a key only its own tenant's
budgets (under its own names), requests and events; other tenants' blocks are one count;
pool-wide figures stay whole. Without keys everything shows, as before.

Real engine (tiny model), real app over ASGI, two real API keys. The budgets are opened and
filled through the control plane and the OpenAI route (``retain`` keeps a call's KV in its
budget), so each tenant's names are scoped by the server itself.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import asdict
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from backends.local.backend import LocalBackend
from governor.backend import GenerationRequest
from kvgov.serve import ServeSettings, create_app
from kvgov.serve.live import live_view
from kvgov.serve.security import tenant_id
from kvgov.serve.tenancy import cache_salt_for, scoped_budget

KEY_A, KEY_B = "tenant-key-a-9f2", "tenant-key-b-41c"
A, B = tenant_id(KEY_A), tenant_id(KEY_B)
BUDGET_SERIES = ("kvgov:budget_blocks", "kvgov:budget_tokens", "kvgov:budget_max_blocks")
POOL = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "kvgov:kv_blocks_in_use",
    "kvgov:kv_blocks_free",
    "kvgov:kv_blocks_cached",
    "kvgov:kv_blocks_pinned",
    "kvgov:blocks_offloaded",
    "kvgov:kv_tokens_in_use",
)
Scrape = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture(scope="module")
def backend() -> Iterator[LocalBackend]:
    made = LocalBackend(config={"num_blocks": 64})
    yield made
    made.close()


@pytest.fixture(scope="module")
def clients(backend: LocalBackend) -> Iterator[tuple[TestClient, TestClient]]:
    """A's and B's clients, after A filled "planner" and B filled "planner" and "worker"
    (B's "worker" then offloaded to host memory)."""
    app = create_app(backend, ServeSettings(api_keys=(KEY_A, KEY_B)))
    with (
        TestClient(app, headers={"Authorization": f"Bearer {KEY_A}"}) as a,
        TestClient(app, headers={"Authorization": f"Bearer {KEY_B}"}) as b,
    ):
        for client, name, max_blocks in ((a, "planner", 8), (b, "planner", 6), (b, "worker", 5)):
            opened = client.post("/kvgov/v1/budgets", json={"name": name, "max_blocks": max_blocks})
            assert opened.status_code == 201, opened.text
            body = {
                "prompt": f"{name} of {max_blocks} reads the repository and plans. " * 4,
                "max_tokens": 4,
                "budget": name,
                "retain": True,
            }
            assert client.post("/v1/completions", json=body).status_code == 200
        assert b.post("/kvgov/v1/budgets/worker/offload").status_code == 204
        yield a, b


def scrape(client: TestClient) -> tuple[str, Scrape]:
    response = client.get("/metrics")
    assert response.status_code == 200
    got = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }
    return response.text, got


def budget_series(got: Scrape) -> dict[tuple[str, str, str | None], float]:
    out = {}
    for (name, labels), value in got.items():
        if name in BUDGET_SERIES:
            label = dict(labels)
            out[(name, label["budget"], label.get("where"))] = value
    return out


def expected_series(backend: LocalBackend, tenant: str, names: list[str]) -> dict[Any, float]:
    kv = backend.kv_snapshot()
    want: dict[Any, float] = {}
    for name in names:
        held = kv.budgets[scoped_budget(tenant, name)]
        want[("kvgov:budget_blocks", name, "device")] = len(held.device_block_ids)
        want[("kvgov:budget_blocks", name, "host")] = held.num_host_blocks
        want[("kvgov:budget_tokens", name, "device")] = held.num_device_tokens
        want[("kvgov:budget_tokens", name, "host")] = held.num_host_tokens
        want[("kvgov:budget_max_blocks", name, None)] = held.max_blocks
    return want


def test_each_key_scrapes_its_own_budgets_by_its_own_names(
    clients: tuple[TestClient, TestClient], backend: LocalBackend
) -> None:
    a, b = clients
    text_a, got_a = scrape(a)
    text_b, got_b = scrape(b)
    assert budget_series(got_a) == expected_series(backend, A, ["planner"])
    assert budget_series(got_b) == expected_series(backend, B, ["planner", "worker"])
    assert expected_series(backend, B, ["worker"])[("kvgov:budget_blocks", "worker", "host")] > 0
    # Nothing of the other tenant anywhere in the text: not its id, not its agents' names.
    assert B not in text_a and "worker" not in text_a and A not in text_a
    assert A not in text_b and B not in text_b
    budgets_open = ("kvgov:budgets_open", frozenset({("model_name", backend.model)}))
    assert (got_a[budgets_open], got_b[budgets_open]) == (1, 2)
    # The pool's figures are the engine's whoever asks (idle: both scrapes read one state).
    m = backend.metrics()
    engine = {
        "vllm:num_requests_running": m.num_requests_running,
        "vllm:num_requests_waiting": m.num_requests_waiting,
        "vllm:kv_cache_usage_perc": m.num_blocks_in_use / backend.capacity().num_blocks,
        "kvgov:kv_blocks_in_use": m.num_blocks_in_use,
        "kvgov:kv_blocks_free": m.num_blocks_free,
        "kvgov:kv_blocks_cached": m.num_blocks_cached,
        "kvgov:kv_blocks_pinned": m.num_blocks_pinned,
        "kvgov:blocks_offloaded": m.num_blocks_swapped,
        "kvgov:kv_tokens_in_use": m.num_tokens_in_use,
    }
    for got in (got_a, got_b):
        assert {name: v for (name, _), v in got.items() if name in POOL} == engine


def test_without_keys_every_budget_shows_as_the_engine_names_it(
    clients: tuple[TestClient, TestClient], backend: LocalBackend
) -> None:
    with TestClient(create_app(backend)) as open_client:
        _, got = scrape(open_client)
        view = open_client.get("/kvgov/v1/live").json()
    names = [scoped_budget(A, "planner"), scoped_budget(B, "planner"), scoped_budget(B, "worker")]
    assert {budget for _, budget, _ in budget_series(got)} == set(names)
    assert [b["name"] for b in view["memory"]["budgets"]] == sorted(names)
    assert "tenants" not in {s["kind"] for s in view["memory"]["device"] + view["memory"]["host"]}
    assert view["num_requests_not_listed"] == 0


def test_a_keys_live_view_lists_its_budgets_and_events_and_counts_the_others_blocks(
    clients: tuple[TestClient, TestClient], backend: LocalBackend
) -> None:
    a, b = clients
    a.app.state.kvgov.events.record("server.note", detail="no tenant")  # type: ignore[attr-defined]
    view_a, view_b = a.get("/kvgov/v1/live").json(), b.get("/kvgov/v1/live").json()
    kv = backend.kv_snapshot()
    pinned = kv.pinned_block_ids

    def device_blocks(tenant: str, names: list[str]) -> set[int]:
        blocks: set[int] = set()
        for name in names:
            blocks |= kv.budgets[scoped_budget(tenant, name)].device_block_ids - pinned
        return blocks

    memory = view_a["memory"]
    assert [x["name"] for x in memory["budgets"]] == ["planner"]
    assert [s["label"] for s in memory["device"] if s["kind"] == "budget"] == ["planner"]
    segments = {s["kind"]: s["blocks"] for s in memory["device"]}
    assert segments["tenants"] == len(device_blocks(B, ["planner", "worker"]))
    assert segments["budget"] == len(device_blocks(A, ["planner"]))
    assert sum(s["blocks"] for s in memory["device"]) == memory["num_blocks"]
    host = {s["kind"]: s["blocks"] for s in memory["host"]}
    worker_host = kv.budgets[scoped_budget(B, "worker")].num_host_blocks
    assert host == {"tenants": worker_host, "other": 0}  # B's offloaded worker, as a count
    b_segments = {s["kind"]: s["blocks"] for s in view_b["memory"]["device"]}
    assert b_segments["tenants"] == len(device_blocks(A, ["planner"]))

    # Events: A's own and the server's; none of B's (whose budgets share A's names).
    tenants = {e.get("tenant", "") for e in view_a["events"]}
    assert tenants == {A, ""}
    kinds = [(e["kind"], e.get("budget")) for e in view_a["events"] if e.get("tenant") == A]
    assert kinds.count(("budget.opened", "planner")) == 1
    assert ("request.finished", "planner") in kinds
    assert "server.note" in {e["kind"] for e in view_a["events"]}
    assert ("budget.opened", "worker") in [(e["kind"], e.get("budget")) for e in view_b["events"]]
    # Another tenant's id or agent names appear nowhere; a key's own id only as its tenant.
    assert B not in str(view_a) and "worker" not in str(view_a)
    assert A not in str(view_a).replace(f"'tenant': '{A}'", "")
    assert A not in str(view_b) and B not in str(view_b).replace(f"'tenant': '{B}'", "")

    # The page's samples are what /metrics shows the same key.
    _, got_a = scrape(a)
    samples = {(s["name"], frozenset(s["labels"].items())): s["value"] for s in view_a["metrics"]}
    assert samples == got_a


class Running:
    """A real request left running until ``stop``: cancelling ``agenerate`` aborts it."""

    def __init__(self, backend: LocalBackend, requests: list[GenerationRequest]) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

        async def start() -> list[asyncio.Task[Any]]:
            return [asyncio.ensure_future(backend.agenerate(r)) for r in requests]

        self._tasks = asyncio.run_coroutine_threadsafe(start(), self._loop).result(timeout=10)

    def stop(self) -> None:
        async def cancel() -> None:
            for task in self._tasks:
                task.cancel()
                with suppress(asyncio.CancelledError):
                    await task

        try:
            asyncio.run_coroutine_threadsafe(cancel(), self._loop).result(timeout=30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
            self._loop.close()


def test_a_key_sees_its_own_requests_budgeted_or_not_and_a_count_of_the_rest(
    clients: tuple[TestClient, TestClient], backend: LocalBackend
) -> None:
    # The requests the OpenAI route builds for each tenant (scoped budget, tenant's salt),
    # started on the backend directly so that they stay unfinished until stopped; plus one
    # in-process request, which no key owns.
    def request(tenant: str | None, budget: str | None) -> GenerationRequest:
        return GenerationRequest(
            prompt=f"{tenant} {budget} " * 6,
            max_tokens=2000,
            budget=None if tenant is None or budget is None else scoped_budget(tenant, budget),
            cache_salt=None if tenant is None else cache_salt_for(tenant, None),
        )

    a = clients[0]
    for client in clients:  # room to run: "planner"'s cap would end a long call early
        assert client.post("/kvgov/v1/budgets", json={"name": "run", "max_blocks": 64}).is_success
    running = Running(backend, [request(A, "run"), request(B, "run"), request(B, None)])
    running_free = Running(backend, [request(None, None)])
    try:
        deadline = time.monotonic() + 20
        snapshot = backend.live_snapshot()
        while len(snapshot.requests) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
            snapshot = backend.live_snapshot()
        assert len(snapshot.requests) == 4  # setup: all four unfinished at one instant
    finally:
        running.stop()
        running_free.stop()
        for client in clients:
            assert client.delete("/kvgov/v1/budgets/run").status_code == 204
    common: dict[str, Any] = {
        "model_name": "m",
        "weights_bytes": 0,
        "events": a.app.state.kvgov.events,  # type: ignore[attr-defined]
        "instance_id": "i",
    }
    views = {t: live_view(snapshot, tenant=t, **common) for t in (A, B, "")}
    by_salt = {r.cache_salt: [] for r in snapshot.requests}  # type: ignore[var-annotated]
    for r in snapshot.requests:
        row = asdict(r)
        del row["cache_salt"]
        by_salt[r.cache_salt].append(row)

    def unscoped(rows: list[dict[str, Any]], tenant: str) -> list[dict[str, Any]]:
        return [
            {**row, "budget": None if row["budget"] is None else row["budget"][len(tenant) + 1 :]}
            for row in rows
        ]

    assert views[A]["requests"] == unscoped(by_salt[A], A)
    assert [r["budget"] for r in views[A]["requests"]] == ["run"]
    assert sorted(views[B]["requests"], key=str) == sorted(unscoped(by_salt[B], B), key=str)
    assert (views[A]["num_requests_not_listed"], views[B]["num_requests_not_listed"]) == (3, 2)
    # Without keys, every request, with the engine's names, as before.
    assert len(views[""]["requests"]) == 4 and views[""]["num_requests_not_listed"] == 0
    assert {r["budget"] for r in views[""]["requests"]} == {
        scoped_budget(A, "run"),
        scoped_budget(B, "run"),
        None,
    }
