"""The twin on the real engine: tiny-random computes every token on this CPU, while the
clock is charged the step times and KV copies of Llama 3 8B (int4 weights) on an RX 9070 XT.

Times are virtual, so every assertion on them is exact: each expected time is recomputed
from the batches a spy on the model runner saw and from the profile's link figures.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.errors import InvalidRequestError
from engine.kv_cache import KVCache
from engine.presets import get_preset
from engine.sampling import SamplingParams
from engine.scheduler import ScheduledChunk
from engine.twin import (
    Direction,
    HostLink,
    ModelShape,
    SequenceWork,
    StepBatch,
    StepTimeModel,
    get_profile,
)
from engine.twin.twin_engine import TwinEngine, TwinError, attach_twin

TARGET = ModelShape.from_config(
    get_preset("llama-8b-random").config,
    name="llama-8b-random",
    activation_bits=16,
    weight_bits=4,
)
OVERLAPPED = get_profile("rx9070xt")
SEQUENTIAL = dataclasses.replace(OVERLAPPED, copies_overlap_compute=False)
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
PROMPT = [(t * 5 + 3) % 500 for t in range(70)]
TOOL_RESULT = [7, 11, 13, 17, 19, 23, 29, 31]


def make_engine() -> tuple[Engine, list[StepBatch]]:
    """A tiny-random engine of 24 blocks, and a spy on its runner: each batch computed."""
    engine = Engine(EngineConfig(model="tiny-random", device="cpu", num_blocks=24))
    computed: list[StepBatch] = []
    execute = engine.runner.execute

    def spy(chunks: Sequence[ScheduledChunk]) -> list[int | None]:
        computed.append(
            StepBatch(
                tuple(SequenceWork(c.num_tokens, c.request.num_computed_tokens) for c in chunks)
            )
        )
        return execute(chunks)

    engine.runner.execute = spy  # type: ignore[method-assign]
    return engine, computed


def flood(engine: Engine) -> None:
    """Other agents' calls, one after another: 32 blocks through a pool of 24, which evicts
    every cached block nobody holds (an offloaded context's device copies included)."""
    sampling = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    for i in range(4):
        engine.generate([(t * 7 + i) % 512 for t in range(120)], sampling)


def park(engine: Engine) -> tuple[list[int], int]:
    """An agent's first turn, its context retained and offloaded while others run, then
    restored. Returns the second turn's prompt and the held blocks."""
    engine.open_budget("agent", 20)
    first = engine.generate(PROMPT, GREEDY, budget="agent")[0]
    num_blocks = engine.retain("agent") // engine.config.block_size
    engine.offload(budget="agent")
    flood(engine)
    engine.restore(budget="agent")
    return [*first.prompt_token_ids, *first.token_ids, *TOOL_RESULT], num_blocks


def scenario(engine: Engine) -> list[tuple[int, ...]]:
    """Three agents' prompts batched, then a parked agent's second turn: every token."""
    batch = engine.generate([PROMPT, PROMPT[:40], PROMPT[10:]], GREEDY)
    second, _ = park(engine)
    return [
        *(c.token_ids for c in batch),
        engine.generate(second, GREEDY, budget="agent")[0].token_ids,
    ]


def copy_s(num_blocks: int) -> float:
    num_bytes = num_blocks * 16 * TARGET.kv_bytes_per_token
    return OVERLAPPED.host_link_latency_s + num_bytes / OVERLAPPED.host_link_bandwidth_bytes_s


def test_the_clock_advances_by_the_modelled_time_of_each_batch_that_ran() -> None:
    engine, computed = make_engine()
    twin = attach_twin(engine, profile=OVERLAPPED, model_shape=TARGET)
    engine.generate([PROMPT, PROMPT[:40], PROMPT[10:]], GREEDY)
    model = StepTimeModel(OVERLAPPED)
    expected = 0.0
    for batch in computed:
        if batch.sequences:
            expected += model.seconds(TARGET, batch)
    assert len(computed) == twin.num_steps == GREEDY.max_tokens  # the prefill samples one
    assert twin.clock.now() == expected == twin.compute_s
    # The target's time, not tiny-random's: an 8B step is milliseconds on this card.
    assert expected > twin.num_steps * 1e-3


def test_the_twin_changes_no_token_and_records_each_requests_times() -> None:
    plain, _ = make_engine()
    expected = scenario(plain)
    engine, _ = make_engine()
    twin = attach_twin(engine, profile=OVERLAPPED, model_shape=TARGET)
    assert scenario(engine) == expected
    assert len(twin.times) == 3 + 1 + 4 + 1
    for times in twin.times.values():
        assert times.first_token_s is not None and times.finish_s is not None
        assert times.arrival_s < times.first_token_s <= times.finish_s <= twin.clock.now()
    ids = list(twin.times)  # in arrival order: the batch of three, then one at a time
    assert [twin.times[rid].arrival_s for rid in ids[:3]] == [0.0] * 3
    assert [twin.times[rid].arrival_s for rid in ids] == sorted(
        twin.times[rid].arrival_s for rid in ids
    )
    assert twin.times[ids[-1]].finish_s == twin.clock.now()


def test_an_offload_and_restore_charge_the_contexts_target_bytes_each_way() -> None:
    engine, _ = make_engine()
    twin = attach_twin(engine, profile=OVERLAPPED, model_shape=TARGET)
    engine.open_budget("agent", 20)
    engine.generate(PROMPT, GREEDY, budget="agent")
    num_blocks = engine.retain("agent") // 16
    assert num_blocks == 5
    offloaded_at = twin.clock.now()
    engine.offload(budget="agent")
    assert twin.clock.now() == offloaded_at  # a copy between steps moves no clock
    assert twin.link.free_at == offloaded_at + copy_s(num_blocks)
    flood(engine)
    engine.restore(budget="agent")
    num_bytes = num_blocks * 16 * TARGET.kv_bytes_per_token
    for direction in Direction:
        totals = twin.link.totals(direction)
        assert (totals.num_copies, totals.num_bytes) == (1, num_bytes)
        assert totals.busy_s == copy_s(num_blocks)
    assert num_bytes == 5 * 16 * 131072  # 32 layers x 8 KV heads x 128 x 2 bytes, K and V


@pytest.mark.parametrize("forward", [True, False], ids=["forward", "no-forward"])
def test_copies_are_charged_either_way_and_made_only_with_the_forward_pass(forward: bool) -> None:
    """Without a forward pass no model reads K/V, so an offload and a restore are checked
    and charged to the link but move no K/V; with it they move it. Pairs the cache
    refuses are refused either way. Broken (copies made without the forward pass), the
    host blocks change."""
    engine, _ = make_engine()
    engine.kv_cache.kv.normal_()  # device K/V that a copy would show on the host
    twin = attach_twin(engine, profile=OVERLAPPED, model_shape=TARGET, forward=forward)
    host_before = engine.kv_cache.host_blocks.clone()
    engine.open_budget("agent", 20)
    engine.generate(PROMPT, GREEDY, budget="agent")
    num_blocks = engine.retain("agent") // 16
    engine.offload(budget="agent")
    offloaded = twin.link.totals(Direction.OFFLOAD).num_bytes
    assert offloaded == num_blocks * 16 * TARGET.kv_bytes_per_token
    moved = not torch.equal(engine.kv_cache.host_blocks, host_before)
    assert moved is forward
    with pytest.raises(InvalidRequestError, match="swap_in"):
        engine.kv_cache.swap_in([(engine.kv_cache.num_host_blocks, 0)])


@pytest.mark.parametrize("profile", [SEQUENTIAL, OVERLAPPED], ids=["sequential", "overlapped"])
def test_a_step_waits_for_copies_unless_they_overlap_its_compute(profile) -> None:
    engine, computed = make_engine()
    twin = attach_twin(engine, profile=profile, model_shape=TARGET)
    second, num_blocks = park(engine)
    restored_at = twin.clock.now()
    assert twin.link.free_at == restored_at + copy_s(num_blocks)  # the restore, still copying
    engine.add_request(second, GREEDY, budget="agent")
    engine.step()
    compute = StepTimeModel(profile).seconds(TARGET, computed[-1])
    assert copy_s(num_blocks) < compute  # the copy is shorter than the step
    if profile.copies_overlap_compute:
        assert twin.clock.now() == restored_at + compute
    else:
        assert twin.clock.now() == restored_at + copy_s(num_blocks) + compute


def test_the_same_run_twice_gives_the_same_virtual_times_bit_for_bit() -> None:
    def run() -> tuple[object, ...]:
        engine, _ = make_engine()
        twin = attach_twin(engine, profile=SEQUENTIAL, model_shape=TARGET)
        scenario(engine)
        return (
            twin.clock.now().hex(),
            twin.stall_s.hex(),
            {rid: dataclasses.astuple(t) for rid, t in twin.times.items()},
            [twin.link.totals(d) for d in Direction],
        )

    first = run()
    assert first[1] != (0.0).hex()  # the run waited on copies: they are in its times
    assert run() == first


@pytest.mark.parametrize("forward", [True, False])
def test_a_pinned_prefix_is_charged_its_prefill_and_computed_only_with_the_forward_pass(
    forward: bool,
) -> None:
    """``pin_prefix`` prefills outside a step (``runner.forward``): the device spends that
    time too, after the step in progress, and without the forward pass nothing runs."""
    engine, _ = make_engine()
    ran: list[int] = []
    real_forward = engine.runner.forward

    def counted(items):  # type: ignore[no-untyped-def]
        ran.append(len(items))
        return real_forward(items)

    engine.runner.forward = counted  # type: ignore[method-assign]
    twin = attach_twin(engine, profile=OVERLAPPED, model_shape=TARGET, forward=forward)
    prefix = PROMPT[:48]
    engine.pin_prefix(prefix)
    expected = StepTimeModel(OVERLAPPED).seconds(TARGET, StepBatch((SequenceWork(48, 0),)))
    assert twin.clock.now() == twin.busy_until == pytest.approx(expected)
    assert twin.compute_s == pytest.approx(expected)
    assert ran == ([1] if forward else [])
    # The pin's blocks serve a request as computed ones either way.
    [done] = engine.generate([*prefix, 9, 9], GREEDY)
    assert done.num_cached_tokens == 48
    twin.detach()
    assert engine.runner.forward is counted


def test_detach_gives_the_engine_back_as_it_was() -> None:
    engine, _ = make_engine()
    spy = engine.runner.execute
    twin: TwinEngine = attach_twin(engine, profile=OVERLAPPED, model_shape=TARGET)
    with pytest.raises(TwinError, match="already has a twin attached; detach that one first"):
        attach_twin(engine, profile=OVERLAPPED, model_shape=TARGET)
    park(engine)
    twin.detach()
    assert {"step", "add_request", "abort"}.isdisjoint(vars(engine))
    assert engine.runner.execute is spy
    assert type(engine.kv_cache) is KVCache
    assert engine.kv_cache.swap_out.__func__ is KVCache.swap_out  # type: ignore[attr-defined]
    now, free_at, num_steps = twin.clock.now(), twin.link.free_at, twin.num_steps
    engine.offload(budget="agent")
    engine.generate(PROMPT, GREEDY)
    assert (twin.clock.now(), twin.link.free_at, twin.num_steps) == (now, free_at, num_steps)
    assert len(twin.times) == 1 + 4
    with pytest.raises(TwinError, match="already detached"):
        twin.detach()
    attach_twin(engine, profile=OVERLAPPED, model_shape=TARGET).detach()  # and again


def test_preemption_swaps_are_charged_and_waited_for_inside_the_step() -> None:
    engine, _ = make_engine()
    twin = attach_twin(engine, profile=SEQUENTIAL, model_shape=TARGET)
    moved = {Direction.OFFLOAD: 0, Direction.RESTORE: 0}  # blocks, as the engine moved them
    manager = engine.block_manager

    def counting(real, direction):
        def spy(seq_id):
            pairs = real(seq_id)
            moved[direction] += len(pairs)
            return pairs

        return spy

    manager.swap_out = counting(manager.swap_out, Direction.OFFLOAD)
    manager.swap_in = counting(manager.swap_in, Direction.RESTORE)
    # Four sequences of up to 9 blocks each in a pool of 24: the scheduler preempts by
    # swapping a running sequence out to host memory, and swaps it back in later.
    sampling = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
    engine.generate([PROMPT[i:] for i in range(4)], sampling)
    assert engine.metrics().num_preemptions > 0
    for direction, num_blocks in moved.items():
        assert num_blocks > 0
        assert twin.link.totals(direction).num_bytes == num_blocks * 16 * TARGET.kv_bytes_per_token
    # Without overlap, the steps that swapped waited for their copies: the link's busy time.
    busy = sum(twin.link.totals(d).busy_s for d in Direction)
    assert twin.stall_s == pytest.approx(busy, rel=1e-9)
    assert twin.clock.now() == pytest.approx(twin.compute_s + busy, rel=1e-9)


def test_what_cannot_be_twinned_is_refused_with_what_to_do() -> None:
    engine, _ = make_engine()
    with pytest.raises(TwinError, match=r"wraps an engine\.Engine, got str"):
        attach_twin("engine", profile=OVERLAPPED, model_shape=TARGET)  # type: ignore[arg-type]
    other = HostLink(profile=get_profile("h100-sxm"))
    with pytest.raises(TwinError, match="give them the same profile"):
        attach_twin(engine, profile=OVERLAPPED, model_shape=TARGET, link=other)
    assert type(engine.kv_cache) is KVCache and "step" not in vars(engine)  # untouched
