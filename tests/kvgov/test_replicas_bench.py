"""``kvgov bench replicas``'s invariants, on a small workload with the engine in process
(three ``LocalBackend`` replicas; the benchmark itself runs three ``kvgov serve``
processes, whose counters are the same engine's): both runs send the same calls with the
same prompts, each starts cold, the hit rates are the engines' own counters and agree
with what the calls reported, and nothing is left over after either run."""

from __future__ import annotations

import importlib

from backends.local.backend import LocalBackend
from kvgov.benchmarks.replicas import Workload, compare, measurements
from kvgov.cli import BENCHMARKS

_SMALL = Workload(
    num_teams=2, agents_per_team=2, turns=2, system_tokens=300, num_blocks=64, arrival_s=0.05
)


def test_both_runs_send_the_same_calls_and_the_figures_are_the_servers_counters() -> None:
    engines = [LocalBackend(config={"num_blocks": _SMALL.num_blocks}) for _ in range(3)]
    try:  # both runs on the same engines, as the benchmark's on the same servers
        results = compare(lambda: engines, _SMALL)
    finally:
        for engine in engines:
            engine.close()
    rr, routed = results["round_robin"], results["cache_aware"]
    calls = _SMALL.num_agents * _SMALL.turns
    assert len(rr.prompts) == len(routed.prompts) == calls
    assert rr.prompts == routed.prompts  # the same calls, token for token
    for result in (rr, routed):
        assert result.cached[0] == 0  # cold: the first call found nothing cached (its salt)
        assert (result.queries, result.hits) == (result.prompt_tokens, result.cached_tokens)
        assert result.ledger == (0, 0, 0, 0)
        assert result.budgets_left == 0
    figures = {m.metric: m for m in measurements(results, _SMALL)}
    assert figures["prefix_hit_rate_routed"].value == routed.hits / routed.queries
    assert figures["prefix_hit_rate_round_robin"].value == rr.hits / rr.queries
    assert figures["ttft_p50_round_robin_over_routed"].value == rr.ttft_p50_s / routed.ttft_p50_s
    assert figures["makespan_round_robin_over_routed"].value == rr.makespan_s / routed.makespan_s


def test_kvgov_bench_knows_replicas() -> None:
    assert callable(importlib.import_module(BENCHMARKS["replicas"]).run)
