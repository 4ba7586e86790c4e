"""Model calls within a lease: the part of ``Governor`` between a lease and the backend.

``complete`` / ``acomplete`` / ``astream`` resume a parked lease, put the agent's shared
prefix first, compact the conversation by the ceiling policy when the call and its
reply's reserve would not fit, open the lease's engine budget at its first call, bring
its held KV back, and record usage and events. ``Governor`` inherits these; they use its
backend, counter, config, policies, idle keeper and event publisher.

``acomplete`` and ``astream`` compact on a worker thread (counting and summarizing may
take long), open the lease's budget with the backend's ``aopen_budget`` (I/O of its own
for a remote backend, a worker thread in process) and bring held KV back on a worker
thread (the idle keeper's lock is for threads only): an event loop never waits on the
engine or the network, and other agents' coroutines run meanwhile.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

from governor.backend import GenerationChunk, GenerationRequest, GenerationResult, Message
from governor.ceiling import CompactionEvent, RaiseAtCeiling
from governor.errors import CeilingExceeded, ConfigError, LeaseReleased
from governor.events import error_name
from governor.lease import Lease, LeaseState

if TYPE_CHECKING:
    from governor.backend import Backend
    from governor.clock import Clock
    from governor.config import GovernorConfig
    from governor.idle import IdleKeeper
    from governor.policy_set import Policies
    from governor.prefixes import PrefixRegistry
    from governor.tokens import TokenCounter

__all__ = ["ModelCalls"]


class ModelCalls:
    """Mixed into ``Governor``; the attributes below, and ``resume``, ``aresume`` and
    ``_publish``, are the governor's."""

    backend: Backend
    clock: Clock
    config: GovernorConfig
    counter: TokenCounter
    policies: Policies
    idle: IdleKeeper
    prefixes: PrefixRegistry
    _lock: threading.Lock
    _budgets_open: set[str]

    # -- model calls ----------------------------------------------------------------
    def complete(
        self, lease: Lease, messages: Sequence[Message], **options: Any
    ) -> GenerationResult:
        """One model call within the lease (resumed first if it was parked; compacted by
        the ceiling policy when it would not fit; its held KV restored)."""
        self.resume(lease)
        request = self._prepare_call(lease, messages, options)
        started = self._call_started(lease, request)
        try:
            result = self.backend.generate(request)
        except BaseException as exc:
            self._call_failed(lease, started, exc)
            raise
        return self._record(lease, result, started)

    async def acomplete(
        self, lease: Lease, messages: Sequence[Message], **options: Any
    ) -> GenerationResult:
        await self.aresume(lease)
        request = await self._aprepare_call(lease, messages, options)
        started = self._call_started(lease, request)
        try:
            result = await self.backend.agenerate(request)
        except BaseException as exc:
            self._call_failed(lease, started, exc)
            raise
        return self._record(lease, result, started)

    async def astream(
        self, lease: Lease, messages: Sequence[Message], **options: Any
    ) -> AsyncIterator[GenerationChunk]:
        """A streamed model call within the lease; usage is recorded from the last chunk."""
        await self.aresume(lease)
        request = await self._aprepare_call(lease, messages, options)
        started = self._call_started(lease, request)
        finished = False
        try:
            # Closed here, not left to the garbage collector: a consumer that stops early
            # must have its call aborted (and its blocks back) before the lease ends.
            async with aclosing(self.backend.astream(request)) as chunks:
                async for chunk in chunks:
                    if chunk.result is not None:
                        finished = True
                        self._record(lease, chunk.result, started)
                    yield chunk
        except BaseException as exc:
            if not finished:
                self._call_failed(lease, started, exc)
            raise
        if not finished:  # pragma: no cover - a backend whose stream ends without a result
            self._call_failed(lease, started, None)

    def _prepare_call(
        self, lease: Lease, messages: Sequence[Message], options: dict[str, Any]
    ) -> GenerationRequest:
        """The request, the lease's budget open and its held KV back (it may wait on the
        engine: a worker thread's work on an event loop)."""
        request = self._request(lease, messages, options)
        if not self._budget_is_open(lease):
            self.backend.open_budget(lease.budget, max_blocks=lease.blocks_reserved)
            if not self._budget_opened(lease):
                self.backend.close_budget(lease.budget)
                raise LeaseReleased(lease.lease_id, agent=lease.agent.name)
        if self.idle.has_work_before_call(lease):
            self.idle.before_call(lease)
        return request

    async def _aprepare_call(
        self, lease: Lease, messages: Sequence[Message], options: dict[str, Any]
    ) -> GenerationRequest:
        """``_prepare_call`` for an event loop: the budget opens with ``aopen_budget``."""
        request = await asyncio.to_thread(self._request, lease, messages, options)
        if not self._budget_is_open(lease):
            # Shielded: a caller cancelled while the budget opens must still have it
            # marked open (and closed at release), or closed here when released meanwhile.
            opening = asyncio.ensure_future(self._aopen_budget(lease))
            opening.add_done_callback(_retrieved)
            await asyncio.shield(opening)
        if self.idle.has_work_before_call(lease):
            await asyncio.to_thread(self.idle.before_call, lease)
        return request

    async def _aopen_budget(self, lease: Lease) -> None:
        await self.backend.aopen_budget(lease.budget, max_blocks=lease.blocks_reserved)
        if not self._budget_opened(lease):
            await self.backend.aclose_budget(lease.budget)
            raise LeaseReleased(lease.lease_id, agent=lease.agent.name)

    def _budget_is_open(self, lease: Lease) -> bool:
        with self._lock:
            return lease.budget in self._budgets_open

    def _budget_opened(self, lease: Lease) -> bool:
        """Mark the lease's new budget open; False when the lease was released meanwhile
        (by another thread or task, which found no budget to close: the caller closes it)."""
        with self._lock:
            if lease.released_at is not None:
                return False
            self._budgets_open.add(lease.budget)
            return True

    def _call_started(self, lease: Lease, request: GenerationRequest) -> float:
        self._publish("call.started", lease, max_tokens=request.max_tokens)
        return self.clock.now()

    def _call_failed(self, lease: Lease, started: float, error: BaseException | None) -> None:
        reason = "no result" if error is None else error_name(error)
        self._publish("call.failed", lease, error=reason, elapsed_s=self.clock.now() - started)

    def _request(
        self, lease: Lease, messages: Sequence[Message], options: dict[str, Any]
    ) -> GenerationRequest:
        if lease.state is LeaseState.RELEASED:
            raise LeaseReleased(lease.lease_id, agent=lease.agent.name)
        messages, salt = self.with_prefix(lease, messages)
        messages, event = self._compact(
            lease, messages, self.reply_reserve(lease, options.get("max_tokens"))
        )
        prompt_tokens = event.tokens_after
        if prompt_tokens >= lease.ceiling_tokens:  # a policy that broke its contract
            raise CeilingExceeded(lease.agent.name, prompt_tokens, lease.ceiling_tokens)
        room = lease.ceiling_tokens - prompt_tokens
        options["max_tokens"] = min(options.get("max_tokens", room), room)
        return GenerationRequest(
            messages=list(messages),
            ceiling_tokens=lease.ceiling_tokens,
            budget=lease.budget,
            cache_salt=salt,
            priority=lease.priority,
            order_time=lease.root_requested_at,
            retain=self.idle.holds_at_finish,
            **options,
        )

    def with_prefix(
        self, lease: Lease, messages: Sequence[Message]
    ) -> tuple[Sequence[Message], str | None]:
        """The messages a call of this lease sends (the agent's registered prefix first,
        unless they start with it already) and the cache salt it is sent with."""
        if lease.agent.prefix is None:
            return messages, lease.tenant
        prefix = self.prefixes.lookup(
            lease.agent.prefix, tenant=lease.tenant, agent=lease.agent.name
        )
        if tuple(messages[: len(prefix.messages)]) != prefix.messages:
            messages = [*prefix.messages, *messages]
        return messages, prefix.cache_salt

    def record_call(
        self,
        lease: Lease,
        *,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int = 0,
        finish_reason: str = "stop",
        elapsed_s: float = 0.0,
    ) -> None:
        """Record a model call the lease's agent made without the governor (a LangChain
        chat model of its own): its context and usage, and a ``call.finished`` event."""
        for name, value in (
            ("prompt_tokens", prompt_tokens),
            ("completion_tokens", completion_tokens),
            ("cached_tokens", cached_tokens),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError.below_minimum(name, value, 0)
        result = GenerationResult("", (), finish_reason, prompt_tokens, completion_tokens,
                                  cached_tokens)  # fmt: skip
        self._record(lease, result, self.clock.now() - elapsed_s)

    def _record(self, lease: Lease, result: GenerationResult, started: float) -> GenerationResult:
        lease.tokens_in_context = result.prompt_tokens + result.completion_tokens
        lease.retained_at_finish = result.retained_tokens
        lease.num_calls += 1
        self._publish(
            "call.finished",
            lease,
            prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens,
            cached_tokens=result.cached_tokens,
            finish_reason=result.finish_reason,
            tokens_in_context=lease.tokens_in_context,
            blocks_held=lease.blocks_live,
            elapsed_s=self.clock.now() - started,
        )
        return result

    # -- the ceiling ----------------------------------------------------------------
    def compact(
        self, lease: Lease, messages: Sequence[Message], *, max_tokens: int | None = None
    ) -> tuple[list[dict[str, Any]], CompactionEvent]:
        """The conversation the lease's next call sends (its shared prefix first),
        compacted by the ceiling policy when it and the reply's reserve (``max_tokens``,
        else ``reply_reserve_tokens`` up to a quarter of the ceiling) would not fit. Keep
        the result as the history, so later turns stay compacted."""
        messages, _ = self.with_prefix(lease, messages)
        return self._compact(lease, messages, self.reply_reserve(lease, max_tokens))

    def _compact(
        self, lease: Lease, messages: Sequence[Message], reserve: int
    ) -> tuple[list[dict[str, Any]], CompactionEvent]:
        policy = self.policies.ceiling or RaiseAtCeiling(agent=lease.agent.name, clock=self.clock)
        compacted, event = policy.compact(
            messages,
            ceiling_tokens=lease.ceiling_tokens,
            reserve_tokens=reserve,
            counter=self.counter,
        )
        if event.changed:
            lease.num_compactions += 1
            lease.tokens_compacted += event.tokens_saved
            self._publish("compacted", lease, record=event)
        return compacted, event

    def reply_reserve(self, lease: Lease, max_tokens: int | None = None) -> int:
        """Tokens kept free for the reply when checking the ceiling: ``max_tokens``
        when the call names it, else ``reply_reserve_tokens`` up to a quarter of the
        ceiling."""
        if max_tokens is not None:
            if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
                raise ConfigError.below_minimum("max_tokens", max_tokens, 1)
            return max_tokens
        return min(self.config.reply_reserve_tokens, max(1, lease.ceiling_tokens // 4))


def _retrieved(task: asyncio.Future[Any]) -> None:
    """Its outcome is read: a shielded task whose awaiter was cancelled logs no warning."""
    if not task.cancelled():
        task.exception()
