"""Decode runs on the open-loop panel: every policy's run, with the engine's decode-only
steps before each next event taken in one pass (``engine.decode_run``), is the run made
step by step, to the last bit: the same job times, prompts and engine counters. The
policies here are the ones with their own clocks on the engine (Continuum's TTLs,
InferCept's per-step decisions) and kvgov on its event loop; paged has neither."""

from __future__ import annotations

import dataclasses

import pytest

from engine.twin.event_loop import VirtualTimeLoop
from kvgov.benchmarks.openloop import workload as openloop
from kvgov.benchmarks.openloop.panel import _run
from kvgov.benchmarks.openloop.workload_setup import WorkloadSetup
from kvgov.benchmarks.swarm.twin import TwinDevice, _TwinClock, measure_twin_costs
from kvgov.simulate import stand_in_engine
from tests.kvgov.test_openloop_panel import small_card


# Loads under which a TTL runs out during decode-only steps (ttl-pin) and InferCept
# decides preserved contexts again under pressure: each run diverges with the policy's
# quiet_until broken to infinity (checked: on the CPU preset ttl-pin's did not, and
# InferCept's needs 40 s of arrivals).
@pytest.mark.parametrize(
    ("policy", "preset", "rate", "window_s"),
    [
        ("ttl-pin", openloop.TWIN, 12.0, 30.0),
        ("intercept", openloop.TWIN, 12.0, 40.0),
        ("kvgov", openloop.CPU, 12.0, 60.0),
    ],
)
def test_a_run_with_decode_runs_is_the_run_step_by_step(
    policy: str,
    preset: openloop.OpenLoopWorkload,
    rate: float,
    window_s: float,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scenario = small_card().scenario
    workload = dataclasses.replace(preset, rate_per_min=rate, duration_s=window_s, seed=1)
    setup = WorkloadSetup.of(workload, block_size=scenario.block_size)
    device = TwinDevice(scenario.profile, scenario.target.shape, forward=False)

    def run() -> tuple[object, ...]:
        engine = stand_in_engine(scenario)
        costs = measure_twin_costs(engine, device)
        fraction = engine.capacity().num_blocks / setup.peak_blocks
        result = _run(engine, device, policy, setup, costs, fraction=fraction)
        return result.jct_s, result.prompts, result.failed, result.counters

    together = run()
    monkeypatch.setattr(VirtualTimeLoop, "next_event_at", lambda self: None)
    monkeypatch.setattr(_TwinClock, "next_event", lambda self, at: None)
    assert run() == together
