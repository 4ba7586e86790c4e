"""``kvgov bench engine``: its timed runs start from a cold prefix cache."""

from __future__ import annotations

import pytest
import torch

from engine.benchmarks.engine import time_cold
from engine.config import EngineConfig
from engine.engine import Engine
from engine.sampling import SamplingParams

NUM_PROMPTS, PROMPT_TOKENS = 4, 128
# Of a 128-token prompt, the full blocks before its last token can be cache hits.
CACHEABLE_TOKENS = (PROMPT_TOKENS - 1) // 16 * 16


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(EngineConfig(num_blocks=256, seed=0, adapt_cpu_threads=False))  # as the bench


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 100_000, (PROMPT_TOKENS,), generator=g).tolist() for _ in range(4)]


def test_timed_runs_of_prompts_served_before_take_nothing_from_the_cache(
    engine: Engine, prompts: list[list[int]]
) -> None:
    greedy = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    engine.generate(prompts, greedy)
    warm = engine.generate(prompts, greedy)  # what a timed run without the reset would see
    assert [c.num_cached_tokens for c in warm] == [CACHEABLE_TOKENS] * NUM_PROMPTS
    hits = engine.metrics().prefix_cache_hits
    cold = time_cold(engine, prompts, greedy, repeats=2)
    assert cold.num_cached_tokens == 0
    assert engine.metrics().prefix_cache_hits == hits
    assert cold.num_prompt_tokens == NUM_PROMPTS * PROMPT_TOKENS
    assert cold.token_ids == [c.token_ids for c in warm]  # same work, cold


def test_a_cold_run_refuses_to_start_while_a_pin_keeps_cached_blocks(
    engine: Engine, prompts: list[list[int]]
) -> None:
    greedy = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    prefix = engine.pin_prefix(prompts[0][:64])
    try:
        with pytest.raises(RuntimeError, match="cannot time cold"):
            time_cold(engine, prompts, greedy, repeats=1)
    finally:
        engine.unpin(prefix)


def test_reset_prefix_cache_drops_what_nothing_holds(
    engine: Engine, prompts: list[list[int]]
) -> None:
    greedy = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    engine.generate(prompts, greedy)
    assert engine.metrics().num_blocks_cached > 0
    prefix = engine.pin_prefix(prompts[1][:64])
    assert engine.reset_prefix_cache() is False  # the pinned prefix keeps its 4 blocks
    assert engine.metrics().num_blocks_cached == 0  # cached and free: none left
    assert engine.block_manager.longest_cached_prefix(prompts[1]) == 64
    assert engine.block_manager.longest_cached_prefix(prompts[0]) == 0
    engine.unpin(prefix)
    assert engine.reset_prefix_cache() is True
    assert engine.block_manager.longest_cached_prefix(prompts[1]) == 0
    assert engine.generate(prompts[0], greedy)[0].num_cached_tokens == 0


def test_versus_transformers_runs_side_by_side_rounds_on_the_same_tokens(
    engine: Engine, prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each round times ours (the mean of back-to-back cold runs), then each transformers
    path, on outputs checked equal; each figure is the median of the rounds' ratios, and
    its note says so."""
    pytest.importorskip("transformers.generation.configuration_utils")
    from engine.benchmarks import engine as bench

    greedy = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    cold_runs: list[int] = []
    timed = bench.time_cold

    def counting(engine, prompts, sampling, repeats):  # type: ignore[no-untyped-def]
        cold_runs.append(repeats)
        return timed(engine, prompts, sampling, repeats)

    monkeypatch.setattr(bench, "time_cold", counting)
    figures = list(bench.versus_transformers(engine, prompts[:2], greedy, repeats=2))
    assert [m.metric for m in figures] == ["vs_hf_generate_batch", "vs_hf_generate"]
    assert cold_runs == [bench._OURS_RUNS] * 2  # one timing of ours a round, all of it cold
    for m in figures:
        assert m.target == {"vs_hf_generate_batch": 3, "vs_hf_generate": 8}[m.metric]
        assert "the median of 2 rounds' ratios" in m.note
        assert f"ours ({bench._OURS_RUNS} cold runs, their mean)" in m.note
        assert "both on torch's" in m.note
        assert "0 of 256 prompt tokens cached" in m.note
