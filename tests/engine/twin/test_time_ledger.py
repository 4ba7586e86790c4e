"""Where each request's time went on the twin (``engine.twin.time_ledger``): every second
from its arrival to its finish counted once, in the part a reader would name, on the real
tiny-random engine with the twin timing it (``forward=False``: the ledger reads the
engine's decisions and the twin's times, never a token's value)."""

from __future__ import annotations

import math

import pytest

from engine.config import EngineConfig
from engine.engine import Engine
from engine.sampling import SamplingParams
from engine.twin import Direction
from engine.twin.twin_engine import TwinEngine, attach_twin
from tests.engine.twin.test_twin_engine import (
    GREEDY,
    OVERLAPPED,
    PROMPT,
    SEQUENTIAL,
    TARGET,
    copy_s,
    flood,
    make_engine,
    park,
)


def _assert_every_second_counted_once(twin: TwinEngine) -> None:
    assert twin.ledger.splits
    for request_id, split in twin.ledger.splits.items():
        times = twin.times[request_id]
        assert times.finish_s is not None, request_id
        assert split.total_s == pytest.approx(times.finish_s - times.arrival_s, abs=1e-9)
        for part in ("queue_s", "prefill_s", "recompute_s", "swap_s", "decode_s"):
            assert getattr(split, part) >= 0.0


@pytest.mark.parametrize("profile", [SEQUENTIAL, OVERLAPPED], ids=["sequential", "overlapped"])
def test_every_second_of_a_request_is_counted_once(profile) -> None:
    engine, _ = make_engine()
    twin = attach_twin(engine, profile=profile, model_shape=TARGET, forward=False)
    engine.generate([PROMPT, PROMPT[:40], PROMPT[10:]], GREEDY)  # batched
    second, _ = park(engine)  # offloaded, flooded, restored
    engine.generate(second, GREEDY, budget="agent")
    # Four long sequences through 24 blocks: preempted, swapped out and back.
    engine.generate([PROMPT[i:] for i in range(4)], SamplingParams(max_tokens=60, ignore_eos=True))
    assert engine.metrics().num_preemptions > 0
    _assert_every_second_counted_once(twin)
    splits = twin.ledger.splits.values()
    assert sum(s.queue_s for s in splits) > 0  # the preempted ones waited
    assert sum(s.decode_s for s in splits) > 0 and sum(s.prefill_s for s in splits) > 0


def test_a_request_that_cannot_fit_yet_is_queued_until_its_first_step() -> None:
    engine = Engine(EngineConfig(model="tiny-random", device="cpu", num_blocks=8))
    twin = attach_twin(engine, profile=OVERLAPPED, model_shape=TARGET, forward=False)
    sampling = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    first = engine.add_request(PROMPT, sampling)  # 6 of the 8 blocks with its reply
    second = engine.add_request(PROMPT[5:], sampling)  # waits for the first to finish
    while engine.has_unfinished():
        engine.step()
    _assert_every_second_counted_once(twin)
    waited = twin.ledger.splits[second]
    assert twin.times[first].finish_s is not None
    assert waited.queue_s == pytest.approx(twin.times[first].finish_s, abs=1e-9)
    assert twin.ledger.splits[first].queue_s == 0.0


def test_an_evicted_context_computed_again_counts_as_recompute_and_a_copy_as_swap() -> None:
    engine, _ = make_engine()
    twin = attach_twin(engine, profile=SEQUENTIAL, model_shape=TARGET, forward=False)
    engine.open_budget("agent", 20)
    first = engine.generate(PROMPT, GREEDY, budget="agent")[0]
    flood(engine)  # its cached blocks evicted: the next call computes them again
    again = engine.add_request(
        [*first.prompt_token_ids, *first.token_ids, 7, 11], GREEDY, budget="agent"
    )
    before = twin.compute_s
    engine.step()
    compute = twin.compute_s - before
    split = twin.ledger.splits[again]
    known = len(first.prompt_token_ids) + len(first.token_ids) - 1  # the last was sampled
    prefilled = len(first.prompt_token_ids) + len(first.token_ids) + 2
    assert split.recompute_s == pytest.approx(compute * known / prefilled, rel=1e-9)
    assert split.prefill_s == pytest.approx(compute * (prefilled - known) / prefilled, rel=1e-9)
    assert split.swap_s == 0.0
    # A parked context's restore, still copying when its call's step starts: the step
    # waits for it (no overlap), and so does the request.
    engine, _ = make_engine()
    twin = attach_twin(engine, profile=SEQUENTIAL, model_shape=TARGET, forward=False)
    second, num_blocks = park(engine)
    request = engine.add_request(second, GREEDY, budget="agent")
    engine.step()
    assert twin.ledger.splits[request].swap_s == pytest.approx(copy_s(num_blocks), rel=1e-9)


def test_decode_steps_taken_together_count_as_the_same_steps_one_by_one() -> None:
    def run(fold: bool) -> dict[str, tuple[float, ...]]:
        engine = Engine(EngineConfig(model="tiny-random", device="cpu", num_blocks=24))
        twin = attach_twin(engine, profile=SEQUENTIAL, model_shape=TARGET, forward=False)
        sampling = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
        for i in range(3):  # 9 blocks each and growing: the third waits while two decode
            engine.add_request([*PROMPT, *PROMPT][i:], sampling)
        engine.step()
        # A copy on the link (an offload of 4 blocks) while the next steps run: without
        # overlap they wait for it.
        twin.link.charge(twin.block_bytes(4), at=twin.clock.now(), direction=Direction.OFFLOAD)
        while engine.has_unfinished():
            if fold:
                twin.fold_until = math.inf
            engine.step()
        return {
            r: (s.queue_s, s.prefill_s, s.recompute_s, s.swap_s, s.decode_s)
            for r, s in twin.ledger.splits.items()
        }

    one_by_one, folded = run(False), run(True)
    assert one_by_one.keys() == folded.keys()
    assert any(parts[0] > 0 for parts in one_by_one.values())  # one waited while two decoded
    assert any(parts[3] > 0 for parts in one_by_one.values())  # the steps waited on the copy
    for request_id, parts in one_by_one.items():
        assert folded[request_id] == pytest.approx(parts, rel=1e-9, abs=1e-12)
