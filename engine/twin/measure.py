"""Measuring a step-time grid on the real engine: designed batches run through a real
``Engine``, each timed around ``engine.step()``.

A ``GridPoint`` asks for a batch: ``num_decode_seqs`` sequences decoding at a context of
about ``num_decode_context_tokens``, and/or one prefill of ``num_prefill_tokens`` over
``num_prefill_context_tokens`` already cached (a prefix of an earlier request). The
engine decides what really runs (its chunk budget, its prefix cache, the decode steps
that warm-up adds to each context), so the recorded ``StepBatch`` is read from the
chunks the model runner computed in the timed step, each with its request's
``num_computed_tokens`` as it stood before the step: what ran, not what was asked.

Each point is warmed up, then timed until ``repeats`` of its steps ran quiet, or
``MAX_TRIES_PER_REPEAT`` times ``repeats`` steps were timed; its sample is the quiet step
with the median time (the lower median for an even count), with that step's own batch.
A step runs quiet when the kernel took a core from the process (an involuntary context
switch) no more than a timer tick's worth of times (``quiet_switches``): on a CPU a step
is a few hundred OpenMP parallel regions that each wait for every thread, so beside
another busy process each preempted thread stalls the whole step (a 6 ms decode then
takes 10-400 ms), and the time measures the other process, not the device. Where no
step of a point ran quiet, its sample is the fastest, the least disturbed, and
``measure_grid`` logs how many points were. Steps that only set a point up (its contexts
prefilled, its requests run to their end) run no model: a step's time does not depend on
the values its cached K/V hold. Every request the measurement adds is ended and forgotten
before it returns.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import os
import platform
import random
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.request import RequestStatus
from engine.sampling import SamplingParams
from engine.scheduler import ScheduledChunk
from engine.twin.link_fit import LinkSample
from engine.twin.shapes import ModelShape, StepBatch, StepSample

__all__ = [
    "LINK_SIZES",
    "MAX_TRIES_PER_REPEAT",
    "GridPoint",
    "card_points",
    "default_points",
    "grid_engine_config",
    "measure_grid",
    "measure_link",
    "model_shape",
    "quiet_switches",
    "recorded_here",
]

logger = logging.getLogger(__name__)

resource: ModuleType | None
try:
    import resource  # counts context switches; Unix only
except ImportError:  # pragma: no cover: Windows
    resource = None

_WEIGHT_BITS = {"int8": 8, "int4": 4}
MAX_TRIES_PER_REPEAT = 3  # a point's timed steps, at most, per quiet step it asks for
# A quiet host still preempts a step now and then: kernel threads and timers, a few
# microseconds each. Measured on the 2-core development machine: 0-4 involuntary
# switches in a quiet 6-45 ms step, 7-11 in a quiet 300 ms one; beside one busy
# process, 250 a second of step (each costing the step a scheduler slice of ~4 ms).
_QUIET_SWITCHES = 2
_QUIET_SWITCHES_PER_S = 40


def quiet_switches(seconds: float) -> int:
    """The most involuntary context switches a step of ``seconds`` has on a quiet host."""
    return _QUIET_SWITCHES + math.floor(_QUIET_SWITCHES_PER_S * seconds)


@dataclass(frozen=True, slots=True, kw_only=True)
class GridPoint:
    """One batch to time: decodes, a prefill, or both in one step (a mixed batch)."""

    num_decode_seqs: int = 0
    num_decode_context_tokens: int = 0
    num_prefill_tokens: int = 0
    num_prefill_context_tokens: int = 0

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"GridPoint.{name} must be an int >= 0, got {value!r}")
        if self.num_decode_seqs == 0 and self.num_prefill_tokens == 0:
            raise ValueError("a GridPoint needs num_decode_seqs or num_prefill_tokens above 0")
        if self.num_decode_seqs > 0 and self.num_decode_context_tokens == 0:
            raise ValueError(
                "a GridPoint with decoding sequences needs num_decode_context_tokens above 0"
            )

    @property
    def num_tokens(self) -> int:
        """The most tokens the engine holds for this point at once, before warm-up."""
        decodes = self.num_decode_seqs * (self.num_decode_context_tokens + 1)
        return decodes + self.num_prefill_context_tokens + self.num_prefill_tokens


def default_points(*, quick: bool = False) -> tuple[GridPoint, ...]:
    """The grid ``kvgov twin fit`` measures: decode steps of 1-16 sequences at contexts of
    16-4,096 tokens (and a few at 6,144), prefills of 16-2,048 tokens on 0-6,144 cached,
    and mixed batches (an agent's next call is a long prefill on a long cached context
    beside others decoding). ``quick`` keeps a corner-and-middle subset of each, its
    prefills on at most 3,072 cached tokens."""
    if quick:
        decode = [(b, n) for b in (1, 2, 4, 8, 16) for n in (16, 256, 2048)]
        decode += [(4, 4096), (2, 6144)]
        prefill = [(p, c) for p in (16, 64, 256, 1024) for c in (0, 1024)]
        # Not 1,024 on 6,144 cached: alone it took half the quick grid's time.
        prefill += [(1024, 3072), (2048, 2048)]
        mixed = [(4, 256, 64), (16, 1024, 256), (2, 2048, 1024)]
    else:
        contexts = (16, 64, 128, 256, 512, 1024, 2048, 4096)
        decode = [(b, n) for b in (1, 2, 4, 8, 16) for n in contexts]
        decode += [(1, 6144), (4, 6144)]
        chunks = (16, 32, 64, 128, 256, 512, 1024)
        prefill = [(p, c) for p in chunks for c in (0, 256, 1024, 3072)]
        prefill += [(512, 6144), (1024, 6144), (2048, 0), (2048, 2048), (2048, 4096)]
        mixed = [(b, n, p) for b in (4, 16) for n in (256, 1024) for p in (64, 512)]
        mixed += [(2, 2048, 1024), (4, 3072, 1024), (2, 4096, 1024)]
    return (
        *(GridPoint(num_decode_seqs=b, num_decode_context_tokens=n) for b, n in decode),
        *(GridPoint(num_prefill_tokens=p, num_prefill_context_tokens=c) for p, c in prefill),
        *(
            GridPoint(num_decode_seqs=b, num_decode_context_tokens=n, num_prefill_tokens=p)
            for b, n, p in mixed
        ),
    )


def card_points(
    *, max_context_tokens: int = 16_384, max_kv_tokens: int = 131_072
) -> tuple[GridPoint, ...]:
    """The grid a lent GPU measures in its few minutes (``tests/gpu_run.sh``): decode steps
    of 1-32 sequences at contexts of 512 to ``max_context_tokens``, as many of them as
    hold at most ``max_kv_tokens`` of context together (128k tokens: 16 GiB of an 8B
    model's KV beside its 15 GiB of bf16 weights), prefills of 512 and 2,048 tokens on 0
    to 14k cached, and mixed batches of a long prefill beside decodes."""
    contexts = [n for n in (512, 1024, 2048, 4096, 8192, 16_384) if n <= max_context_tokens]
    decode = [(b, n) for b in (1, 2, 4, 8, 16, 32) for n in contexts if b * n <= max_kv_tokens]
    cached = [c for c in (0, 2048, 8192, 14_336) if c + 2048 <= max_context_tokens]
    prefill = [(p, c) for p in (512, 2048) for c in cached]
    mixed = [(8, 4096, 512), (32, 1024, 2048), (4, 8192, 1024)]
    mixed = [(b, n, p) for b, n, p in mixed if n <= max_context_tokens]
    return (
        *(GridPoint(num_decode_seqs=b, num_decode_context_tokens=n) for b, n in decode),
        *(GridPoint(num_prefill_tokens=p, num_prefill_context_tokens=c) for p, c in prefill),
        *(
            GridPoint(num_decode_seqs=b, num_decode_context_tokens=n, num_prefill_tokens=p)
            for b, n, p in mixed
        ),
    )


def grid_engine_config(
    *,
    model: str,
    device: str,
    points: Sequence[GridPoint],
    repeats: int,
    warmup: int = 1,
    quantize: str | None = None,
    dtype: str | None = None,
) -> EngineConfig:
    """An engine sized for measuring ``points``: a chunk budget that prefills each point in
    one step, KV for the largest point as it grows through its group's steps (every try
    of every point), and the caller's thread count throughout (``adapt_cpu_threads=False``:
    a probe on one thread inside a timed step would mix two thread counts in one grid
    point)."""
    block_size = EngineConfig().block_size
    max_num_batched_tokens = max(
        2048,
        max(p.num_decode_seqs + p.num_prefill_tokens for p in points),
        max(p.num_prefill_context_tokens for p in points),
    )
    growth = _decode_growth(
        points,
        num_timed=MAX_TRIES_PER_REPEAT * repeats,
        warmup=warmup,
        chunk=max_num_batched_tokens,
    )
    most_tokens = max(
        p.num_tokens + p.num_decode_seqs * growth.get(p.num_decode_context_tokens, 0)
        for p in points
    )
    num_seqs = max(p.num_decode_seqs for p in points) + 2
    return EngineConfig(
        model=model,
        device=device,
        quantize=quantize,
        dtype=dtype,
        block_size=block_size,
        # Each sequence's partly filled last block, the scheduler's 1% watermark, and a
        # little room for the previous point's cached blocks (evicted as needed).
        num_blocks=math.ceil(1.05 * (math.ceil(most_tokens / block_size) + num_seqs)) + 16,
        max_num_seqs=num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        adapt_cpu_threads=False,
    )


def measure_grid(
    engine_or_config: Engine | EngineConfig,
    *,
    device: str,
    points: Sequence[GridPoint],
    repeats: int,
    warmup: int = 1,
    seed: int = 0,
    model_name: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[StepSample]:
    """One ``StepSample`` per point, in the order given, for the profile named ``device``.
    ``warmup`` untimed steps (or prefills) precede each point's ``repeats`` timed ones;
    ``seed`` draws the prompts' token ids; ``model_name`` names the model in the samples
    (default: the engine's ``config.model``); ``progress(done, total)`` after each point."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    engine = engine_or_config if isinstance(engine_or_config, Engine) else Engine(engine_or_config)
    shape = model_shape(engine, name=model_name)
    run = _GridRun(engine, random.Random(seed))
    samples: dict[int, StepSample] = {}
    num_disturbed = 0
    with run.recording():
        run.warm_up()
        for i, timed in run.measure(points, repeats=repeats, warmup=warmup):
            chosen = _pick(timed)
            num_disturbed += not chosen.quiet
            samples[i] = StepSample(
                device=device,
                model=shape,
                batch=chosen.batch,
                seconds=chosen.seconds,
                attention=engine.attention.name,
            )
            if progress is not None:
                progress(len(samples), len(points))
    if num_disturbed:
        logger.warning(
            "%d of %d step-time grid points never ran quiet (another process held a core "
            "through all %d of their tries); their times are too long: measure the grid "
            "again on a quieter host",
            num_disturbed,
            len(points),
            MAX_TRIES_PER_REPEAT * repeats,
        )
    return [samples[i] for i in range(len(points))]


@dataclass(frozen=True, slots=True)
class _Timed:
    """One timed step: how long it took, what it computed, and how often the kernel took
    a core from the process meanwhile."""

    seconds: float
    batch: StepBatch
    num_switches: int

    @property
    def quiet(self) -> bool:
        return self.num_switches <= quiet_switches(self.seconds)


def _pick(timed: Sequence[_Timed]) -> _Timed:
    """The quiet step of median time (the lower median); where none ran quiet, the fastest."""
    quiet = sorted((t for t in timed if t.quiet), key=lambda t: t.seconds)
    if quiet:
        return quiet[(len(quiet) - 1) // 2]
    return min(timed, key=lambda t: t.seconds)


def _involuntary_switches() -> int:
    """The process's involuntary context switches so far, every thread's (0 where the
    platform does not count them: each step is then taken as quiet)."""
    if resource is None:
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw


def model_shape(engine: Engine, *, name: str | None = None) -> ModelShape:
    """The engine's model as a step-time model reads it."""
    activation_bits = engine.dtype.itemsize * 8
    return ModelShape.from_config(
        engine.model_config,
        name=name or engine.config.model,
        activation_bits=activation_bits,
        weight_bits=_WEIGHT_BITS.get(engine.config.quantize or "", activation_bits),
    )


def recorded_here(engine: Engine) -> dict[str, Any]:
    """Where and when a grid on ``engine`` is recorded (no host name): for a grid file."""
    if engine.device.type == "cuda":
        device_name = torch.cuda.get_device_name(engine.device)
    else:
        device_name = _cpu_name()
    return {
        "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "device_type": engine.device.type,
        "device_name": device_name,
        "dtype": str(engine.dtype).removeprefix("torch."),
        "quantize": engine.config.quantize,
        "attention": engine.attention.name,
        "num_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
    }


class _GridRun:
    """The requests of one measurement, and the batch each step computed."""

    def __init__(self, engine: Engine, rng: random.Random) -> None:
        self.engine = engine
        self.rng = rng
        self.ids = (f"twin-grid-{n}" for n in itertools.count())
        self.added: list[str] = []
        self.last_batch: StepBatch | None = None
        # False while steps only set a point up (``step_until``): the runner then
        # schedules, allocates and caches as ever but runs no model (``_Recording``).
        self.computing = True
        cuda = engine.device.type == "cuda"
        self.sync: Callable[[], None] = (
            (lambda: torch.cuda.synchronize(engine.device)) if cuda else (lambda: None)
        )

    def recording(self) -> _Recording:
        return _Recording(self)

    def record(self, chunks: Sequence[ScheduledChunk]) -> None:
        self.last_batch = StepBatch.of_chunks(chunks)

    def warm_up(self) -> None:
        """A prefill and a few decodes first: the first steps pay for allocations, and
        lazily built kernels and plans."""
        rid = self.add(self.prompt(64), max_tokens=4)
        self.step_until_done([rid], compute=True)

    def measure(
        self, points: Sequence[GridPoint], *, repeats: int, warmup: int
    ) -> Iterator[tuple[int, list[_Timed]]]:
        order = sorted(
            range(len(points)),
            key=lambda i: (points[i].num_decode_context_tokens, -points[i].num_decode_seqs),
        )
        for context, group in itertools.groupby(
            order, key=lambda i: points[i].num_decode_context_tokens
        ):
            members = list(group)
            if context == 0:
                for i in members:
                    step = functools.partial(self.prefill_step, points[i])
                    yield i, self.repeat(step, repeats=repeats, warmup=warmup)
            else:
                yield from self.decode_group(points, members, repeats=repeats, warmup=warmup)

    def decode_group(
        self, points: Sequence[GridPoint], members: list[int], *, repeats: int, warmup: int
    ) -> Iterator[tuple[int, list[_Timed]]]:
        """Points sharing one decode context, most sequences first: the sequences are
        prefilled once, and ended one by one down to each point's count."""
        context = points[members[0]].num_decode_context_tokens
        # Chunked prefill: the first sequences decode while the last still prefill, so
        # contexts part by a few tokens (the recorded batch says by how many). No limit
        # on their tokens but the model's: none may end before the group is done.
        decoding = [
            self.add(self.prompt(context), max_tokens=self.engine.max_model_len)
            for _ in range(points[members[0]].num_decode_seqs)
        ]
        self.step_until(lambda: all(self.num_output_tokens(rid) > 0 for rid in decoding))
        try:
            for i in members:
                point = points[i]
                while len(decoding) > point.num_decode_seqs:
                    self.end(decoding.pop())
                step = functools.partial(self.decode_step, point)
                yield i, self.repeat(step, repeats=repeats, warmup=warmup)
        finally:
            for rid in decoding:
                self.end(rid)

    def repeat(self, step: Callable[[], _Timed], *, repeats: int, warmup: int) -> list[_Timed]:
        """``warmup`` untimed calls of ``step``, then timed ones until ``repeats`` ran quiet
        or ``MAX_TRIES_PER_REPEAT * repeats`` were timed."""
        for _ in range(warmup):
            step()
        timed: list[_Timed] = []
        num_quiet = 0
        while num_quiet < repeats and len(timed) < MAX_TRIES_PER_REPEAT * repeats:
            timed.append(step())
            num_quiet += timed[-1].quiet
        return timed

    def decode_step(self, point: GridPoint) -> _Timed:
        """The group's decodes, beside a fresh prefill where the point is mixed."""
        prefill = self.cached_prefill(point) if point.num_prefill_tokens else None
        timed = self.timed_step()
        if prefill is not None:
            self.end(prefill)
        return timed

    def prefill_step(self, point: GridPoint) -> _Timed:
        """A fresh prompt, timed in the step that prefills it."""
        rid = self.cached_prefill(point)
        timed = self.timed_step()
        self.step_until_done([rid])
        return timed

    def cached_prefill(self, point: GridPoint) -> str:
        """Add a request of ``num_prefill_tokens`` new tokens after a context that an
        earlier request left in the prefix cache; its prefill is the next step's."""
        context = self.prompt(point.num_prefill_context_tokens)
        if context:
            self.step_until_done([self.add(context, max_tokens=1)])
        return self.add(context + self.prompt(point.num_prefill_tokens), max_tokens=1)

    def timed_step(self) -> _Timed:
        self.last_batch = None
        self.sync()
        switches = _involuntary_switches()
        start = time.perf_counter()
        self.engine.step()
        self.sync()
        seconds = time.perf_counter() - start
        num_switches = _involuntary_switches() - switches
        assert self.last_batch, "the timed step computed nothing: the point's requests ended"
        return _Timed(seconds, self.last_batch, num_switches)

    def prompt(self, num_tokens: int) -> list[int]:
        # Random ids: no two prompts share a prefix the cache could serve.
        vocab = self.engine.model_config.vocab_size
        return [self.rng.randrange(vocab) for _ in range(num_tokens)]

    def add(self, prompt: list[int], *, max_tokens: int) -> str:
        rid = next(self.ids)
        sampling = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
        self.engine.add_request(prompt, sampling, request_id=rid)
        self.added.append(rid)
        return rid

    def num_output_tokens(self, rid: str) -> int:
        return self.engine._request(rid).num_output_tokens

    def step_until(self, done: Callable[[], bool], *, compute: bool = False) -> None:
        """Step until ``done``; without ``compute``, steps that only set a point up (its
        contexts prefilled, its requests run to their end): no step of them is timed, and
        a decode step's time does not depend on what its cached K/V hold, so they run no
        model. On a CPU that was two thirds of a grid's time (16 contexts of 2,048 tokens
        prefilled for one decode point)."""
        self.computing = compute
        try:
            while not done():
                self.engine.step()
        finally:
            self.computing = True

    def step_until_done(self, rids: list[str], *, compute: bool = False) -> None:
        self.step_until(lambda: all(self.finished(rid) for rid in rids), compute=compute)

    def finished(self, rid: str) -> bool:
        return self.engine._request(rid).status is RequestStatus.FINISHED

    def end(self, rid: str) -> None:
        if not self.finished(rid):
            self.engine.abort(rid)

    def forget(self) -> None:
        """End and forget every request this run added (the engine may be the caller's)."""
        for rid in self.added:
            self.end(rid)
            self.engine.pop_completion(rid)
        self.added.clear()


_SET_UP_TOKEN = 0  # the token a set-up step gives (grid requests ignore end-of-sequence)


class _Recording:
    """While open, the engine's model runner reports each step's chunks to the run, and
    runs the model only where the run computes; on close the runner is as it was and the
    run's requests are gone."""

    def __init__(self, run: _GridRun) -> None:
        self.run = run
        self.runner = run.engine.runner
        self.previous = self.runner.__dict__.get("execute")
        self.execute = self.runner.execute

    def __enter__(self) -> _Recording:
        def execute(chunks: Sequence[ScheduledChunk]) -> list[int | None]:
            self.run.record(chunks)
            if not self.run.computing:  # a set-up step: what a sampled token would be
                return [_SET_UP_TOKEN if chunk.completes else None for chunk in chunks]
            return self.execute(chunks)

        self.runner.execute = execute  # type: ignore[method-assign]  # shadows it while open
        return self

    def __exit__(self, *exc: object) -> None:
        if self.previous is None:
            del self.runner.execute
        else:
            self.runner.execute = self.previous  # type: ignore[method-assign]  # as it was
        self.run.forget()


def _decode_growth(
    points: Sequence[GridPoint], *, num_timed: int, warmup: int, chunk: int
) -> dict[int, int]:
    """Per decode context, how many tokens its group's sequences grow by at most: the
    decodes the first of them run while the last still prefill (chunked by ``chunk``
    tokens a step), then every step of every point in the group (``warmup`` and up to
    ``num_timed`` timed ones each)."""
    growth: dict[int, int] = {}
    for p in points:
        context = p.num_decode_context_tokens
        if context == 0:
            continue
        lag = math.ceil(p.num_decode_seqs * context / chunk) + 1
        growth[context] = max(growth.get(context, 0), lag) + warmup + num_timed
    return growth


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_count() -> int | None:
    import os

    return os.cpu_count()


LINK_SIZES = (8, 32, 128)  # blocks a timed copy moves


def measure_link(
    engine: Engine, *, sizes: Sequence[int] = LINK_SIZES, repeats: int = 5
) -> list[LinkSample]:
    """The host link timed on ``engine``: a context of each size in ``sizes`` blocks (those
    that fit in half its device blocks and in its host swap space) retained, then its
    offload to host memory and its restore timed, each waited for, ``repeats`` times; a
    sample is the median of one size and direction. Every budget and block it takes is
    given back."""
    capacity = engine.capacity()
    room = min(capacity.num_blocks // 2, capacity.num_host_blocks)
    sizes = [n for n in sizes if n <= room]
    if len(set(sizes)) < 2:  # a small engine: two sizes it has room for
        sizes = [max(1, room // 4), max(2, room // 2)]
    block_size = engine.config.block_size
    bytes_per_block = engine.capacity().bytes_per_block
    greedy = SamplingParams(max_tokens=1, temperature=0.0)
    samples: list[LinkSample] = []
    for num_blocks in sizes:
        budget = f"twin-link-{num_blocks}"
        engine.open_budget(budget, engine.capacity().num_blocks)
        try:
            prompt = [(i * 7919 + num_blocks) % 50_000 + 1 for i in range(num_blocks * block_size)]
            engine.generate(prompt, greedy, budget=budget)
            engine.retain(budget)
            outs, ins = [], []
            for _ in range(repeats):
                outs.append(_timed(engine, functools.partial(engine.offload, budget=budget)))
                ins.append(_timed(engine, functools.partial(engine.restore, budget=budget)))
        finally:
            engine.close_budget(budget)
        copied = num_blocks * bytes_per_block
        samples.append(LinkSample(copied, statistics.median(outs)))
        samples.append(LinkSample(copied, statistics.median(ins)))
    engine.reset_prefix_cache()
    return samples


def _timed(engine: Engine, copy: Callable[[], None]) -> float:
    started = time.perf_counter()
    copy()
    engine.kv_cache.synchronize()
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    return time.perf_counter() - started
