"""``kvgov bench engine``: throughput and time to first token of the bundled engine.

Everything runs on the same ``tiny-random`` weights (transformers' model holds the
engine's own tensors: ``same_weights``) and the same prompts, and
every comparison first checks that the greedy outputs are identical. Figures (targets
from the engine issue, 2-core CPU):

- ``batch_scaling``: aggregate decode tokens/s with 8 concurrent sequences over 1, the
  median of rounds' ratios, each round one sequence then eight (>= 5).
- ``vs_hf_generate_batch``: our throughput over transformers' continuous batching
  (``generate_batch``, 16-token pages, ``num_blocks`` given) on 8 prompts (>= 3).
- ``vs_hf_generate``: our throughput over plain transformers ``generate``, one prompt
  at a time (>= 8).
- ``prefix_hit_ttft_speedup``: time to first token of a 2,000-token prompt whose first
  1,900 tokens are cached, over the same prompt cold (>= 5).

With ``device`` a GPU (``kvgov bench engine --device cuda``) transformers runs on the
same GPU in the engine's dtype, parity is a tolerance on prefill logits
(``logits_vs_hf_rel_error``) instead of identical greedy tokens, and
``peak_reserved_gib`` reports what the allocator held at most after the batched steps.

Both comparisons with transformers are cold against cold: our prefix cache is reset
before each timed run (``Engine.reset_prefix_cache``) and the run is checked to take no
prompt token from it, as transformers builds a fresh cache for every call. Our prompts
were served before (warm-up, ``batch_scaling``), so without the reset most of their
tokens would be hits.

transformers is imported only here, from the ``dev`` extra; without it the two
comparisons with transformers are reported as skipped.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from engine.benchmarks.hf_batching import paged_batching_config
from engine.benchmarks.measurement import Direction, Measurement
from engine.benchmarks.same_weights import transformers_model
from engine.config import EngineConfig
from engine.engine import Engine
from engine.sampling import SamplingParams

__all__ = ["ColdRun", "run", "time_cold", "versus_transformers"]

T = TypeVar("T")

_BENCH = "engine"
_VOCAB_HIGH = 100_000  # stay below cl100k's special and unused ids
_OURS_RUNS = 3  # cold runs of ours in a round of the comparison with transformers


def run(*, quick: bool = False, seed: int = 0, device: str = "cpu") -> Iterator[Measurement]:
    num_new = 16 if quick else 64
    repeats = 1 if quick else 5
    # Torch's thread count throughout, as transformers runs: a like-for-like comparison
    # (adapting, the engine would move to one thread on a contended host, where
    # transformers' two-thread steps stall, and the ratios would read the host's load).
    engine = Engine(
        EngineConfig(num_blocks=1024, seed=seed, device=device, adapt_cpu_threads=False)
    )
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, _VOCAB_HIGH, (128,), generator=g).tolist() for _ in range(8)]
    greedy = SamplingParams(max_tokens=num_new, temperature=0, ignore_eos=True)
    _run_batch(engine, prompts[:1], greedy)  # warm up

    # Side by side, as the comparisons below: a round of one run alone, then 8 at once,
    # and the median of the rounds' ratios (this host's speed drifts 2x within a minute).
    rounds = [
        (_decode_rate(engine, prompts[:1], greedy), _decode_rate(engine, prompts, greedy))
        for _ in range(repeats)
    ]
    single = statistics.median(one for one, _ in rounds)
    batched = statistics.median(eight for _, eight in rounds)
    yield Measurement(
        bench=_BENCH,
        metric="batch_scaling",
        value=statistics.median(eight / one for one, eight in rounds),
        unit="x",
        target=5,
        note=(
            f"decode tok/s: {batched:,.0f} with 8 sequences, {single:,.0f} with 1 (medians); "
            f"the median of {repeats} rounds' ratios, each round 1 then 8"
        ),
    )

    if engine.device.type == "cuda":
        yield _peak_reserved(engine)
    yield from versus_transformers(engine, prompts, greedy, repeats)
    yield _prefix_ttft(engine, g, repeats)


def _peak_reserved(engine: Engine) -> Measurement:
    """What the allocator held at most, through the batched steps above: the weights,
    the KV pool and the peak of a full-batch step, as the card sees it."""
    device = engine.device
    gib = 1 << 30
    reserved = torch.cuda.max_memory_reserved(device)
    _, total = torch.cuda.mem_get_info(device)
    pool = engine.kv_cache.kv.numel() * engine.kv_cache.kv.element_size()
    return Measurement(
        bench=_BENCH,
        metric="peak_reserved_gib",
        value=reserved / gib,
        unit="GiB",
        direction=Direction.LOWER_IS_BETTER,
        note=(
            f"torch.cuda.max_memory_reserved after 8-sequence decode steps on "
            f"{torch.cuda.get_device_name(device)} ({total / gib:.1f} GiB): weights, the KV "
            f"pool ({pool / gib:.2f} GiB, {engine.kv_cache.num_blocks} blocks) and the step"
        ),
    )


@dataclass(frozen=True, slots=True)
class ColdRun:
    seconds: float  # the mean of the repeats: each run's noise counts, as in one long run
    token_ids: list[tuple[int, ...]]  # each prompt's output
    num_prompt_tokens: int  # per run
    num_cached_tokens: int  # prompt tokens taken from the prefix cache, over every run


def time_cold(
    engine: Engine, prompts: list[list[int]], sampling: SamplingParams, repeats: int
) -> ColdRun:
    """Serve ``prompts`` ``repeats`` times, each from an empty prefix cache (the reset is
    not timed), and take the mean time; raises if any prompt token came from the cache."""
    times, tokens, cached = [], [], 0
    for _ in range(repeats):
        if not engine.reset_prefix_cache():
            raise RuntimeError("a request, hold or pin keeps cached blocks: cannot time cold")
        start = time.perf_counter()
        completions = engine.generate(prompts, sampling)
        times.append(time.perf_counter() - start)
        tokens = [c.token_ids for c in completions]
        cached += sum(c.num_cached_tokens for c in completions)
    if cached:
        raise RuntimeError(f"{cached} prompt tokens came from the prefix cache in a cold run")
    return ColdRun(
        seconds=statistics.fmean(times),
        token_ids=tokens,
        num_prompt_tokens=sum(len(p) for p in prompts),
        num_cached_tokens=cached,
    )


def _run_batch(
    engine: Engine, prompts: list[list[int]], sampling: SamplingParams
) -> list[tuple[int, ...]]:
    return [c.token_ids for c in engine.generate(prompts, sampling)]


def _timed(fn: Callable[[], T], repeats: int) -> tuple[float, T]:
    times: list[float] = []
    results: list[T] = []
    for _ in range(repeats):
        start = time.perf_counter()
        results.append(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times), results[-1]


def _decode_rate(engine: Engine, prompts: list[list[int]], sampling: SamplingParams) -> float:
    """Decode tokens per second once every prompt is prefilled (prefill not counted)."""
    ids = [engine.add_request(p, sampling) for p in prompts]
    while any(engine._requests[i].num_output_tokens == 0 for i in ids):
        engine.step()
    start, produced = time.perf_counter(), 0
    while engine.has_unfinished():
        produced += sum(len(out.new_token_ids) for out in engine.step())
    elapsed = time.perf_counter() - start
    for request_id in ids:
        engine.pop_completion(request_id)
    return produced / elapsed


def versus_transformers(
    engine: Engine, prompts: list[list[int]], greedy: SamplingParams, repeats: int
) -> Iterator[Measurement]:
    """Rounds of ours, then transformers' ``generate_batch``, then its ``generate``, side
    by side: a host whose speed drifts over a minute (shared machines here swung 2x) moves
    both sides of a round alike, and each figure is the median of the rounds' ratios.

    In a round ours is the mean of ``_OURS_RUNS`` cold runs back to back: one of ours
    lasts about a tenth of transformers' ``generate``, so a pause of the host weighs ten
    times more on it; three runs average over a comparable stretch (the mean, so every
    pause still counts)."""
    num_new = greedy.max_tokens
    try:
        import transformers
        from transformers.generation.configuration_utils import ContinuousBatchingConfig
    except ImportError:
        for metric in ("vs_hf_generate_batch", "vs_hf_generate"):
            yield Measurement(
                bench=_BENCH,
                metric=metric,
                value=float("nan"),
                unit="x",
                note="skipped: transformers is not installed (pip install -e '.[dev]')",
            )
        return
    transformers.logging.set_verbosity_error()
    hf = transformers_model(engine)  # the engine's own weight tensors, on its device
    # On a CPU both run float32 and must agree token for token. On a GPU both run the
    # same bf16/fp16 weights with different kernels: a near tie may flip a greedy token,
    # so parity is a tolerance on the logits, and the timed runs produce the same count.
    exact = engine.device.type == "cpu"
    if not exact:
        yield _logits_parity(engine, hf, prompts)
    config = transformers.GenerationConfig(
        max_new_tokens=num_new, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    pages = paged_batching_config(ContinuousBatchingConfig, num_blocks=1024, page_size=16)

    def hf_batch() -> list[tuple[int, ...]]:
        out = hf.generate_batch(
            prompts, generation_config=config, continuous_batching_config=pages, warmup=False
        )
        by_prompt = {tuple(o.prompt_ids): tuple(o.generated_tokens) for o in out.values()}
        return [by_prompt[tuple(p)] for p in prompts]

    def hf_one_by_one() -> list[tuple[int, ...]]:
        results = []
        with torch.inference_mode():
            for prompt in prompts:
                ids = torch.tensor([prompt], device=engine.device)
                out = hf.generate(ids, generation_config=config)
                results.append(tuple(out[0, len(prompt) :].tolist()))
        return results

    systems = (
        ("vs_hf_generate_batch", hf_batch, 3, "transformers generate_batch"),
        ("vs_hf_generate", hf_one_by_one, 8, "transformers generate, one prompt at a time"),
    )
    ours_s: list[float] = []
    theirs_s: dict[str, list[float]] = {metric: [] for metric, *_ in systems}
    warm = transformers.GenerationConfig(
        max_new_tokens=2, do_sample=False, eos_token_id=None, pad_token_id=0
    )  # transformers' first calls allocate and pick kernels: not timed, as ours was warmed
    hf.generate_batch(
        prompts[:1], generation_config=warm, continuous_batching_config=pages, warmup=False
    )
    with torch.inference_mode():
        hf.generate(torch.tensor(prompts[:1], device=engine.device), generation_config=warm)
    for _ in range(repeats):
        ours = time_cold(engine, prompts, greedy, _OURS_RUNS)
        ours_s.append(ours.seconds)
        for metric, fn, _target, _what in systems:
            hf_s, hf_tokens = _timed(fn, 1)
            if exact:
                assert hf_tokens == ours.token_ids, f"{metric}: greedy outputs differ"
            else:
                assert [len(t) for t in hf_tokens] == [len(t) for t in ours.token_ids], metric
            theirs_s[metric].append(hf_s)
    threads = f"both on torch's {torch.get_num_threads()} threads throughout"
    if engine.runner.threads is not None:
        threads = "ours adapting its thread count (engine.step_threads), transformers not"
    for metric, _fn, target, what in systems:
        ratios = [theirs / mine for theirs, mine in zip(theirs_s[metric], ours_s, strict=True)]
        yield Measurement(
            bench=_BENCH,
            metric=metric,
            value=statistics.median(ratios),
            unit="x",
            target=target,
            note=(
                f"8 prompts x {num_new} tokens, cold (prefix cache reset, 0 of "
                f"{ours.num_prompt_tokens:,} prompt tokens cached): ours "
                f"{statistics.median(ours_s):.2f} s, {what} "
                f"{statistics.median(theirs_s[metric]):.2f} s (medians); the median of "
                f"{repeats} rounds' ratios, each round ours ({_OURS_RUNS} cold runs, their "
                f"mean) then each transformers path once; {threads}"
            ),
        )


# bf16 keeps 8 bits of mantissa: after a few layers of differently ordered sums, logits
# of the same weights differ by a few units in the last place of the largest logit.
_LOGITS_TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 5e-3, torch.float32: 1e-4}


def _logits_parity(engine: Engine, hf: Any, prompts: list[list[int]]) -> Measurement:
    """Prefill logits of every prompt, ours against transformers' on the same device:
    the largest difference over the largest logit (a relative max error)."""
    worst = 0.0
    # The prompts' K/V go straight into blocks 0..n: none may hold cached content.
    if not engine.reset_prefix_cache():
        raise RuntimeError("a request, hold or pin keeps cached blocks: cannot check logits")
    with torch.inference_mode():
        for prompt in prompts:
            block_size = engine.config.block_size
            blocks = list(range(-(-len(prompt) // block_size)))
            hidden = engine.runner.forward([(prompt, 0, len(prompt), blocks)])
            ours = engine.model.compute_logits(hidden)  # [T, V] float32
            ids = torch.tensor([prompt], device=engine.device)
            theirs = hf(ids).logits[0].float()
            worst = max(worst, float((ours - theirs).abs().max() / theirs.abs().max()))
    tolerance = _LOGITS_TOLERANCE[engine.dtype]
    return Measurement(
        bench=_BENCH,
        metric="logits_vs_hf_rel_error",
        value=worst,
        unit="ratio",
        target=tolerance,
        direction=Direction.LOWER_IS_BETTER,
        note=(
            f"{len(prompts)} prompts of {len(prompts[0])} tokens prefilled, {engine.dtype} on "
            f"{engine.device}: max |ours - transformers| / max |transformers| (the same weights)"
        ),
    )


def _prefix_ttft(engine: Engine, g: torch.Generator, repeats: int) -> Measurement:
    one = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)

    def ttft(prompt: list[int]) -> float:
        seconds = engine.generate(prompt, one)[0].time_to_first_token_s
        assert seconds is not None  # it produced its one token
        return seconds

    cold, warm = [], []
    for _ in range(repeats):
        shared = torch.randint(0, _VOCAB_HIGH, (1_900,), generator=g).tolist()
        cold.append(ttft(shared + torch.randint(0, _VOCAB_HIGH, (100,), generator=g).tolist()))
        warm.append(ttft(shared + torch.randint(0, _VOCAB_HIGH, (100,), generator=g).tolist()))
    cold_s, warm_s = statistics.median(cold), statistics.median(warm)
    return Measurement(
        bench=_BENCH,
        metric="prefix_hit_ttft_speedup",
        value=cold_s / warm_s,
        unit="x",
        target=5,
        note=f"2,000-token prompt: cold {cold_s * 1e3:.0f} ms, 1,900 cached {warm_s * 1e3:.0f} ms",
    )
