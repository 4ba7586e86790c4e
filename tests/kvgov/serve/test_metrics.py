"""``GET /metrics``: Prometheus text that says what the engine says at that instant, under
vLLM's names and labels, with counters that only go up. Real engine (tiny model), real
FastAPI app over ASGI, parsed with prometheus_client's own text parser."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import prometheus_client
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from backends.local.backend import LocalBackend
from engine.outputs import Capacity, EngineMetrics, EngineSnapshot, KVSnapshot
from governor.backend import GenerationRequest
from kvgov.serve import ServeSettings, create_app
from kvgov.serve.metrics import families, samples

Scrape = dict[tuple[str, frozenset[tuple[str, str]]], float]
MODEL = "tiny-random"
VLLM = frozenset({("model_name", MODEL), ("engine", "0")})
KVGOV = frozenset({("model_name", MODEL)})


@pytest.fixture(scope="module")
def backend() -> Iterator[LocalBackend]:
    # 8 blocks of 16 tokens: three 80-token requests at once cannot all stay resident.
    made = LocalBackend(config={"num_blocks": 8})
    yield made
    made.close()


@pytest.fixture(scope="module")
def client(backend: LocalBackend) -> Iterator[TestClient]:
    with TestClient(create_app(backend)) as made:
        yield made


def scrape(client: TestClient) -> Scrape:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def test_figures_equal_the_engine_after_a_prefix_hit(
    client: TestClient, backend: LocalBackend
) -> None:
    prompt = "The planner reads the repository and lists the files to change. " * 3
    before = scrape(client)
    first = backend.generate(GenerationRequest(prompt=prompt, max_tokens=4))
    second = backend.generate(GenerationRequest(prompt=prompt, max_tokens=4))
    assert first.cached_tokens == 0 and second.cached_tokens >= 16  # setup: a real hit
    got, m, cap = scrape(client), backend.metrics(), backend.capacity()
    assert got[("vllm:prefix_cache_hits_total", VLLM)] == m.prefix_cache_hits
    assert got[("vllm:prefix_cache_queries_total", VLLM)] == m.prefix_cache_queries
    hits = got[("vllm:prefix_cache_hits_total", VLLM)]
    assert hits - before[("vllm:prefix_cache_hits_total", VLLM)] == second.cached_tokens
    assert got[("vllm:num_requests_running", VLLM)] == m.num_requests_running == 0
    assert got[("vllm:num_requests_waiting", VLLM)] == m.num_requests_waiting == 0
    assert got[("vllm:kv_cache_usage_perc", VLLM)] == m.num_blocks_in_use / cap.num_blocks
    assert got[("kvgov:kv_blocks_in_use", KVGOV)] == m.num_blocks_in_use
    assert got[("kvgov:kv_blocks_free", KVGOV)] == m.num_blocks_free
    assert got[("kvgov:kv_blocks_cached", KVGOV)] == m.num_blocks_cached
    assert got[("kvgov:kv_blocks_pinned", KVGOV)] == m.num_blocks_pinned
    assert got[("kvgov:blocks_offloaded", KVGOV)] == m.num_blocks_swapped
    assert got[("kvgov:holds_reclaimed_total", KVGOV)] == m.num_holds_reclaimed
    assert got[("kvgov:kv_tokens_in_use", KVGOV)] == m.num_tokens_in_use
    assert got[("kvgov:kv_blocks_capacity", KVGOV)] == cap.num_blocks
    assert got[("kvgov:weights_bytes", KVGOV)] == cap.weights_bytes
    info = frozenset(
        {
            ("block_size", str(cap.block_size)),
            ("num_gpu_blocks", str(cap.num_blocks)),
            ("num_cpu_blocks", str(backend.live_snapshot().capacity.num_host_blocks)),
            ("engine", "0"),
        }
    )
    assert got[("vllm:cache_config_info", info)] == 1.0  # vLLM's info gauge: no model_name


def test_preemptions_are_counted_and_counters_only_go_up(
    client: TestClient, backend: LocalBackend
) -> None:
    counters = [
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total",
    ]
    scrapes = [scrape(client)]
    before = backend.metrics().num_preemptions
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            backend.generate(GenerationRequest(prompt=f"worker {i} " * 8, max_tokens=60))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    while any(thread.is_alive() for thread in threads) and time.monotonic() < deadline:
        scrapes.append(scrape(client))  # during the run: each read waits for a step to end
        threads[0].join(timeout=0.05)
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    scrapes.append(scrape(client))
    m = backend.metrics()
    assert m.num_preemptions > before  # setup: 3 x 5 blocks in a pool of 8 preempts
    assert scrapes[-1][("vllm:num_preemptions_total", VLLM)] == m.num_preemptions
    assert scrapes[-1][("vllm:num_requests_waiting", VLLM)] == 0
    for name in counters:
        values = [s[(name, VLLM)] for s in scrapes]
        assert values == sorted(values), (name, values)
    for s in scrapes:  # every scrape is one instant: its figures add up
        in_use, free = s[("kvgov:kv_blocks_in_use", KVGOV)], s[("kvgov:kv_blocks_free", KVGOV)]
        assert in_use + free == s[("kvgov:kv_blocks_capacity", KVGOV)]
        assert s[("vllm:kv_cache_usage_perc", VLLM)] == in_use / (in_use + free)


def test_budget_figures_follow_a_hold_to_host_memory_and_back(
    client: TestClient, backend: LocalBackend
) -> None:
    backend.open_budget("agent-7", max_blocks=6)
    try:
        backend.generate(
            GenerationRequest(prompt="agent seven context " * 10, max_tokens=8, budget="agent-7")
        )
        held = backend.retain(budget="agent-7")
        assert held >= 16  # setup: at least one full block held

        def budget(got: Scrape, name: str, where: str | None = None) -> float:
            labels = {("model_name", MODEL), ("budget", "agent-7")}
            if where is not None:
                labels.add(("where", where))
            return got[(name, frozenset(labels))]

        got, kv = scrape(client), backend.kv_snapshot()
        assert got[("kvgov:budgets_open", KVGOV)] == len(kv.budgets)
        assert budget(got, "kvgov:budget_tokens", "device") == held
        assert budget(got, "kvgov:budget_blocks", "device") == held // 16
        assert budget(got, "kvgov:budget_tokens", "host") == 0
        assert budget(got, "kvgov:budget_max_blocks") == 6

        backend.offload(budget="agent-7")
        got, m = scrape(client), backend.metrics()
        assert budget(got, "kvgov:budget_tokens", "device") == 0
        assert budget(got, "kvgov:budget_tokens", "host") == held
        assert budget(got, "kvgov:budget_blocks", "host") == held // 16
        assert got[("kvgov:blocks_offloaded", KVGOV)] == m.num_blocks_swapped == held // 16

        backend.restore(budget="agent-7")
        got = scrape(client)
        assert budget(got, "kvgov:budget_tokens", "host") == 0
        assert got[("kvgov:blocks_offloaded", KVGOV)] == 0
    finally:
        backend.release_retained(budget="agent-7")
        backend.close_budget("agent-7")
    got = scrape(client)
    assert not any(name.startswith("kvgov:budget_") for name, _ in got)


def test_apps_in_one_process_keep_their_own_metrics(backend: LocalBackend) -> None:
    names = ("model-a", "model-b")
    apps = [create_app(backend, ServeSettings(served_model_name=name)) for name in names]
    for name, app in zip(names, apps, strict=True):
        with TestClient(app) as client:
            text = client.get("/metrics").text
        models = {
            s.labels["model_name"]
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if "model_name" in s.labels
        }
        assert models == {name}
    # Nothing went to the process-wide registry, which other code in the process owns.
    global_names = {
        s.name for family in prometheus_client.REGISTRY.collect() for s in family.samples
    }
    assert not any(n.startswith(("vllm:", "kvgov:")) for n in global_names)


def test_swapped_requests_count_as_waiting_as_vllm_counts_preempted_ones() -> None:
    # A hand-built snapshot: the instant a preempted request sits swapped out is a race in
    # a real run. vLLM puts a preempted request back in its waiting queue.
    metrics = EngineMetrics(
        num_blocks=8,
        num_blocks_in_use=6,
        num_blocks_free=2,
        num_blocks_cached=1,
        num_blocks_pinned=0,
        num_blocks_swapped=3,
        num_requests_running=1,
        num_requests_waiting=2,
        num_requests_swapped=3,
        num_preemptions=3,
        prefix_cache_queries=0,
        prefix_cache_hits=0,
        tokens_per_sequence={},
        num_holds_reclaimed=4,
    )
    capacity = Capacity(
        block_size=16,
        num_blocks=8,
        num_free_blocks=2,
        num_pinned_blocks=0,
        num_host_blocks=16,
        bytes_per_block=1024,
        max_model_len=512,
    )
    kv = KVSnapshot(
        budgets={},
        pinned_block_ids=frozenset(),
        num_blocks=8,
        num_blocks_in_use=6,
        num_tokens_in_use=90,
    )
    snapshot = EngineSnapshot(metrics, capacity, kv, requests=())
    got = {s.name: s.value for s in samples(families(snapshot, model_name="m", weights_bytes=0))}
    assert got["vllm:num_requests_waiting"] == 5
    assert got["kvgov:num_requests_swapped"] == 3
    assert got["kvgov:holds_reclaimed_total"] == 4  # a counter: the _total sample
    assert got["vllm:num_requests_running"] == 1
    assert got["vllm:kv_cache_usage_perc"] == 6 / 8
