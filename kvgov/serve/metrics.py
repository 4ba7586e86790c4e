"""``GET /metrics``: the engine's figures as Prometheus text, read at scrape time.

vLLM's names where vLLM has the figure, with vLLM's labels and meaning, so dashboards and
routers built for vLLM read kvgov unchanged:

- ``vllm:num_requests_running``, ``vllm:num_requests_waiting`` (gauges, labels
  ``model_name`` and ``engine``). vLLM puts a preempted request back in its waiting queue,
  so kvgov's swapped requests count as waiting here (``kvgov:num_requests_swapped`` says
  how many of them are).
- ``vllm:kv_cache_usage_perc``: the fraction (0 to 1) of KV blocks in use; free cached
  blocks are evictable and count as free, as in vLLM.
- ``vllm:prefix_cache_queries_total``, ``vllm:prefix_cache_hits_total``: counters, in
  tokens; ``vllm:num_preemptions_total``: a counter of requests preempted.
- ``vllm:cache_config_info``: a gauge set to 1 whose labels carry the cache's shape
  (``block_size``, ``num_gpu_blocks``, ``num_cpu_blocks``; ``engine``, no model name), as
  vLLM emits it.

Then kvgov's own (label ``model_name``): the pool's blocks by condition, the budgets open,
each budget's blocks and tokens on the device and offloaded to host memory
(``kvgov:budget_tokens{budget=...,where="device"|"host"}``), the weights.

With API keys, a scrape shows the caller's tenant only where a figure is a tenant's: the
per-budget series list its own budgets, under its own names (``planner``, never another
tenant's id or agent names), and ``kvgov:budgets_open`` counts them. Everything else is the
pool's, as vLLM's figures are, so a router reads the same load whoever asks.

Nothing is kept between scrapes: each builds a registry of its own around one collector,
which reads the engine's snapshot (one instant between two steps), so the figures of a
scrape agree with each other, and several apps in one process never share a metric. The
counters are the engine's own, monotonic for the engine's lifetime. The live page shows
``samples`` of the same families, so it shows what ``/metrics`` shows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvgov.serve.tenancy import own_budgets

if TYPE_CHECKING:
    from engine.outputs import EngineSnapshot

__all__ = ["EngineCollector", "Sample", "exposition", "families", "samples"]

ENGINE_INDEX = "0"  # vLLM labels each engine core; kvgov serve runs one


@dataclass(frozen=True, slots=True)
class Sample:
    name: str  # as exposed: counters end in _total
    labels: dict[str, str]
    value: float


def families(
    snapshot: EngineSnapshot, *, model_name: str, weights_bytes: int, tenant: str = ""
) -> list[Metric]:
    """The scrape's families; ``tenant`` (the caller's, "" without API keys) picks the
    budgets shown."""
    m, cap, kv = snapshot.metrics, snapshot.capacity, snapshot.kv
    budgets = own_budgets(tenant, kv.budgets)
    vllm_labels = ["model_name", "engine"]
    vllm_values = [model_name, ENGINE_INDEX]

    def vllm_gauge(name: str, doc: str, value: float) -> Metric:
        family = GaugeMetricFamily(name, doc, labels=vllm_labels)
        family.add_metric(vllm_values, value)
        return family

    def vllm_counter(name: str, doc: str, value: float) -> Metric:
        family = CounterMetricFamily(name, doc, labels=vllm_labels)
        family.add_metric(vllm_values, value)
        return family

    def gauge(name: str, doc: str, value: float) -> Metric:
        family = GaugeMetricFamily(name, doc, labels=["model_name"])
        family.add_metric([model_name], value)
        return family

    def counter(name: str, doc: str, value: float) -> Metric:
        family = CounterMetricFamily(name, doc, labels=["model_name"])
        family.add_metric([model_name], value)
        return family

    cache_info = GaugeMetricFamily(
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        labels=["block_size", "engine", "num_cpu_blocks", "num_gpu_blocks"],
    )
    cache_info.add_metric(
        [str(cap.block_size), ENGINE_INDEX, str(cap.num_host_blocks), str(cap.num_blocks)], 1
    )
    per_budget = {
        "kvgov:budget_blocks": GaugeMetricFamily(
            "kvgov:budget_blocks",
            "KV blocks a budget holds, on the device and offloaded to host memory.",
            labels=["model_name", "budget", "where"],
        ),
        "kvgov:budget_tokens": GaugeMetricFamily(
            "kvgov:budget_tokens",
            "Tokens whose KV a budget holds, on the device and offloaded to host memory.",
            labels=["model_name", "budget", "where"],
        ),
        "kvgov:budget_max_blocks": GaugeMetricFamily(
            "kvgov:budget_max_blocks",
            "A budget's cap in KV blocks.",
            labels=["model_name", "budget"],
        ),
    }
    for name, held in sorted(budgets.items()):
        blocks, tokens = per_budget["kvgov:budget_blocks"], per_budget["kvgov:budget_tokens"]
        blocks.add_metric([model_name, name, "device"], len(held.device_block_ids))
        blocks.add_metric([model_name, name, "host"], held.num_host_blocks)
        tokens.add_metric([model_name, name, "device"], held.num_device_tokens)
        tokens.add_metric([model_name, name, "host"], held.num_host_tokens)
        per_budget["kvgov:budget_max_blocks"].add_metric([model_name, name], held.max_blocks)
    return [
        vllm_gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            m.num_requests_running,
        ),
        vllm_gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed (preempted ones included).",
            m.num_requests_waiting + m.num_requests_swapped,
        ),
        vllm_gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            m.kv_cache_usage,
        ),
        vllm_counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            m.prefix_cache_queries,
        ),
        vllm_counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            m.prefix_cache_hits,
        ),
        vllm_counter(
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            m.num_preemptions,
        ),
        cache_info,
        gauge(
            "kvgov:num_requests_swapped",
            "Preempted requests whose KV is in host memory.",
            m.num_requests_swapped,
        ),
        gauge("kvgov:kv_blocks_capacity", "KV blocks in the device pool.", m.num_blocks),
        gauge(
            "kvgov:kv_blocks_in_use",
            "KV blocks held by requests, holds or pins.",
            m.num_blocks_in_use,
        ),
        gauge(
            "kvgov:kv_blocks_free",
            "KV blocks free: empty or cached (evictable).",
            m.num_blocks_free,
        ),
        gauge(
            "kvgov:kv_blocks_cached",
            "Free KV blocks that still serve prefix-cache hits.",
            m.num_blocks_cached,
        ),
        gauge(
            "kvgov:kv_blocks_pinned", "KV blocks pinned for shared prefixes.", m.num_blocks_pinned
        ),
        gauge(
            "kvgov:kv_tokens_in_use", "Tokens whose KV the blocks in use hold.", m.num_tokens_in_use
        ),
        gauge(
            "kvgov:blocks_offloaded", "KV blocks offloaded to host memory.", m.num_blocks_swapped
        ),
        counter(
            "kvgov:holds_reclaimed",
            "Held contexts the engine moved to host memory or ended for a running request.",
            m.num_holds_reclaimed,
        ),
        gauge("kvgov:host_blocks_capacity", "KV blocks host memory can take.", cap.num_host_blocks),
        gauge("kvgov:kv_bytes_per_block", "Bytes of one KV block.", cap.bytes_per_block),
        gauge("kvgov:weights_bytes", "Device memory the model's weights take.", weights_bytes),
        gauge("kvgov:budgets_open", "Block budgets open (the caller's own).", len(budgets)),
        *per_budget.values(),
    ]


def samples(metric_families: list[Metric]) -> list[Sample]:
    return [
        Sample(s.name, dict(s.labels), s.value)
        for family in metric_families
        for s in family.samples
    ]


class EngineCollector(Collector):
    """Reads the engine when scraped, never before: registering it reads nothing."""

    def __init__(self, read: Callable[[], list[Metric]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        yield from self._read()

    def describe(self) -> list[Metric]:
        return []  # unknown until read; the registry then skips its duplicate-name check


def exposition(read: Callable[[], list[Metric]]) -> bytes:
    """Prometheus text of what ``read`` returns, from a registry of this scrape's own."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(read))
    return generate_latest(registry)
