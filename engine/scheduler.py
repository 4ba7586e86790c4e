"""Continuous batching: which requests run this step, and with how many tokens.

Each step schedules, within a per-step token budget, running requests first, then
swapped-out ones coming back, then waiting ones (admitted whole, computed chunk by chunk).
When blocks run out, idle holds are reclaimed before the lowest-priority, newest request
is preempted (swapped to host, else recomputed). A request at its ceiling or budget ends
with that finish reason, never an exception mid-batch. A request joins the running ones
only with ``watermark`` of the pool left free, unless it would run alone. KV moves are
performed as soon as the block manager returns them.

The step in full: docs/design/engine-step.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from engine.block_manager import BlockManager
from engine.block_results import Fit, Shortfall
from engine.errors import OutOfSwapSpaceError
from engine.kv_cache import KVCache
from engine.request import FinishReason, Request, RequestStatus

__all__ = ["ScheduledChunk", "Scheduler", "SchedulerOutput"]


@dataclass(frozen=True, slots=True)
class ScheduledChunk:
    request: Request
    num_tokens: int  # computed this step, from request.num_computed_tokens on

    @property
    def completes(self) -> bool:
        """Whether this chunk reaches the last known token, so a token is sampled."""
        return self.request.num_computed_tokens + self.num_tokens == self.request.num_tokens


@dataclass(slots=True)
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    finished: list[Request] = field(default_factory=list)  # ended by ceiling or budget
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(chunk.num_tokens for chunk in self.chunks)


class Scheduler:
    def __init__(
        self,
        *,
        block_manager: BlockManager,
        kv_cache: KVCache,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        allow_swap: bool = True,
        watermark: float = 0.01,
        reclaim: Callable[[], bool] | None = None,
    ) -> None:
        """``reclaim`` frees device blocks that no request is using (retained holds) and
        says whether it freed any; it is tried before each preemption."""
        self.manager = block_manager
        self.allow_swap = allow_swap
        self.kv_cache = kv_cache
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.swapped: list[Request] = []
        self.num_preemptions = 0
        self.num_watermark_blocks = int(watermark * block_manager.pool.num_blocks)
        self.reclaim = reclaim

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        self.running.sort(key=Request.sort_key)
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            scheduled = self._schedule_running(request, budget, out)
            if scheduled is None:  # preempted or finished: the list shrank
                continue
            budget -= scheduled
            i += 1
        if not out.preempted:
            budget = self._swap_in(budget, out)
            self._admit(budget, out)
        return out

    def _schedule_running(self, request: Request, budget: int, out: SchedulerOutput) -> int | None:
        """Schedule a running request's next tokens, preempting others for room."""
        rid = request.request_id
        num_new = min(request.num_tokens - request.num_computed_tokens, budget)
        in_table = self.manager.num_tokens(rid)
        to_append = max(0, request.num_computed_tokens + num_new - in_table)
        while True:
            fit = self.manager.can_append(rid, to_append)
            if fit:
                result = self.manager.append(
                    rid, request.token_ids[in_table : in_table + to_append]
                )
                if result.copies:
                    self.kv_cache.copy_blocks(result.copies)
                out.chunks.append(ScheduledChunk(request, num_new))
                return num_new
            if fit.shortfall is Shortfall.CEILING:
                self.finish(request, FinishReason.CEILING)
                out.finished.append(request)
                return None
            if fit.shortfall is Shortfall.BUDGET:
                self.finish(request, FinishReason.BUDGET)
                out.finished.append(request)
                return None
            if self.reclaim is not None and self.reclaim():
                continue  # an idle context gave blocks back: no running request pays
            victim = self.running[-1]
            if victim is request and len(self.running) == 1:
                # Alone and still out of blocks: the whole cache is its budget.
                self.finish(request, FinishReason.BUDGET)
                out.finished.append(request)
                return None
            self._preempt(victim, out)
            if victim is request:
                return None

    def _preempt(self, request: Request, out: SchedulerOutput) -> None:
        self.running.remove(request)
        rid = request.request_id
        if self.allow_swap and self.manager.can_swap_out(rid):
            self.kv_cache.swap_out(self.manager.swap_out(rid))
            request.status = RequestStatus.SWAPPED
            self.swapped.append(request)
        else:
            self.manager.free(rid)
            request.num_computed_tokens = 0
            request.status = RequestStatus.WAITING
            self.waiting.append(request)
        request.num_preemptions += 1
        self.num_preemptions += 1
        out.preempted.append(request)

    def _swap_in(self, budget: int, out: SchedulerOutput) -> int:
        self.swapped.sort(key=Request.sort_key)
        for request in list(self.swapped):
            if budget <= 0 or len(self.running) >= self.max_num_seqs:
                break
            if request.held:
                continue
            rid = request.request_id
            num_held = len(self.manager.block_ids(rid))
            if not self.manager.can_swap_in(rid, self.num_reserve_blocks(request, num_held)):
                break
            self.kv_cache.swap_in(self.manager.swap_in(rid))
            self.swapped.remove(request)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            scheduled = self._schedule_running(request, budget, out)
            if scheduled is not None:
                budget -= scheduled
        return budget

    def _admit(self, budget: int, out: SchedulerOutput) -> None:
        self.waiting.sort(key=Request.sort_key)
        for request in list(self.waiting):
            if budget <= 0 or len(self.running) >= self.max_num_seqs:
                return
            if request.held:
                continue
            fit = self.admission_fit(request)
            if not fit:
                if fit.shortfall is Shortfall.POOL:
                    return  # first come, first served within a priority: no overtaking
                continue  # its budget is busy with its siblings; others may still fit
            allocation = self.manager.allocate(
                request.request_id,
                request.token_ids,
                budget=request.budget,
                ceiling_tokens=request.ceiling_tokens,
                cache_salt=request.cache_salt,
                num_shared_blocks=request.num_shared_blocks,
                prompt_hashes=self._prompt_hashes(request),
            )
            request.prompt_hashes = None  # it runs now; its tokens will grow
            if request.num_preemptions == 0:
                request.num_cached_tokens = allocation.num_cached_tokens
            request.num_computed_tokens = allocation.num_cached_tokens
            self.waiting.remove(request)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            out.chunks.append(ScheduledChunk(request, num_new))
            budget -= num_new

    def admission_fit(self, request: Request) -> Fit:
        """Whether a waiting ``request`` fits now, as admission asks it: its blocks, and
        the reserve a request joining the running ones must leave."""
        num_known = -(-request.num_tokens // self.manager.block_size)
        return self.manager.can_allocate(
            request.token_ids,
            budget=request.budget,
            ceiling_tokens=request.ceiling_tokens,
            cache_salt=request.cache_salt,
            num_shared_blocks=request.num_shared_blocks,
            num_reserve_blocks=self.num_reserve_blocks(request, num_known),
            prompt_hashes=self._prompt_hashes(request),
        )

    def _prompt_hashes(self, request: Request) -> list[bytes]:
        """The request's prefix-cache hashes (``BlockManager.prompt_hashes``), made once
        for as many steps as it waits with the same tokens."""
        kept = request.prompt_hashes
        if kept is not None and kept[0] == request.num_tokens:
            return kept[1]
        hashes = self.manager.prompt_hashes(
            request.token_ids,
            cache_salt=request.cache_salt,
            num_shared_blocks=request.num_shared_blocks,
            checked=True,  # by Engine.add_request
        )
        request.prompt_hashes = (request.num_tokens, hashes)
        return hashes

    def num_reserve_blocks(self, request: Request, num_blocks: int) -> int:
        """Free blocks a request joining the running ones must leave beyond the
        ``num_blocks`` it will hold: its next sampled token's, and the watermark."""
        if not self.running:
            return 0
        block_size = self.manager.block_size
        next_step = -(-(request.num_tokens + 1) // block_size) - num_blocks
        return max(0, next_step) + self.num_watermark_blocks

    def offload(self, request: Request) -> None:
        """Swap a running request out now and hold it there until ``restore``."""
        if request.status is RequestStatus.RUNNING:
            fit = self.manager.can_swap_out(request.request_id)
            if not fit:
                raise OutOfSwapSpaceError(fit.needed, fit.available)
            self.kv_cache.swap_out(self.manager.swap_out(request.request_id))
            self.running.remove(request)
            request.status = RequestStatus.SWAPPED
            self.swapped.append(request)
        request.held = True

    def restore(self, request: Request) -> None:
        """Release the hold; swap back in now when it fits, else when room frees up."""
        request.held = False
        rid = request.request_id
        if request.status is not RequestStatus.SWAPPED:
            return
        reserve = self.num_reserve_blocks(request, len(self.manager.block_ids(rid)))
        if self.manager.can_swap_in(rid, reserve):
            self.kv_cache.swap_in(self.manager.swap_in(rid))
            self.swapped.remove(request)
            request.status = RequestStatus.RUNNING
            self.running.append(request)

    def finish(self, request: Request, reason: FinishReason) -> None:
        """End a request and return all of its blocks at once."""
        if request.status is RequestStatus.FINISHED:
            return
        queue = {
            RequestStatus.WAITING: self.waiting,
            RequestStatus.RUNNING: self.running,
            RequestStatus.SWAPPED: self.swapped,
        }[request.status]
        queue.remove(request)
        if request.request_id in self.manager:
            request.context_hashes = self.manager.computed_hashes(request.request_id)
            self.manager.free(request.request_id)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
