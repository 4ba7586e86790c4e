"""``ModelCalls``: model calls within a lease, between the lease and the backend.

``complete`` / ``acomplete`` / ``astream`` resume a parked lease, put the agent's shared
prefix first, compact the conversation by the ceiling policy when the call and its
reply's reserve would not fit, have the lease's budget open and its held KV back
(``LeaseLifecycle.before_call``), and record usage and events.

``acomplete`` and ``astream`` compact on a worker thread (counting and summarizing may
take long) and prepare the lease with ``abefore_call``: an event loop never waits on the
engine or the network, and other agents' coroutines run meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from typing import Any

from governor.backend import (
    Backend,
    GenerationChunk,
    GenerationRequest,
    GenerationResult,
    Message,
)
from governor.ceiling import CeilingPolicy, CompactionEvent, RaiseAtCeiling
from governor.clock import Clock
from governor.config import GovernorConfig
from governor.errors import BackendError, CeilingExceeded, ConfigError, LeaseReleased
from governor.events import LeaseEvents, error_name
from governor.lease import Lease, LeaseState
from governor.lifecycle import LeaseLifecycle
from governor.prefixes import PrefixRegistry
from governor.tokens import TokenCounter

__all__ = ["ModelCalls"]


class ModelCalls:
    def __init__(
        self,
        *,
        lifecycle: LeaseLifecycle,
        backend: Backend,
        prefixes: PrefixRegistry,
        ceiling: CeilingPolicy | None,  # None: each lease's RaiseAtCeiling
        counter: TokenCounter,
        config: GovernorConfig,
        events: LeaseEvents,
        clock: Clock,
    ) -> None:
        self.lifecycle = lifecycle
        self.backend = backend
        self.prefixes = prefixes
        self.ceiling = ceiling
        self.counter = counter
        self.config = config
        self.events = events
        self.clock = clock

    # -- model calls ----------------------------------------------------------------
    def complete(
        self, lease: Lease, messages: Sequence[Message], **options: Any
    ) -> GenerationResult:
        """Serves ``Governor.complete``, where its contract is written."""
        self.lifecycle.resume(lease)
        request = self._prepare_call(lease, messages, options)
        started = self._call_started(lease, request)
        try:
            result = self.backend.generate(request)
        except BaseException as exc:
            self._call_failed(lease, started, exc)
            if isinstance(exc, BackendError):  # its budget may have gone with its lease
                self.lifecycle.raise_if_expired(lease, exc)
            raise
        return self._record(lease, result, started)

    async def acomplete(
        self, lease: Lease, messages: Sequence[Message], **options: Any
    ) -> GenerationResult:
        await self.lifecycle.aresume(lease)
        request = await self._aprepare_call(lease, messages, options)
        started = self._call_started(lease, request)
        try:
            result = await self.backend.agenerate(request)
        except BaseException as exc:
            self._call_failed(lease, started, exc)
            if isinstance(exc, BackendError):
                await self.lifecycle.araise_if_expired(lease, exc)
            raise
        return self._record(lease, result, started)

    async def astream(
        self, lease: Lease, messages: Sequence[Message], **options: Any
    ) -> AsyncGenerator[GenerationChunk, None]:
        """Serves ``Governor.astream``, where its contract is written."""
        await self.lifecycle.aresume(lease)
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
                if isinstance(exc, BackendError):
                    await self.lifecycle.araise_if_expired(lease, exc)
            raise
        if not finished:  # pragma: no cover - a backend whose stream ends without a result
            self._call_failed(lease, started, None)

    def _prepare_call(
        self, lease: Lease, messages: Sequence[Message], options: dict[str, Any]
    ) -> GenerationRequest:
        request = self._request(lease, messages, options)
        self.lifecycle.before_call(lease)
        return request

    async def _aprepare_call(
        self, lease: Lease, messages: Sequence[Message], options: dict[str, Any]
    ) -> GenerationRequest:
        request = await asyncio.to_thread(self._request, lease, messages, options)
        await self.lifecycle.abefore_call(lease)
        return request

    def _call_started(self, lease: Lease, request: GenerationRequest) -> float:
        self.events.publish("call.started", lease, max_tokens=request.max_tokens)
        return self.clock.now()

    def _call_failed(self, lease: Lease, started: float, error: BaseException | None) -> None:
        reason = "no result" if error is None else error_name(error)
        elapsed_s = self.clock.now() - started
        self.events.publish("call.failed", lease, error=reason, elapsed_s=elapsed_s)

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
            retain=self.lifecycle.holds_at_finish,
            **options,
        )

    def with_prefix(
        self, lease: Lease, messages: Sequence[Message]
    ) -> tuple[Sequence[Message], str | None]:
        """Serves ``Governor.with_prefix``, where its contract is written."""
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
        """Serves ``Governor.record_call``, where its contract is written."""
        for name, value in (
            ("prompt_tokens", prompt_tokens),
            ("completion_tokens", completion_tokens),
            ("cached_tokens", cached_tokens),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError.below_minimum(name, value, 0)
        result = GenerationResult(
            "", (), finish_reason, prompt_tokens, completion_tokens, cached_tokens
        )
        self._record(lease, result, self.clock.now() - elapsed_s)

    def _record(self, lease: Lease, result: GenerationResult, started: float) -> GenerationResult:
        lease.tokens_in_context = result.prompt_tokens + result.completion_tokens
        lease.retained_at_finish = result.retained_tokens
        lease.num_calls += 1
        self.events.publish(
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
        """Serves ``Governor.compact``, where its contract is written."""
        messages, _ = self.with_prefix(lease, messages)
        return self._compact(lease, messages, self.reply_reserve(lease, max_tokens))

    def _compact(
        self, lease: Lease, messages: Sequence[Message], reserve: int
    ) -> tuple[list[dict[str, Any]], CompactionEvent]:
        policy = self.ceiling or RaiseAtCeiling(agent=lease.agent.name, clock=self.clock)
        compacted, event = policy.compact(
            messages,
            ceiling_tokens=lease.ceiling_tokens,
            reserve_tokens=reserve,
            counter=self.counter,
        )
        if event.changed:
            lease.num_compactions += 1
            lease.tokens_compacted += event.tokens_saved
            self.events.publish("compacted", lease, record=event)
        return compacted, event

    def reply_reserve(self, lease: Lease, max_tokens: int | None = None) -> int:
        """Serves ``Governor.reply_reserve``, where its contract is written."""
        if max_tokens is not None:
            if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
                raise ConfigError.below_minimum("max_tokens", max_tokens, 1)
            return max_tokens
        return min(self.config.reply_reserve_tokens, max(1, lease.ceiling_tokens // 4))
