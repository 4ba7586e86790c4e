"""One model served at batch 8, end to end: what a card gives the model a user runs.

On a GPU the model is ``llama-8b-random`` (Llama 3 8B's shape, random weights drawn on
the card), in bf16 with its KV sized by profiling the card (``engine.memory_profile``),
or int4. On a CPU the same run on ``tiny-random`` checks that every figure is produced.
Figures (bench ``model``, each named with the weights' format, e.g.
``decode_tok_s_batch8[bf16]``):

- ``load_s``: building the engine (weights drawn or read, quantized, KV allocated,
  kernels probed), on the wall clock;
- ``weights_gib`` and ``kv_gib``: what the weights and the KV pool take on the device;
- ``prefill_tok_s_batch8``: 8 prompts of ``prompt_tokens`` prefilled from cold, prompt
  tokens a second;
- ``decode_tok_s_batch8`` and ``decode_ms_per_step``: the 8 then decoding together;
- ``decode_graph_speedup`` (where the engine captured decode graphs): the same batch's
  median decode step launched eagerly over replayed as a graph;
- ``decode_weights_gbps``: the weights' bytes over a decode step's time, what the step
  would stream if reading the weights were all it did, and
  ``decode_roofline_fraction``: that over the device's own copy bandwidth, measured just
  before (bytes read and written by a device-to-device copy of 1 GiB on a GPU; the
  card's datasheet bandwidth is higher, so this fraction reads high by a few percent).

A decode step at batch 8 also reads the 8 contexts' K/V (``prompt_tokens`` each, about
0.5 GiB for 8B at 512 tokens against 15 GiB of weights); the figure leaves it out, as a
roofline of weight streaming does.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator

import torch

from engine.benchmarks.measurement import Direction, Measurement
from engine.config import EngineConfig
from engine.device import resolve_device
from engine.engine import Engine
from engine.sampling import SamplingParams
from engine.weights import weights_nbytes

__all__ = ["copy_bandwidth", "run"]

_BENCH = "model"
_BATCH = 8
_GIB = 1 << 30
_VOCAB_HIGH = 100_000  # below cl100k's special ids
_WEIGHTS_TARGET_GIB = {"int4": 5.5}  # an 8B model's int4 weights must fit a 16 GB card's share
_ROOFLINE_TARGET = 0.6  # of the copy bandwidth, bf16 on a GPU


def run(
    *,
    quick: bool = False,
    model: str | None = None,
    device: str = "auto",
    quantize: str | None = None,
    prompt_tokens: int | None = None,
    new_tokens: int | None = None,
    seed: int = 0,
    kv_cache_bytes: int | None = None,
) -> Iterator[Measurement]:
    """Build the engine, then prefill 8 prompts and decode them together; each figure is
    yielded as soon as it is measured. ``model``: ``llama-8b-random`` on a GPU,
    ``tiny-random`` on a CPU (``kvgov bench model``; ``tests/gpu_run.sh`` adds int4);
    ``quick``: 128-token prompts and 8 new tokens (512 and 64 otherwise)."""
    resolved = resolve_device(device)
    if model is None:
        model = "llama-8b-random" if resolved.type == "cuda" else "tiny-random"
    prompt_tokens = prompt_tokens or (128 if quick else 512)
    new_tokens = new_tokens or (8 if quick else 64)
    began = time.perf_counter()
    engine = Engine(
        EngineConfig(
            model=model,
            device=str(resolved),
            quantize=quantize,
            seed=seed,
            kv_cache_bytes=kv_cache_bytes,
            max_num_seqs=_BATCH,
            max_num_batched_tokens=max(2048, prompt_tokens),
            adapt_cpu_threads=False,
        )
    )
    _synchronize(engine.device)
    load_s = time.perf_counter() - began
    dtype = str(engine.dtype).removeprefix("torch.")
    tag = f"{quantize}" if quantize else dtype
    where = f"{model} ({tag}) on {_device_name(engine.device)}"
    yield _figure(f"load_s[{tag}]", load_s, "s", f"{where}: Engine(...) built", lower=True)
    weights = weights_nbytes(engine.model)
    kv = engine.kv_cache.kv.numel() * engine.kv_cache.kv.element_size()
    profiled = kv_cache_bytes is None and engine.device.type == "cuda"
    target = _WEIGHTS_TARGET_GIB.get(quantize or "") if model == "llama-8b-random" else None
    yield _figure(
        f"weights_gib[{tag}]",
        weights / _GIB,
        "GiB",
        f"{where}: parameters and quantized codes and scales, each storage once",
        target=target,
        lower=True,
    )
    yield _figure(
        f"kv_gib[{tag}]",
        kv / _GIB,
        "GiB",
        f"{where}: the KV pool, {engine.kv_cache.num_blocks:,} blocks of "
        f"{engine.config.block_size} tokens"
        + (" (sized by profiling the card)" if profiled else ""),
    )

    g = torch.Generator().manual_seed(seed)
    prompts = [
        torch.randint(0, _VOCAB_HIGH, (prompt_tokens,), generator=g).tolist() for _ in range(_BATCH)
    ]
    greedy = SamplingParams(max_tokens=new_tokens + 1, temperature=0, ignore_eos=True)
    engine.generate([prompts[0][:32]], SamplingParams(max_tokens=4, ignore_eos=True))  # warm up
    prefill_s, step_s, produced = _serve_batch(engine, prompts, greedy)
    decode_s = sum(step_s)
    yield _figure(
        f"prefill_tok_s_batch8[{tag}]",
        _BATCH * prompt_tokens / prefill_s,
        "tok/s",
        f"{where}: 8 prompts of {prompt_tokens} tokens from cold, to each one's first token",
    )
    yield _figure(
        f"decode_tok_s_batch8[{tag}]",
        produced / decode_s,
        "tok/s",
        f"{where}: 8 sequences decoding {new_tokens} tokens each after their prompts",
    )
    per_step = statistics.median(step_s)
    yield _figure(
        f"decode_ms_per_step[{tag}]",
        per_step * 1e3,
        "ms",
        f"{where}: median of {len(step_s)} decode steps at batch 8",
        lower=True,
    )
    streamed = weights / per_step / 1e9
    yield _figure(
        f"decode_weights_gbps[{tag}]",
        streamed,
        "GB/s",
        f"{where}: {weights / 1e9:.2f} GB of weights over the median decode step",
    )
    graphs = engine.runner.graphs
    if graphs is not None and graphs.captured:
        # The same batch again on the same engine with its graphs set aside: what
        # replaying a step instead of launching its kernels one by one saves.
        engine.runner.graphs = None
        try:
            _, eager_s, _ = _serve_batch(engine, prompts, greedy)
        finally:
            engine.runner.graphs = graphs
        eager = statistics.median(eager_s)
        yield _figure(
            f"decode_graph_speedup[{tag}]",
            eager / per_step,
            "x",
            f"{where}: median decode step at batch 8 launched eagerly ({eager * 1e3:.2f} ms) "
            f"over replayed as a CUDA/HIP graph ({per_step * 1e3:.2f} ms), the same batch",
        )
    bandwidth = copy_bandwidth(engine.device)
    on_gpu = engine.device.type == "cuda"
    yield _figure(
        f"decode_roofline_fraction[{tag}]",
        streamed / bandwidth,
        "ratio",
        f"{where}: weights GB/s per decode step over the device's copy bandwidth "
        f"({bandwidth:,.0f} GB/s, read + written, measured here)",
        target=_ROOFLINE_TARGET if on_gpu and quantize is None else None,
    )


def _serve_batch(
    engine: Engine, prompts: list[list[int]], sampling: SamplingParams
) -> tuple[float, list[float], int]:
    """Prefill ``prompts`` from cold, then decode them together to the end: the prefill's
    seconds (to every prompt's first token), each decode step's, and the tokens decoded."""
    if not engine.reset_prefix_cache():
        raise RuntimeError("a request, hold or pin keeps cached blocks: cannot time cold")
    ids = [engine.add_request(p, sampling) for p in prompts]
    requests = [engine._requests[i] for i in ids]
    began = time.perf_counter()
    while any(r.num_output_tokens == 0 for r in requests):
        engine.step()
    prefill_s = time.perf_counter() - began
    step_s: list[float] = []
    produced = 0
    while engine.has_unfinished():
        began = time.perf_counter()
        produced += sum(len(out.new_token_ids) for out in engine.step())
        step_s.append(time.perf_counter() - began)
    for request_id in ids:
        engine.pop_completion(request_id)
    return prefill_s, step_s, produced


def copy_bandwidth(device: torch.device, *, num_bytes: int = _GIB, repeats: int = 5) -> float:
    """GB/s a device-to-device copy moves (bytes read plus bytes written), the best of
    ``repeats`` after a warm-up: the memory bandwidth the card really gives."""
    num_bytes = num_bytes if device.type == "cuda" else num_bytes // 16  # a CPU: 64 MiB
    src = torch.empty(num_bytes // 2, dtype=torch.int16, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(repeats):
        _synchronize(device)
        began = time.perf_counter()
        dst.copy_(src)
        _synchronize(device)
        best = min(best, time.perf_counter() - began)
    return 2 * num_bytes / best / 1e9


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "the CPU"


def _figure(
    metric: str,
    value: float,
    unit: str,
    note: str,
    *,
    target: float | None = None,
    lower: bool = False,
) -> Measurement:
    return Measurement(
        bench=_BENCH,
        metric=metric,
        value=value,
        unit=unit,
        target=target,
        direction=Direction.LOWER_IS_BETTER if lower else Direction.HIGHER_IS_BETTER,
        note=note,
    )
