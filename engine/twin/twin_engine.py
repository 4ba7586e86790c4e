"""A real ``Engine`` on a modelled device: every decision and every token is the engine's
own (its model computes them, the tiny-random one on this CPU); only time is the twin's.

``attach_twin(engine, profile=..., model_shape=..., clock=...)`` wraps one engine instance
(the classes are untouched) until ``detach()``: each step, each KV copy between device and
host and each prefill outside a step is charged on the virtual clock at the target model's
size. One twin per engine; with ``forward=False`` the tokens are no model's, the decisions
still the engine's, and steps folded by ``fold_until`` leave the engine as the same steps
taken one by one. What is charged, who moves the clock, ``forward=False`` and
``fold_until``: docs/design/twin.md.

Errors (caller input)::

    InvalidRequestError (engine.errors)
    └── TwinError   not an Engine, a second twin on one engine, a link timed by another
                    profile, or a twin detached twice
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.decode_run import DecodeRun
from engine.engine import Engine
from engine.errors import InvalidRequestError
from engine.kv_cache import BlockPairs, KVCache
from engine.outputs import RequestOutput
from engine.scheduler import ScheduledChunk
from engine.twin.clock import VirtualClock
from engine.twin.link import Direction, HostLink
from engine.twin.noise import StepNoise
from engine.twin.profiles import DeviceProfile
from engine.twin.shapes import ModelShape, SequenceWork, StepBatch
from engine.twin.step_time import StepTimeModel
from engine.twin.time_ledger import TimeLedger

__all__ = ["RequestTimes", "TwinEngine", "TwinError", "attach_twin"]


class TwinError(InvalidRequestError):
    """A twin that cannot be attached or detached as asked."""


@dataclass(slots=True)
class RequestTimes:
    """One request's virtual times (seconds on the twin's clock); ``None`` until it happens."""

    arrival_s: float
    first_token_s: float | None = None
    finish_s: float | None = None


@dataclass(slots=True, kw_only=True)
class TwinEngine:
    """One engine on a modelled device; ``detach()`` gives the engine back as it was."""

    engine: Engine
    profile: DeviceProfile
    model_shape: ModelShape
    clock: VirtualClock
    link: HostLink
    advance: bool = True
    forward: bool = True
    noise: StepNoise | None = None  # a factor on each step's modelled compute
    busy_until: float = 0.0  # the end of the latest step (virtual seconds)
    last_step_s: float = 0.0  # how long the latest step took, copies it waited for included
    times: dict[str, RequestTimes] = field(default_factory=dict)
    ledger: TimeLedger = field(default_factory=TimeLedger)  # where each request's time went
    num_steps: int = 0
    # Set by a virtual-time driver before a step: the time of the next event on its loop.
    # With forward=False the engine's decode-only steps up to then are taken in one pass
    # (``_decode_run``). None: one step.
    fold_until: float | None = None
    fixed_token: int = 0  # what a step without a forward pass samples (attach_twin)
    steps_ended: tuple[float, ...] = ()  # when each step of the latest step() call ended
    peak_sequences: int = 0  # sequences computed in one step, at most
    compute_s: float = 0.0  # modelled compute of every step so far
    stall_s: float = 0.0  # what steps waited for copies beyond their compute
    # Set by attach_twin: the callables the wrappers call (the engine's own, or what
    # wrapped them before), what it found on the instances by (id, name), and the KV
    # cache's class, for detach to put back.
    _step: Callable[[], list[RequestOutput]] = field(init=False)
    _add_request: Callable[..., str] = field(init=False)
    _abort: Callable[[str], None] = field(init=False)
    _previous: dict[tuple[int, str], Any] = field(init=False, default_factory=dict)
    _kv_cache_class: type[KVCache] = field(init=False)
    _model: StepTimeModel = field(init=False)
    _batch: StepBatch | None = field(init=False, default=None)
    # The latest step's chunks: request id -> (tokens prefilled, of which recomputed).
    _work: dict[str, tuple[int, int]] = field(init=False, default_factory=dict)
    _attached: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self._model = StepTimeModel(self.profile)

    @property
    def attached(self) -> bool:
        return self._attached

    def block_bytes(self, num_blocks: int) -> int:
        """The target model's KV bytes in ``num_blocks`` of the engine's blocks."""
        return num_blocks * self.engine.config.block_size * self.model_shape.kv_bytes_per_token

    def step(self) -> list[RequestOutput]:
        """The engine's real step, timed on the clock (see the module docstring)."""
        until, self.fold_until = self.fold_until, None
        if until is not None and not self.forward and self.noise is None:
            run = self.engine.plan_decode_run(self.fixed_token)
            if run is not None:
                outputs = self._decode_run(run, until)
                if outputs is not None:
                    return outputs
        start = max(self.clock.now(), self.busy_until)
        self._batch = None
        self._work = {}
        outputs = self._step()
        batch, self._batch = self._batch, None
        end, stall = self._time_step(start, batch)
        self.ledger.step(start, end, stall, self._work)
        self.steps_ended = (end,)
        if self.advance:
            self.clock.advance_to(end)
        now = end
        for output in outputs:
            times = self.times.get(output.request_id)
            if times is None:
                continue
            if output.new_token_ids and times.first_token_s is None:
                times.first_token_s = now
            if output.finished and times.finish_s is None:
                times.finish_s = now
                self.ledger.finished(output.request_id, now)
        return outputs

    def _decode_run(self, run: DecodeRun, until: float) -> list[RequestOutput] | None:
        """The engine's decode-only steps ahead (``engine.decode_run``), each timed as a
        step of its own, taken together as far as they end before ``until``: whatever
        happens then finds the engine, and the outputs it has been handed, as after the
        same steps taken one by one. No first token and no finish happens in them, so no
        request's times change. None when not even the first ends before ``until``."""
        end = max(self.clock.now(), self.busy_until)
        computes: list[float] = []  # each step's compute
        # Step k's batch is run.contexts(k): every request one token further on.
        num_sequences, context = len(run.requests), sum(run.contexts(0))
        decode_seconds, shape = self._model.decode_seconds, self.model_shape
        while len(computes) < run.num_steps:
            compute = decode_seconds(shape, num_sequences, context)
            step_end = self._step_end(end, compute)[0]
            if step_end >= until:
                break
            computes.append(compute)
            end = step_end
            context += num_sequences
        if not computes:
            return None
        ends = []
        start = end = max(self.clock.now(), self.busy_until)
        stall_s = 0.0
        for compute in computes:
            end, stall = self._charge(end, compute, num_sequences)
            ends.append(end)
            stall_s += stall
        self.steps_ended = tuple(ends)
        self.ledger.decode_run(start, end, stall_s, (r.request_id for r in run.requests))
        outputs = self.engine.take_decode_run(run, len(computes), self.fixed_token)
        if self.advance:
            self.clock.advance_to(end)
        return outputs

    def _time_step(self, start: float, batch: StepBatch | None) -> tuple[float, float]:
        """Charge one step computing ``batch`` from ``start``: its end, after the copies
        it waits for (see the module docstring), and how long it waited on them beyond
        its compute."""
        compute = 0.0
        num_sequences = 0
        if batch is not None and batch.sequences:
            compute = self._compute_s(batch)
            if self.noise is not None:
                compute *= self.noise.factor()
            num_sequences = batch.num_sequences
        return self._charge(start, compute, num_sequences)

    def _charge(self, start: float, compute: float, num_sequences: int) -> tuple[float, float]:
        """Count one step of ``compute`` seconds over ``num_sequences`` from ``start``;
        its end, and how long it waited on copies beyond its compute."""
        end, stall = self._step_end(start, compute)
        self.num_steps += 1
        self.compute_s += compute
        self.stall_s += stall
        self.peak_sequences = max(self.peak_sequences, num_sequences)
        self.busy_until = end
        self.last_step_s = end - start
        return end, stall

    def _compute_s(self, batch: StepBatch) -> float:
        return self._model.seconds(self.model_shape, batch)

    def _step_end(self, start: float, compute: float) -> tuple[float, float]:
        """When a step computing for ``compute`` seconds from ``start`` ends, and how long
        it stalls on copies beyond its compute."""
        copies_done = max(start, self.link.free_at)
        if self.profile.copies_overlap_compute:
            return max(start + compute, copies_done), max(0.0, copies_done - (start + compute))
        return copies_done + compute, copies_done - start

    def prefill(self, items: Sequence[tuple[Sequence[int], int, int, Sequence[int]]]) -> None:
        """Charge a forward pass outside a step (``runner.forward``'s items: token ids,
        start, tokens, blocks) as a step of its own: the device computes it after the
        step in progress, and the next step starts after it."""
        batch = StepBatch(tuple(SequenceWork(num, start) for _, start, num, _ in items))
        if not batch.sequences:
            return
        start = max(self.clock.now(), self.busy_until)
        if not self.profile.copies_overlap_compute:  # it waits for the copies, as a step
            start = max(start, self.link.free_at)
        compute = self._model.seconds(self.model_shape, batch)
        if self.noise is not None:
            compute *= self.noise.factor()
        self.compute_s += compute
        self.busy_until = start + compute
        if self.advance:
            self.clock.advance_to(self.busy_until)

    def add_request(self, *args: Any, **kwargs: Any) -> str:
        request_id: str = self._add_request(*args, **kwargs)
        now = self.clock.now()
        self.times[request_id] = RequestTimes(arrival_s=now)
        self.ledger.arrived(request_id, now)
        return request_id

    def abort(self, request_id: str) -> None:
        self._abort(request_id)
        times = self.times.get(request_id)
        if times is not None and times.finish_s is None:
            times.finish_s = self.clock.now()
            self.ledger.finished(request_id, times.finish_s)

    def _record(self, chunks: Sequence[ScheduledChunk]) -> None:
        self._batch = StepBatch.of_chunks(chunks)
        count = self.engine.prefill.count
        for chunk in chunks:  # before the engine counts them as computed
            request = chunk.request
            self._work[request.request_id] = count(
                request.request_id,
                request.num_computed_tokens,
                chunk.num_tokens,
                request.num_prompt_tokens,
            )

    def _copy(self, pairs: BlockPairs, direction: Direction) -> None:
        at = max(self.clock.now(), self.busy_until)  # between steps, or after this one
        self.link.charge(self.block_bytes(len(pairs)), at=at, direction=direction)

    def detach(self) -> None:
        """Put back what ``attach_twin`` found: the engine's ``step``, ``add_request``,
        ``abort`` and ``clock``, its runner's ``execute`` and its KV cache's class. The
        clock, the link and the times stay readable."""
        if not self._attached:
            raise TwinError("this twin is already detached; attach_twin the engine again")
        engine = self.engine
        for owner, name in _wrapped_attributes(engine):
            previous = self._previous.get((id(owner), name))
            if previous is None:
                del owner.__dict__[name]
            else:
                setattr(owner, name, previous)
        engine.kv_cache.__class__ = self._kv_cache_class
        self._attached = False


def _wrapped_attributes(engine: Engine) -> tuple[tuple[object, str], ...]:
    return (
        (engine, "step"),
        (engine, "add_request"),
        (engine, "abort"),
        (engine, "clock"),
        (engine.runner, "execute"),
        (engine.runner, "forward"),
    )


def attach_twin(
    engine: Engine,
    *,
    profile: DeviceProfile,
    model_shape: ModelShape,
    clock: VirtualClock | None = None,
    link: HostLink | None = None,
    advance: bool = True,
    forward: bool = True,
    noise: StepNoise | None = None,
) -> TwinEngine:
    """Put ``engine`` on ``profile``'s device running ``model_shape``'s model, in virtual
    time on ``clock`` (a new one at 0.0 unless given), copies queued on ``link`` (a new one
    for ``profile`` unless given). The engine's callers keep calling ``engine.step()``;
    ``advance``, ``forward`` and ``noise`` as in the module docstring."""
    if not isinstance(engine, Engine):
        raise TwinError(f"attach_twin wraps an engine.Engine, got {type(engine).__name__}")
    if isinstance(engine.kv_cache, _TwinKVCache):
        raise TwinError("this engine already has a twin attached; detach that one first")
    if link is not None and link.profile != profile:
        raise TwinError(
            f"the link is timed by profile {link.profile.name!r}, the twin by "
            f"{profile.name!r}; give them the same profile"
        )
    twin = TwinEngine(
        engine=engine,
        profile=profile,
        model_shape=model_shape,
        clock=VirtualClock() if clock is None else clock,
        link=HostLink(profile=profile) if link is None else link,
        advance=advance,
        forward=forward,
        noise=noise,
    )
    twin._kv_cache_class = type(engine.kv_cache)
    twin._previous = {
        (id(owner), name): owner.__dict__.get(name) for owner, name in _wrapped_attributes(engine)
    }
    step, add_request, abort = engine.step, engine.add_request, engine.abort
    runner_execute, runner_forward = engine.runner.execute, engine.runner.forward

    twin.fixed_token = fixed_token = _fixed_token(engine)

    def execute(chunks: Sequence[ScheduledChunk]) -> list[int | None]:
        twin._record(chunks)
        if twin.forward:
            return runner_execute(chunks)
        return [fixed_token if chunk.completes else None for chunk in chunks]

    def twin_forward(items: Sequence[tuple[Sequence[int], int, int, Sequence[int]]]) -> Any:
        twin.prefill(items)
        if twin.forward:
            return runner_forward(items)
        return None  # its one caller, pin_prefix, reads no hidden states

    twin._step, twin._add_request, twin._abort = step, add_request, abort
    # Each method replaced on this instance only, on purpose, until detach() restores it.
    engine.runner.execute = execute  # type: ignore[method-assign]  # until detach()
    engine.runner.forward = twin_forward  # type: ignore[method-assign]  # until detach()
    engine.step = twin.step  # type: ignore[method-assign]  # until detach()
    engine.add_request = twin.add_request  # type: ignore[method-assign]  # until detach()
    engine.abort = twin.abort  # type: ignore[method-assign]  # until detach()
    engine.clock = twin.clock.now
    engine.kv_cache.__class__ = _twin_kv_cache(twin, type(engine.kv_cache))
    twin._attached = True
    return twin


def _fixed_token(engine: Engine) -> int:
    """The token a step without a forward pass samples: a word's, never end-of-sequence."""
    eos = engine.tokenizer.eos_token_ids
    for token in engine.tokenizer.encode(" ok"):
        if token not in eos:
            return token
    return next(t for t in range(engine.model_config.vocab_size) if t not in eos)


class _TwinKVCache(KVCache):
    """What every twin's KV cache class derives from: marks an engine already twinned."""

    __slots__ = ()


def _twin_kv_cache(twin: TwinEngine, base: type[KVCache]) -> type[KVCache]:
    """A subclass of the engine's KV cache class, for this twin alone, whose swaps are
    charged to its link once they are made. ``KVCache`` has slots and no ``__dict__``, so
    its methods cannot be wrapped per instance; its class is swapped instead (empty-slots
    subclasses keep its layout), and ``detach`` swaps it back. Without a forward pass
    (``forward=False``) copies are checked and charged but not made: no model reads the
    K/V they would move."""

    # First the pairs are checked (pairs it refuses are no copy to charge). Without a
    # forward pass nothing reads K/V, so the copy itself is not made.
    def swap_out(self: KVCache, pairs: BlockPairs) -> None:
        if twin.forward:
            base.swap_out(self, pairs)
        else:
            self._pairs(pairs, "swap_out", src_pool="device", dst_pool="host")
        twin._copy(pairs, Direction.OFFLOAD)

    def swap_in(self: KVCache, pairs: BlockPairs) -> None:
        if twin.forward:
            base.swap_in(self, pairs)
        else:
            self._pairs(pairs, "swap_in", src_pool="host", dst_pool="device")
        twin._copy(pairs, Direction.RESTORE)

    def copy_blocks(self: KVCache, pairs: BlockPairs) -> None:
        if twin.forward:
            base.copy_blocks(self, pairs)
        else:
            self._pairs(pairs, "copy_blocks", src_pool="device", dst_pool="device")

    namespace = {
        "__slots__": (),
        "__module__": __name__,
        "swap_out": swap_out,
        "swap_in": swap_in,
        "copy_blocks": copy_blocks,
    }
    return type("TwinKVCache", (_TwinKVCache, base), namespace)
