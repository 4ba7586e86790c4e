"""Decode runs (``engine.decode_run``): the decode-only steps ahead taken in one pass
leave the engine exactly as the same steps taken one by one.

Two identical tiny-random engines on the twin without a forward pass (each step samples
one fixed token, so the tokens are known ahead) run the same requests, arriving at the
same virtual times, through a pool small enough to preempt. One steps one step a call;
the other is told the next arrival's time before each step, so the twin takes the
decode-only steps before it in one call. After every call of the second, its whole
state (tokens, text, block tables by block id, the free list in order, the prefix
cache, the prefill counters, the virtual clock) equals the first's after as many steps.
"""

from __future__ import annotations

import math

import pytest

from engine.config import EngineConfig
from engine.engine import Engine
from engine.presets import get_preset
from engine.request import Request
from engine.sampling import SamplingParams
from engine.twin import get_profile
from engine.twin.shapes import ModelShape
from engine.twin.twin_engine import TwinEngine, attach_twin

TARGET = ModelShape.from_config(
    get_preset("llama-8b-random").config,
    name="llama-8b-random",
    activation_bits=16,
    weight_bits=4,
)
# (arrival in virtual seconds, prompt length, max_tokens)
ARRIVALS = [(0.0, 21, 40), (0.0, 9, 70), (0.05, 30, 33), (0.3, 14, 90), (0.31, 50, 25)]


def make_twin(num_blocks: int) -> TwinEngine:
    engine = Engine(
        EngineConfig(model="tiny-random", device="cpu", num_blocks=num_blocks, block_size=4)
    )
    return attach_twin(engine, profile=get_profile("rx9070xt"), model_shape=TARGET, forward=False)


def state(twin: TwinEngine) -> tuple[object, ...]:
    engine = twin.engine
    scheduler, manager = engine.scheduler, engine.block_manager
    requests = sorted(
        [*scheduler.running, *scheduler.waiting, *scheduler.swapped], key=Request.sort_key
    )
    return (
        [
            (
                r.request_id,
                r.status,
                list(r.token_ids),
                r.num_computed_tokens,
                r.output_text,
                manager.block_ids(r.request_id) if r.request_id in manager else None,
            )
            for r in requests
        ],
        [block.block_id for block in manager.pool._free_queue],
        sorted((h, b.block_id) for h, b in manager.pool.cached.items()),
        (engine.prefill.num_prefill_tokens, engine.prefill.num_recomputed_tokens),
        twin.clock.now(),
        twin.compute_s,
    )


def drive(twin: TwinEngine, *, fold: bool, on_step: object = None) -> dict[str, str]:
    """Run ``ARRIVALS`` to the end; each request's text. ``on_step(twin)`` after each call."""
    sampling = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for *_, n in ARRIVALS]
    pending = list(enumerate(ARRIVALS))
    ids: dict[str, int] = {}
    texts: dict[str, str] = {}
    while pending or twin.engine.has_unfinished():
        while pending and pending[0][1][0] <= twin.clock.now():
            i, (_, length, _) = pending.pop(0)
            prompt = [(t * 13 + i) % 400 + 1 for t in range(length)]
            ids[twin.engine.add_request(prompt, sampling[i])] = i
        if not twin.engine.has_unfinished():
            twin.clock.advance_to(pending[0][1][0])
            continue
        if fold:
            twin.fold_until = pending[0][1][0] if pending else math.inf
        for output in twin.engine.step():
            texts[output.request_id] = texts.get(output.request_id, "") + output.new_text
        if on_step is not None:
            on_step(twin)  # type: ignore[operator]
    return texts


@pytest.mark.parametrize("num_blocks", [40, 64])  # 40: requests are preempted
def test_steps_taken_together_leave_the_engine_as_steps_taken_one_by_one(
    num_blocks: int,
) -> None:
    one_by_one = make_twin(num_blocks)
    seen: dict[int, tuple[object, ...]] = {}
    texts = drive(one_by_one, fold=False, on_step=lambda t: seen.update({t.num_steps: state(t)}))
    together = make_twin(num_blocks)
    calls = []

    def check(twin: TwinEngine) -> None:
        calls.append(twin.num_steps)
        assert state(twin) == seen[twin.num_steps], f"after step {twin.num_steps}"

    assert drive(together, fold=True, on_step=check) == texts
    assert together.num_steps == one_by_one.num_steps
    assert len(calls) < together.num_steps / 3  # most steps were taken together
    assert together.steps_ended[-1] == together.busy_until


def test_a_run_stops_before_the_step_an_event_falls_in() -> None:
    twin = make_twin(64)
    sampling = SamplingParams(max_tokens=50, temperature=0, ignore_eos=True)
    twin.engine.add_request(list(range(1, 20)), sampling)
    twin.engine.step()  # the prefill: no run
    start = twin.clock.now()
    twin.fold_until = start + 0.1
    twin.engine.step()
    assert len(twin.steps_ended) > 1 and twin.steps_ended[-1] < start + 0.1
    next_end = twin.busy_until + twin.last_step_s  # decode steps of one request: alike
    assert next_end >= start + 0.1 or len(twin.steps_ended) == 48
    # An event due before the first step would end: one step, taken as usual.
    twin.fold_until = twin.clock.now()
    twin.engine.step()
    assert len(twin.steps_ended) == 1


def test_no_run_where_a_step_could_do_anything_else() -> None:
    twin = make_twin(64)
    engine = twin.engine
    token = twin.fixed_token
    sampling = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    engine.add_request(list(range(1, 30)), sampling)
    assert engine.plan_decode_run(token) is None  # a prefill first
    engine.step()
    run = engine.plan_decode_run(token)
    assert run is not None and run.num_steps == 18  # the 20th token ends it: not planned
    engine.add_request(list(range(5, 9)), sampling)
    assert engine.plan_decode_run(token) is None  # the newcomer would be admitted
    engine.step()
    stopping = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, stop=["zz"])
    engine.add_request(list(range(3, 7)), stopping)
    engine.step()
    assert engine.plan_decode_run(token) is None  # stop strings: text decides the end
