"""Decode runs: the steps ahead in which nothing but decoding happens, taken in one pass.

For a modelled run without a forward pass (``engine.twin``): ``plan`` says how many steps
ahead only decode (``DecodeRun``), and ``take`` makes ``n`` of them at once, leaving the
engine exactly as ``n`` calls of ``Engine.step()`` would (the same tokens, the same blocks
in the same order, the same caches and counts). A run is planned only where nothing else
can happen in it: no admission, swap-in, restore, finish, reclaim, preemption or copy on
write.

Why each holds: docs/design/engine-step.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from engine.block_manager import BlockManager
from engine.block_results import Shortfall
from engine.outputs import RequestOutput
from engine.prefill_counter import PrefillCounter
from engine.request import Request
from engine.scheduler import Scheduler
from engine.stop import TokenStopChecker

__all__ = ["DecodeRun", "plan", "take"]


@dataclass(frozen=True, slots=True)
class DecodeRun:
    """``num_steps`` decode steps ahead, of ``requests`` in scheduling order."""

    requests: tuple[Request, ...]
    num_steps: int

    def contexts(self, step: int) -> list[int]:
        """Each request's tokens already in its KV cache before planned step ``step``
        (0-based), in scheduling order: the batch a step of the run computes."""
        return [request.num_computed_tokens + step for request in self.requests]


def plan(
    scheduler: Scheduler, stops: Mapping[str, TokenStopChecker], token: int, *, pending: bool
) -> DecodeRun | None:
    """The decode steps ahead of the engine, each sampling ``token``; None when the next
    step is not one (see the module docstring). ``pending``: the next step would bring a
    context back, or let a request waiting for one go (``PendingRestores.would_restore``)."""
    running = scheduler.running
    if pending or not running or len(running) > scheduler.max_num_batched_tokens:
        return None
    running.sort(key=Request.sort_key)  # as each step sorts them
    manager = scheduler.manager
    num_steps: int | None = None
    for request in running:
        if request.num_tokens - request.num_computed_tokens != 1:
            return None  # a prefill chunk, or a token not sampled yet
        if manager.num_tokens(request.request_id) != request.num_tokens - 1:
            return None
        sampling = request.sampling
        if sampling.stop or token in stops[request.request_id].stop_ids:
            return None
        until_length = sampling.max_tokens - request.num_output_tokens
        until_ceiling = (request.ceiling_tokens or 2**62) - request.num_tokens
        last = min(until_length, until_ceiling) - 1  # the step that finishes it is not planned
        num_steps = last if num_steps is None else min(num_steps, last)
    if not num_steps or num_steps <= 0 or _could_schedule_more(scheduler):
        return None
    num_steps = _fitting(manager, running, num_steps)
    return DecodeRun(tuple(running), num_steps) if num_steps > 0 else None


def take(
    run: DecodeRun,
    num_steps: int,
    token: int,
    *,
    manager: BlockManager,
    prefill: PrefillCounter,
    stops: Mapping[str, TokenStopChecker],
    hand_over: Callable[[Sequence[Request]], None],
) -> list[RequestOutput]:
    """Make ``num_steps`` (at most ``run.num_steps``) of the planned steps; each request's
    new tokens in one output. ``hand_over``: the engine's release of retained holds whose
    budget's request runs, which each step makes for what it schedules."""
    if not 0 < num_steps <= run.num_steps:
        raise ValueError(f"a decode run of {run.num_steps} steps cannot take {num_steps}")
    requests = run.requests
    hand_over(requests)
    block_size = manager.block_size
    starts = [manager.num_tokens(r.request_id) for r in requests]  # = computed tokens
    for request in requests:
        request.token_ids.extend([token] * num_steps)
    # What touches the pool, in the order the steps would do it: step i (1-based) first
    # appends position start + i - 1 for every request, which opens a block where that
    # is a multiple of the block size, then marks start + i tokens computed, which
    # completes a block (into the prefix cache) where that is one.
    events = sorted(
        [
            (step, 0, order)
            for order, start in enumerate(starts)
            for step in range(-start % block_size + 1, num_steps + 1, block_size)
        ]
        + [
            (step, 1, order)
            for order, start in enumerate(starts)
            for step in range((-start - 1) % block_size + 1, num_steps + 1, block_size)
        ]
    )
    appended = list(starts)
    for step, phase, order in events:
        request = requests[order]
        _append(manager, request, appended, order, starts[order] + step)
        if phase == 1:
            manager.mark_computed(request.request_id, starts[order] + step)
    outputs = []
    for order, request in enumerate(requests):
        _append(manager, request, appended, order, starts[order] + num_steps)
        rid = request.request_id
        prefill.computed(rid, request.num_computed_tokens, num_steps, request.num_prompt_tokens)
        request.num_computed_tokens += num_steps
        manager.mark_computed(rid, request.num_computed_tokens)
        text = stops[rid].push_repeated(token, num_steps)
        request.output_text += text
        outputs.append(RequestOutput(rid, (token,) * num_steps, text, False, None))
    return outputs


def _append(
    manager: BlockManager, request: Request, appended: list[int], order: int, upto: int
) -> None:
    """Append ``request``'s tokens up to position ``upto`` to its block table."""
    if upto > appended[order]:
        manager.append(request.request_id, request.token_ids[appended[order] : upto])
        appended[order] = upto


def _fitting(manager: BlockManager, running: Sequence[Request], num_steps: int) -> int:
    """The most steps, up to ``num_steps``, whose appends all fit (the check is monotone:
    more steps take more blocks)."""
    low, high = 0, num_steps
    while low < high:
        mid = (low + high + 1) // 2
        if manager.can_append_together({r.request_id: mid for r in running}):
            low = mid
        else:
            high = mid - 1
    return low


def _could_schedule_more(scheduler: Scheduler) -> bool:
    """Whether the next step would swap a request in or admit one, as ``Scheduler``
    decides it (``_swap_in``, ``_admit``), without changing anything."""
    if len(scheduler.running) >= scheduler.max_num_seqs:
        return False
    if scheduler.max_num_batched_tokens - len(scheduler.running) <= 0:
        return False
    manager = scheduler.manager
    for request in sorted(scheduler.swapped, key=Request.sort_key):
        if request.held:
            continue
        rid = request.request_id
        reserve = scheduler.num_reserve_blocks(request, len(manager.block_ids(rid)))
        if manager.can_swap_in(rid, reserve):
            return True
        break  # swap-in stops at the first that does not fit
    for request in sorted(scheduler.waiting, key=Request.sort_key):
        if request.held:
            continue
        fit = scheduler.admission_fit(request)
        if fit:
            return True
        if fit.shortfall is Shortfall.POOL:
            return False  # first come, first served: nothing behind it is admitted
    return False
