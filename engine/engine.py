"""The engine: requests in, tokens out, every KV block accounted for.

``Engine`` is synchronous and single-threaded: one caller owns it and drives
``step()``. Many agents share one engine through ``EngineLoop``, which owns an engine
on one thread and takes requests from any thread or event loop.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import fields, replace

from engine import decode_run
from engine.assembly import assemble
from engine.block_results import PinnedPrefix
from engine.budget import BudgetInfo
from engine.config import EngineConfig
from engine.decode_run import DecodeRun
from engine.errors import (
    BudgetExceededError,
    CeilingExceededError,
    InvalidRequestError,
    OutOfBlocksError,
    OutOfSwapSpaceError,
    SequenceStateError,
    UnknownSequenceError,
)
from engine.introspection import Introspection
from engine.outputs import (
    Capacity,
    Completion,
    EngineMetrics,
    EngineSnapshot,
    KVSnapshot,
    RequestOutput,
)
from engine.pending_restores import PendingRestores
from engine.prefill_counter import PrefillCounter
from engine.request import FinishReason, Request, RequestStatus
from engine.retention import Context, RetainedContexts
from engine.sampling import SamplingParams, request_generator
from engine.stop import TokenStopChecker
from engine.validation import monotonic_or_now

__all__ = ["Engine"]


class Engine:
    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config = config or EngineConfig()
        parts = assemble(config)
        self.device, self.dtype = parts.device, parts.dtype
        self.attention = parts.attention
        self.model_config = parts.model_config
        self.model = parts.model
        self.tokenizer = parts.tokenizer
        self.max_model_len = parts.max_model_len
        self.host_swap = parts.host_swap
        self.kv_cache = parts.kv_cache
        self.block_manager = parts.block_manager
        self.scheduler = parts.scheduler
        self.runner = parts.runner
        self.retained = RetainedContexts(self.block_manager, self.kv_cache)
        self.pending = PendingRestores(self.retained)
        self.scheduler.reclaim = self._reclaim_hold
        self._requests: dict[str, Request] = {}
        self._stops: dict[str, TokenStopChecker] = {}
        self._arrivals = itertools.count()
        self._prefix_ids = itertools.count()
        self.prefill = PrefillCounter()
        # Every time the engine reads: request arrivals, first tokens, finishes and the
        # default order time. Monotonic seconds; the hardware twin puts its virtual clock
        # here (``engine.twin.attach_twin``), so a twin run's figures are virtual time.
        self.clock: Callable[[], float] = time.monotonic
        self._introspection = Introspection(
            block_manager=self.block_manager,
            scheduler=self.scheduler,
            kv_cache=self.kv_cache,
            retained=self.retained,
            prefill=self.prefill,
            requests=self._requests,
            max_model_len=self.max_model_len,
        )

    @classmethod
    def from_pretrained(cls, path_or_preset: str = "tiny-random", **overrides: object) -> Engine:
        """An engine for a preset or a local folder; ``overrides`` are EngineConfig fields."""
        unknown = sorted(set(overrides) - {f.name for f in fields(EngineConfig)})
        if unknown:
            valid = ", ".join(f.name for f in fields(EngineConfig))
            raise InvalidRequestError(f"unknown engine settings {unknown}; valid ones: {valid}")
        config = replace(EngineConfig(), model=path_or_preset, **overrides)  # type: ignore[arg-type]  # names checked above
        return cls(config)

    # -- requests -------------------------------------------------------------------
    def add_request(
        self,
        prompt: str | Sequence[int],
        sampling: SamplingParams | None = None,
        *,
        request_id: str | None = None,
        ceiling_tokens: int | None = None,
        budget: str | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        retain: bool = False,
        order_time: float | None = None,
    ) -> str:
        """Queue a request; refuse it at once (typed error) if it can never fit. ``retain``
        (with a budget): hold its context in the step that ends it. ``order_time`` (a
        reading of ``self.clock``, ``time.monotonic`` unless a twin is attached; default
        now) orders it within its priority: a runtime passes its program's start, so older
        programs go first (Continuum's order)."""
        sampling = sampling or SamplingParams()
        order_time = monotonic_or_now("order_time", order_time, now=self.clock)
        if retain and budget is None:
            raise InvalidRequestError("retain holds a budget's context: set budget too")
        token_ids = self._token_ids(prompt)
        request_id = request_id if request_id is not None else f"req-{next(self._arrivals)}"
        if request_id in self._requests:
            raise InvalidRequestError(f"request id {request_id!r} is in use; pick another")
        ceiling = min(ceiling_tokens or self.max_model_len, self.max_model_len)
        if len(token_ids) >= ceiling:
            raise CeilingExceededError(request_id, len(token_ids) + 1, ceiling)
        num_blocks = math.ceil(len(token_ids) / self.config.block_size)
        if budget is not None:
            info = self.block_manager.budgets.get(budget).info()
            if num_blocks > info.max_blocks:
                raise BudgetExceededError(budget, num_blocks, info.max_blocks, info.max_blocks)
        capacity = self.block_manager.pool.num_blocks - self.block_manager.pool.num_pinned
        if num_blocks > capacity:
            raise OutOfBlocksError(num_blocks, capacity)
        generator = request_generator(sampling, device=self.device)
        request = Request(
            request_id=request_id,
            token_ids=token_ids,
            num_prompt_tokens=len(token_ids),
            sampling=sampling,
            arrival=next(self._arrivals),
            priority=priority,
            order_time=order_time,
            ceiling_tokens=ceiling,
            budget=budget,
            cache_salt=cache_salt,
            num_shared_blocks=self._num_shared_blocks(token_ids, cache_salt),
            generator=generator,
            retain=retain,
            arrival_time=self.clock(),
        )
        # An offloaded context comes back before the request is allocated (it waits for room).
        if budget is not None and not self.retained.restore(budget):
            self.pending.add(budget, request)
        self._requests[request_id] = request
        previous = self.retained.latest(budget) if budget is not None else None
        if previous is not None:
            self._compare(request, previous)
        else:
            self.prefill.arrived(request_id, token_ids, None)
        self._stops[request_id] = TokenStopChecker(self.tokenizer, sampling)
        self.scheduler.add(request)
        return request_id

    def _compare(self, request: Request, previous: Context) -> None:
        """A budget's next request, against its latest context: the tokens it repeats
        count as recomputed where computed again (``prefill``), and the hashes of the
        full blocks among them are that context's, not made again."""
        repeated = self.prefill.arrived(request.request_id, request.token_ids, previous.token_ids)
        same_keys = (previous.cache_salt, previous.num_shared_blocks) == (
            request.cache_salt,
            request.num_shared_blocks,
        )
        if not same_keys or not previous.hashes or not self.block_manager.enable_prefix_caching:
            return
        known = previous.hashes[: repeated // self.config.block_size]
        hashes = self.block_manager.prompt_hashes(
            request.token_ids,
            cache_salt=request.cache_salt,
            num_shared_blocks=request.num_shared_blocks,
            known=known,
            checked=True,  # by _token_ids
        )
        request.prompt_hashes = (request.num_tokens, hashes)  # as the scheduler keeps them

    def _token_ids(self, prompt: str | Sequence[int]) -> list[int]:
        token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not token_ids:
            raise InvalidRequestError("the prompt is empty; send at least one token")
        vocab = self.model_config.vocab_size
        if set(map(type, token_ids)) == {int} and min(token_ids) >= 0 and max(token_ids) < vocab:
            return token_ids  # in C: an agent's 16k-token prompt arrives at every call
        bad = [
            t
            for t in token_ids
            if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab
        ]
        if bad:
            raise InvalidRequestError(
                f"token ids must be ints in 0..{vocab - 1} for this model; got {bad[:5]}"
                + (
                    " (the tokenizer's vocabulary is larger than the model's)"
                    if isinstance(prompt, str)
                    else ""
                )
            )
        return token_ids

    def abort(self, request_id: str) -> None:
        """End a request now and return every block it holds."""
        request = self._request(request_id)
        self.scheduler.finish(request, FinishReason.ABORT)
        request.finish_time = self.clock()

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    def step(self) -> list[RequestOutput]:
        """Run one batch: schedule, compute, sample, and report what changed."""
        if self.pending:
            self.pending.try_restore(self.scheduler.waiting)
        scheduled = self.scheduler.schedule()
        if self.retained.held_budgets():
            self._hand_over_retained([chunk.request for chunk in scheduled.chunks])
            scheduler = self.scheduler
            queued = (*scheduler.waiting, *scheduler.swapped)
            stalled = not scheduled.chunks and not scheduler.running
            if stalled and any(not request.held for request in queued):
                # Held contexts fill the pool and nothing can run: a hold is an optimization,
                # never a reason to stall. One goes to host memory (``_reclaim_hold``).
                self._reclaim_hold(stalled=True)
            elif stalled and self.pending and not self._reclaim_hold():
                self.pending.give_up_oldest()  # nothing else can make room for it
        sampled = self.runner.execute(scheduled.chunks)
        outputs: list[RequestOutput] = []
        now = self.clock()
        for chunk, token in zip(scheduled.chunks, sampled, strict=True):
            request = chunk.request
            self.prefill.computed(
                request.request_id,
                request.num_computed_tokens,
                chunk.num_tokens,
                request.num_prompt_tokens,
            )
            request.num_computed_tokens += chunk.num_tokens
            self.block_manager.mark_computed(request.request_id, request.num_computed_tokens)
            if token is None:
                continue
            if request.first_token_time is None:
                request.first_token_time = now
            request.token_ids.append(token)
            outputs.append(self._advance(request, token))
        for request in scheduled.finished:
            request.finish_time = now
            outputs.append(self._final_output(request, ()))
        return outputs

    def plan_decode_run(self, token: int) -> DecodeRun | None:
        """The steps ahead in which every running request only decodes, each sampling
        ``token``, and nothing else can happen; None when the next step is not one. For a
        run that knows its tokens before they are sampled (``engine.decode_run``)."""
        pending = self.pending.would_restore(self.scheduler.waiting)
        return decode_run.plan(self.scheduler, self._stops, token, pending=pending)

    def take_decode_run(self, run: DecodeRun, num_steps: int, token: int) -> list[RequestOutput]:
        """Make ``num_steps`` of ``run``'s steps in one pass, as that many ``step()`` calls
        would (``engine.decode_run``); each request's new tokens in one output."""

        def hand_over(requests: Sequence[Request]) -> None:
            if self.retained.held_budgets():
                self._hand_over_retained(requests)

        return decode_run.take(
            run,
            num_steps,
            token,
            manager=self.block_manager,
            prefill=self.prefill,
            stops=self._stops,
            hand_over=hand_over,
        )

    def _reclaim_hold(self, *, stalled: bool = False) -> bool:
        """A request is short of blocks: a hold gives its blocks back before any running
        request is preempted (``RetainedContexts.reclaim``: to host memory when there is
        room, else it ends; its blocks stay cached either way). ``stalled``: nothing runs
        and the queue's head cannot be admitted; its own hold is ended, not moved."""
        if not self.retained.held_budgets():
            return False
        waiting = sorted(self.scheduler.waiting, key=Request.sort_key)
        queued = [r.budget for r in waiting if r.budget is not None]
        head = next((r.budget for r in waiting if not r.held), None) if stalled else None
        budget = self.retained.reclaim(queued=list(dict.fromkeys(queued)), end=head)
        if budget in queued:  # its next request waits for it to come back, in its turn
            self.pending.moved(budget, self.scheduler.waiting)
        return budget is not None

    def _hand_over_retained(self, requests: Sequence[Request]) -> None:
        """A retained context's hold ends once its budget's next request is allocated:
        that request holds the blocks now."""
        held = self.retained.held_budgets()
        for request in requests:
            budget = request.budget
            if budget in held:
                self.retained.release(budget)

    def _advance(self, request: Request, token: int) -> RequestOutput:
        result = self._stops[request.request_id].push(token)
        new_text = result.text
        request.output_text += new_text
        request.stop_text = result.stop_string
        sampling = request.sampling
        reason = FinishReason.STOP if result.stopped else None
        ceiling = request.ceiling_tokens  # add_request sets one (the model's length at most)
        if reason is None:
            if request.num_output_tokens >= sampling.max_tokens:
                reason = FinishReason.LENGTH
            elif ceiling is not None and request.num_tokens >= ceiling:
                reason = FinishReason.CEILING
        if reason is None:
            return RequestOutput(request.request_id, (token,), new_text, False, None)
        self.scheduler.finish(request, reason)
        request.finish_time = self.clock()
        if request.retain:
            assert request.budget is not None  # add_request refuses retain without one
            self._record(request, request.budget)
            self.retained.retain(request.budget)
        return self._final_output(request, (token,), new_text)

    def _record(self, r: Request, budget: str) -> None:  # its latest context: what retain holds
        self.retained.record(
            budget,
            r.token_ids,
            r.cache_salt,
            r.num_shared_blocks,
            r.context_hashes,
        )

    def _final_output(
        self, request: Request, tokens: tuple[int, ...], new_text: str = ""
    ) -> RequestOutput:
        tail = self._stops[request.request_id].flush()
        request.output_text += tail
        return RequestOutput(
            request.request_id, tokens, new_text + tail, True, request.finish_reason
        )

    def generate(
        self,
        prompts: str | Sequence[int] | Sequence[str | Sequence[int]],
        sampling: SamplingParams | None = None,
        **options: object,
    ) -> list[Completion]:
        """Run a batch of prompts to completion, continuously batched with whatever else
        is queued; completions come back in prompt order."""
        batch = [prompts] if _is_single_prompt(prompts) else list(prompts)
        ids = [self.add_request(prompt, sampling, **options) for prompt in batch]  # type: ignore[arg-type]  # each a prompt, as split above
        pending = set(ids)
        while pending:
            for output in self.step():
                if output.finished:
                    pending.discard(output.request_id)
        return [self.pop_completion(request_id) for request_id in ids]

    def pop_completion(self, request_id: str) -> Completion:
        """The finished request's completion; the engine forgets the request."""
        request = self._request(request_id)
        if request.status is not RequestStatus.FINISHED:
            raise SequenceStateError(request_id, request.status.value, "collect", "step() on")
        del self._requests[request_id]
        del self._stops[request_id]
        self.prefill.forget(request_id)
        budget = request.budget
        if budget is not None:
            self._record(request, budget)
        assert request.finish_reason is not None  # set when it finished
        # 0 where the hold gave way already (``reclaim``)
        retained = self.retained.num_tokens(budget) if request.retain and budget is not None else 0
        ttft = None
        if request.first_token_time is not None:
            ttft = request.first_token_time - request.arrival_time
        return Completion(
            request_id=request_id,
            prompt_token_ids=tuple(request.token_ids[: request.num_prompt_tokens]),
            token_ids=tuple(request.output_token_ids),
            text=request.output_text,
            finish_reason=request.finish_reason,
            stop_string=request.stop_text,
            num_cached_tokens=request.num_cached_tokens,
            num_preemptions=request.num_preemptions,
            time_to_first_token_s=ttft,
            latency_s=(request.finish_time or self.clock()) - request.arrival_time,
            num_retained_tokens=retained,
        )

    def _request(self, request_id: str) -> Request:
        try:
            return self._requests[request_id]
        except KeyError:
            raise UnknownSequenceError(request_id) from None

    # -- budgets, prefixes, offload -----------------------------------------------------
    def open_budget(self, name: str, max_blocks: int) -> BudgetInfo:
        return self.block_manager.budgets.open(name, max_blocks=max_blocks)

    def resize_budget(self, name: str, max_blocks: int) -> BudgetInfo:
        return self.block_manager.budgets.resize(name, max_blocks=max_blocks)

    def close_budget(self, name: str) -> None:
        self.block_manager.budgets.close(name)
        self.retained.forget(name)

    def retain(self, budget: str) -> int:
        """Keep the K/V of the budget's latest finished request resident until its next
        request (or ``release_retained``): an agent waiting on a short tool call keeps its
        context instead of letting it be evicted. Holds only blocks still cached; returns
        the tokens held. ``offload``/``restore`` by budget move it to host and back."""
        self.block_manager.budgets.get(budget)
        return self.retained.retain(budget)

    def release_retained(self, budget: str) -> None:
        """End ``retain``: the blocks stay in the prefix cache, evictable again."""
        self.retained.release(budget)

    def pin_prefix(
        self,
        prefix: str | Sequence[int],
        *,
        cache_salt: str | None = None,
        shared: bool = False,
    ) -> PinnedPrefix:
        """Compute a shared prefix (system prompt, tool schemas) once and pin its full
        blocks: every later request that starts with it, with the same ``cache_salt``,
        reuses them. ``shared``: hashed unsalted, so requests of every salt reuse them
        (each salt's own blocks start right after; see ``engine.prefix_hash``)."""
        if shared and cache_salt is not None:
            raise InvalidRequestError(
                "a shared prefix is hashed with no salt, so every salt's requests reuse it: "
                "pass shared=True or a cache_salt, not both"
            )
        token_ids = self._token_ids(prefix)
        seq_id = f"__prefix-{next(self._prefix_ids)}"
        allocation = self.block_manager.allocate(
            seq_id,
            token_ids,
            cache_salt=cache_salt,
            num_shared_blocks=self._num_shared_blocks(token_ids, cache_salt),
        )
        try:
            start = allocation.num_cached_tokens
            self.runner.forward(
                [(token_ids, start, len(token_ids) - start, list(allocation.block_ids))]
            )
            self.prefill.pinned(len(token_ids) - start)
            self.block_manager.mark_computed(seq_id, len(token_ids))
            return self.block_manager.pin(seq_id, shared=shared)
        finally:
            self.block_manager.free(seq_id)

    def _num_shared_blocks(self, token_ids: Sequence[int], cache_salt: str | None) -> int:
        """A salted prompt's leading blocks that are a shared pin's: fixed once, at
        arrival, so its chain stays the same through preemption and retention."""
        if cache_salt is None or not self.config.enable_prefix_caching:
            return 0
        return self.block_manager.num_shared_blocks(token_ids)

    def unpin(self, prefix: PinnedPrefix) -> None:
        self.block_manager.unpin(prefix)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix no request, hold or pin is using, so the next
        requests compute their prompts cold (a benchmark's cold run, a weights change).
        True when the cache is empty afterwards; running requests, retained contexts
        and pinned prefixes keep theirs (False)."""
        return self.block_manager.reset_prefix_cache()

    def offload(self, request_id: str | None = None, *, budget: str | None = None) -> None:
        """Move a request's KV (or that of every request in a budget) to host memory now,
        and keep it there until ``restore``: an agent parked on a tool call frees its
        device blocks without losing its context."""
        targets = self._targets(request_id, budget)
        running = [r for r in targets if r.status is RequestStatus.RUNNING]
        needed = sum(len(self.block_manager.block_ids(r.request_id)) for r in running)
        if budget is not None:
            needed += self.retained.num_host_blocks_needed(budget)
        available = self.block_manager.host_pool.num_free_blocks
        if needed > available:  # all or nothing: no budget is left half offloaded
            raise OutOfSwapSpaceError(needed, available)
        for request in targets:
            self.scheduler.offload(request)
        if budget is not None:
            self.retained.offload(budget)

    def restore(self, request_id: str | None = None, *, budget: str | None = None) -> None:
        """Bring offloaded KV back (now if it fits, else as soon as room frees up; a
        retained context that does not fit yet comes back with the budget's next request)."""
        for request in self._targets(request_id, budget):
            self.scheduler.restore(request)
        if budget is not None:
            self.retained.restore(budget)

    def _targets(self, request_id: str | None, budget: str | None) -> list[Request]:
        if request_id is not None and budget is None:
            return [self._request(request_id)]
        if request_id is not None or budget is None:
            raise InvalidRequestError("name exactly one of request_id and budget")
        self.block_manager.budgets.get(budget)
        return [r for r in self._requests.values() if r.budget == budget and not r.is_finished]

    # -- introspection (engine.introspection; read-only, between two steps) -------------
    def capacity(self) -> Capacity:
        return self._introspection.capacity()

    def metrics(self) -> EngineMetrics:
        return self._introspection.metrics()

    def kv_snapshot(self) -> KVSnapshot:
        """Each open budget's blocks (on the device and offloaded), the pinned prefixes'
        blocks and the pool's counts, read together between two steps."""
        return self._introspection.kv_snapshot()

    def snapshot(self) -> EngineSnapshot:
        """Metrics, capacity, the KV map and the unfinished requests, read together between
        two steps: one instant, so a live view's figures agree."""
        return self._introspection.snapshot()


def _is_single_prompt(prompts: object) -> bool:
    if isinstance(prompts, str):
        return True
    return isinstance(prompts, Sequence) and bool(prompts) and isinstance(prompts[0], int)
