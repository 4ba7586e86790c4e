"""``FakeBackend``: a ``Backend`` for your own tests, with no model but real block accounting.

Output is scripted: ``responder(request) -> str`` when given, else one filler token
(``" hello"``) repeated ``max_tokens`` times; a script that ends early finishes
``"stop"``, as an end-of-sequence token would. Tokens are cl100k (tiktoken) ids and are
counted with ``TokenCounter``; chat messages are counted with its cookbook rule and
never hit pinned prefixes, since the fake has no chat template to render them with.

The blocks, budgets and pins are ``FakePool``'s, kept under this backend's lock. A call
that finds the pool or its budget busy waits (``Waiters``) for calls in flight to return
blocks, in ``generate`` as in ``agenerate``; calling ``generate`` on a thread whose event
loop runs those calls would hang, so it raises instead.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from contextlib import aclosing

import tiktoken

from governor.backend import (
    BackendCapacity,
    BackendHealth,
    BackendMetrics,
    GenerationChunk,
    GenerationRequest,
    GenerationResult,
    Message,
    PrefixHandle,
)
from governor.backend_async import ThreadedAsyncBookkeeping
from governor.errors import ConfigError
from governor.testing.fake_pool import NAME, Call, FakePool, block_keys, fake_error
from governor.testing.fake_waiters import Waiters
from governor.tokens import DEFAULT_ENCODING, TokenCounter

__all__ = ["FakeBackend"]

_FILLER = " hello"  # one cl100k token, and the same token however often it repeats


class FakeBackend(ThreadedAsyncBookkeeping):
    """A deterministic, model-free ``Backend`` with the engine's block accounting.

    ``calls`` records every request made, ``peak_blocks_in_use`` the most device blocks
    ever in use at once (pins included). ``latency_s`` is spent per output token
    (``time.sleep`` in ``generate``, ``asyncio.sleep`` in ``agenerate`` and ``astream``)
    so calls overlap as they would on a real engine. Thread-safe.
    """

    def __init__(
        self,
        *,
        num_blocks: int = 256,
        block_size: int = 16,
        num_host_blocks: int | None = None,
        max_model_len: int = 32_768,
        bytes_per_token: int = 2_048,  # tiny-random's K/V per token in float32
        model: str = "fake-model",
        responder: Callable[[GenerationRequest], str] | None = None,
        latency_s: float = 0.0,
    ) -> None:
        for setting, value in (
            ("num_blocks", num_blocks),
            ("block_size", block_size),
            ("max_model_len", max_model_len),
            ("bytes_per_token", bytes_per_token),
        ):
            _require_int(setting, value, minimum=1)
        num_host_blocks = num_blocks if num_host_blocks is None else num_host_blocks
        _require_int("num_host_blocks", num_host_blocks, minimum=0)
        if isinstance(latency_s, bool) or not isinstance(latency_s, (int, float)) or latency_s < 0:
            raise ConfigError(
                f"latency_s must be a number of seconds >= 0, got {latency_s!r}",
                setting="latency_s",
            )
        if responder is not None and not callable(responder):
            raise ConfigError(
                "responder must be a callable that takes a GenerationRequest and returns the "
                f"reply text, got {type(responder).__name__}",
                setting="responder",
            )
        self._bytes_per_block = bytes_per_token * block_size
        self._model = model
        self._responder = responder
        self._latency_s = float(latency_s)
        self._counter = TokenCounter(encoding=DEFAULT_ENCODING)
        self._encoding = tiktoken.get_encoding(self._counter.name.removeprefix("tiktoken:"))
        self._filler_id = self._encode(_FILLER)[0]
        self._pool = FakePool(
            num_blocks=num_blocks,
            block_size=block_size,
            num_host_blocks=num_host_blocks,
            max_model_len=max_model_len,
            encoding=self._encoding,
        )
        self._lock = threading.Lock()  # guards the pool and everything below
        self._waiters = Waiters(self._lock)
        self._requests: list[GenerationRequest] = []
        self._closed = False

    def __repr__(self) -> str:
        return f"<FakeBackend {self._pool.num_blocks} blocks of {self._pool.block_size} tokens>"

    @property
    def name(self) -> str:
        return NAME

    @property
    def model(self) -> str:
        return self._model

    @property
    def calls(self) -> list[GenerationRequest]:
        """Every request made to ``generate``, ``agenerate`` or ``astream``, in order."""
        with self._lock:
            return list(self._requests)

    @property
    def peak_blocks_in_use(self) -> int:
        with self._lock:
            return self._pool.peak

    # -- lifecycle ----------------------------------------------------------------------
    def close(self) -> None:
        """Calls in flight end with finish reason ``"abort"``; later calls raise."""
        with self._lock:
            self._closed = True
            self._pool.abort_all()
            self._waiters.notify()

    def __enter__(self) -> FakeBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- bookkeeping --------------------------------------------------------------------
    def capacity(self) -> BackendCapacity:
        with self._lock:
            self._check_open()
            return BackendCapacity(
                block_size=self._pool.block_size,
                num_blocks=self._pool.num_blocks,
                num_free_blocks=self._pool.num_free,
                num_pinned_blocks=self._pool.num_pinned,
                bytes_per_block=self._bytes_per_block,
                max_model_len=self._pool.max_model_len,
            )

    def open_budget(self, name: str, *, max_blocks: int) -> None:
        _require_blocks(max_blocks)
        with self._lock:
            self._check_open()
            self._pool.open_budget(name, max_blocks=max_blocks)

    def resize_budget(self, name: str, *, max_blocks: int) -> None:
        _require_blocks(max_blocks)
        with self._lock:
            self._check_open()
            self._pool.resize_budget(name, max_blocks=max_blocks)
            self._waiters.notify()

    def close_budget(self, name: str) -> None:
        with self._lock:
            self._check_open()
            self._pool.close_budget(name)

    def pin_prefix(
        self,
        prefix: str | Sequence[int] | Sequence[Message],
        *,
        cache_salt: str | None = None,
        shared: bool = False,
    ) -> PrefixHandle:
        if shared and cache_salt is not None:
            raise fake_error(
                "a shared prefix is hashed with no salt, so every salt's requests reuse it: "
                "pass shared=True or a cache_salt, not both"
            )
        if isinstance(prefix, str):
            token_ids = self._encode(prefix)
        elif prefix and isinstance(prefix[0], Mapping):
            # No chat template here: pin a rendering of the right length (chat calls never
            # hit pins on this backend, but the blocks are accounted for).
            messages: Sequence[Message] = prefix  # type: ignore[assignment]  # mappings: messages
            token_ids = self._encode(" ".join(str(m.get("content", "")) for m in messages))
            token_ids += [0] * max(0, self._counter.count_messages(messages) - len(token_ids))
        else:
            token_ids = list(prefix)  # type: ignore[arg-type]  # neither text nor messages: ids
        block_size = self._pool.block_size
        keys = block_keys(token_ids, block_size, cache_salt)
        if not keys:
            raise fake_error(
                f"a pinned prefix needs at least one full block of {block_size} tokens; "
                f"this one has {len(token_ids)}"
            )
        with self._lock:
            self._check_open()
            handle_key = self._pool.pin(keys, shared=shared)
        return PrefixHandle(
            key=handle_key,
            num_tokens=len(token_ids),
            num_pinned_tokens=len(keys) * block_size,
            num_blocks=len(keys),
            cache_salt=cache_salt,
            shared=shared,
        )

    def unpin_prefix(self, handle: PrefixHandle) -> None:
        with self._lock:
            self._pool.unpin(handle.key)
            self._waiters.notify()

    @property
    def counter(self) -> TokenCounter:
        return self._counter

    def count_tokens(self, text: str) -> int:
        return self._counter.count(text)

    def count_messages(self, messages: Sequence[Message]) -> int:
        return self._counter.count_messages(messages)

    def retain(self, *, budget: str) -> int:
        """Hold the blocks of the budget's latest finished call until its next call (no
        prefix cache here: the next call reports no cached tokens for them)."""
        with self._lock:
            self._check_open()
            return self._pool.retain(budget)

    def release_retained(self, *, budget: str) -> None:
        with self._lock:
            self._check_open()
            self._pool.release_retained(budget)
            self._waiters.notify()

    def offload(self, *, budget: str) -> None:
        """Swap the budget's calls in flight and its retained blocks out to host blocks
        until ``restore``."""
        with self._lock:
            self._check_open()
            self._pool.offload(budget)
            self._waiters.notify()

    def restore(self, *, budget: str) -> None:
        """Bring the budget's calls back: now if their blocks are free, else when they are."""
        with self._lock:
            self._check_open()
            self._pool.restore(budget)
            self._waiters.notify()

    def metrics(self) -> BackendMetrics:
        with self._lock:
            self._check_open()
            pool = self._pool
            return BackendMetrics(
                num_blocks_in_use=pool.num_in_use,
                num_blocks_free=pool.num_free,
                num_blocks_cached=0,
                num_blocks_pinned=pool.num_pinned,
                num_blocks_swapped=pool.num_swapped,
                num_requests_running=pool.num_running,
                num_requests_waiting=self._waiters.num_waiting,
                num_preemptions=0,
                prefix_cache_queries=pool.prefix_cache_queries,
                prefix_cache_hits=pool.prefix_cache_hits,
            )

    def health(self) -> BackendHealth:
        with self._lock:
            if self._closed:
                return BackendHealth(ok=False, detail="closed; create a new FakeBackend")
            free = self._pool.num_free
        return BackendHealth(
            ok=True,
            detail=f"fake model {self._model}; {free}/{self._pool.num_blocks} blocks of "
            f"{self._pool.block_size} tokens free",
        )

    # -- model calls --------------------------------------------------------------------
    def generate(self, request: GenerationRequest) -> GenerationResult:
        prompt_ids, num_prompt, script = self._prepare(request)
        call = self._waiters.wait(
            lambda: self._admit(request, prompt_ids, num_prompt, script), queued=True
        )
        try:
            for produced in range(len(call.plan.token_ids)):
                if self._latency_s:
                    time.sleep(self._latency_s)
                if not self._waiters.wait(lambda: self._pool.resume(call)):
                    return call.plan.result(num_prompt, produced, aborted=True)
            return call.plan.result(num_prompt, len(call.plan.token_ids))
        finally:
            self._release(call)

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        async with aclosing(self.astream(request)) as chunks:
            async for chunk in chunks:
                if chunk.result is not None:
                    return chunk.result
        raise AssertionError("a stream always ends with a chunk that has the result")

    async def astream(self, request: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
        """A chunk per token, then one with only the ``result``; a consumer that stops
        early returns the call's blocks at once."""
        prompt_ids, num_prompt, script = self._prepare(request)
        call = await self._waiters.await_(
            lambda: self._admit(request, prompt_ids, num_prompt, script), queued=True
        )
        plan = call.plan
        steps = enumerate(zip(plan.token_ids, plan.pieces, strict=True))
        try:
            for produced, (token_id, piece) in steps:
                if self._latency_s:
                    await asyncio.sleep(self._latency_s)
                if not await self._waiters.await_(lambda: self._pool.resume(call)):
                    result = plan.result(num_prompt, produced, aborted=True)
                    break
                yield GenerationChunk(piece, (token_id,))
            else:
                result = plan.result(num_prompt, len(plan.token_ids))
        finally:
            self._release(call)
        yield GenerationChunk("", (), result)

    # -- the calls' way through the pool (all under the lock but _prepare) ---------------
    def _prepare(self, request: GenerationRequest) -> tuple[list[int] | None, int, list[int]]:
        """Prompt ids (None for chat messages), prompt length, and the scripted reply ids."""
        with self._lock:
            self._requests.append(request)
            self._check_open()
        if request.messages is not None:
            prompt_ids, num_prompt = None, self._counter.count_messages(request.messages)
        else:
            prompt = request.prompt
            assert prompt is not None  # GenerationRequest holds messages or a prompt
            prompt_ids = self._encode(prompt) if isinstance(prompt, str) else list(prompt)
            num_prompt = len(prompt_ids)
        if self._responder is None:
            script = [self._filler_id] * request.max_tokens
        else:
            script = self._encode(self._responder(request))
        return prompt_ids, num_prompt, script

    def _admit(
        self,
        request: GenerationRequest,
        prompt_ids: list[int] | None,
        num_prompt: int,
        script: list[int],
    ) -> Call | None:
        self._check_open()  # a call waiting for blocks when the backend closes raises
        return self._pool.admit(request, prompt_ids, num_prompt, script)

    def _release(self, call: Call) -> None:
        with self._lock:
            self._pool.release(call)
            self._waiters.notify()

    # -- helpers ------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise fake_error("this FakeBackend is closed; create a new one")

    def _encode(self, text: str) -> list[int]:
        return self._encoding.encode(text, allowed_special="all")


def _require_int(setting: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError.below_minimum(setting, value, minimum)


def _require_blocks(max_blocks: object) -> None:
    if isinstance(max_blocks, bool) or not isinstance(max_blocks, int) or max_blocks < 0:
        raise fake_error(f"max_blocks must be an int >= 0, got {max_blocks!r}")
