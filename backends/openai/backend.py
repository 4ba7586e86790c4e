"""``OpenAICompatibleBackend``: the ``Backend`` protocol against any server with
``/v1/chat/completions`` (vLLM, SGLang, llama.cpp's llama-server, ``transformers serve``,
a hosted API), over httpx.

Such an engine has no budgets, ceilings or pins: kvgov keeps them on the client.

- Capacity: what the engine's probe reads (``EngineProbe``: vLLM's cache config,
  SGLang's ``/server_info``, llama-server's ``/props``), else what the user declared
  (``capacity``: tokens, or ``(num_blocks, block_size)``). The governor's admission
  arithmetic runs on it in blocks of ``block_size`` tokens (the engine's own where it
  has blocks). Without either, ``capacity()`` raises ``ConfigError`` saying to declare it.
- Ceilings and budgets: each call's prompt is counted with the served model's tokenizer
  (the server's ``/tokenize`` where it has one, else the local ``tokenizer`` the user
  names) and ``max_completion_tokens`` is set from what its ceiling, its budget and the
  engine's context leave (``backends.openai._limits``). A prompt that reaches one is
  refused before it is sent, as the bundled engine refuses it.
- Levers the engine lacks are no-ops: ``retain`` returns 0 (nothing is held for an agent;
  the engine's own prefix cache may still keep its prompt), ``offload``/``restore`` do
  nothing, ``pin_prefix`` pins nothing (``num_blocks`` 0). Engine subclasses add the
  levers theirs has (``LlamaCppBackend``: slots, slot save/restore).
- Metrics: from the probe; what it does not read (an engine without a KV gauge) is the
  client's own count of tokens its calls in flight reserved, and running calls.
- Errors: the engine's context-length 400 (OpenAI's and vLLM's
  ``context_length_exceeded``, llama.cpp's ``exceed_context_size_error``) raises
  ``CeilingExceededError``, never retried; an engine that cannot be reached, answers 5xx
  or restarts under a call raises ``BackendUnavailable`` (retriable).
- Restarts (a new instance, a counter going down, ``/health`` failing): noticed at the
  next call as ``RemoteBackend`` notices them (``backends.remote.restarts``); budgets
  live here and stay, state the engine held (slots) is forgotten, and the ``on_restart``
  hooks (the governor's, which drops its holds) are called.

Plain OpenAI fields only are sent (``openai_body``): some servers refuse others.
Thread-safe; async calls never wait on the network on the event loop. Imports no torch.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import aclosing
from typing import Any

import httpx

from backends.http import Reply
from backends.http.probe import EngineProbe, EngineReading
from backends.http.probe_http import TransportProbeHTTP
from backends.http.transport import HttpLifecycle, Retries, Transport
from backends.openai._engine_state import EngineState
from backends.openai._limits import Call, Limits
from backends.openai._local_counter import local_counter
from backends.openai._models_probe import ModelsProbe
from backends.remote.generation import (
    StreamState,
    openai_body,
    path_of,
    result_of,
    stream_chunks,
)
from backends.remote.restarts import Restarts
from backends.remote.session import Pin, Session
from backends.remote.tokens import RemoteTokenizer
from governor import (
    BackendCapacity,
    BackendError,
    BackendHealth,
    BackendMetrics,
    BackendUnavailable,
    ConfigError,
    GenerationChunk,
    GenerationRequest,
    GenerationResult,
    Message,
    PrefixHandle,
    TokenCounter,
)

__all__ = ["ModelsProbe", "OpenAICompatibleBackend"]


class OpenAICompatibleBackend(Restarts, HttpLifecycle):
    """The engine behind the OpenAI-compatible server at ``base_url``, serving ``model``.

    ``capacity``: the KV capacity to admit against when the probe cannot read it, in
    tokens or as ``(num_blocks, block_size)``; ``block_size``: the tokens of one block of
    the governor's arithmetic otherwise. ``max_model_len``: the context of one request,
    when the server does not say it. ``probe``: reads the engine (``ModelsProbe`` by
    default). ``tokenizer``: counts when the server has no ``/tokenize`` (a
    ``TokenCounter``, anything with ``encode(text)`` such as a transformers tokenizer,
    or a tiktoken encoding's name). ``read_interval_s``: how stale a reading may be.
    """

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        api_key: str | None = None,
        capacity: int | tuple[int, int] | None = None,
        block_size: int = 16,
        max_model_len: int | None = None,
        probe: EngineProbe | None = None,
        tokenizer: Any = None,
        timeout: float = 600.0,
        connect_timeout: float = 5.0,
        retries: Retries | None = None,
        max_connections: int = 100,
        read_interval_s: float = 0.5,
        transport: httpx.BaseTransport | None = None,
        async_transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if isinstance(capacity, tuple):
            num_blocks, block_size = capacity
            capacity = num_blocks * block_size
        if block_size < 1:
            raise ConfigError.below_minimum("block_size", block_size, 1)
        self._model = model
        self._declared = capacity
        self._max_model_len = max_model_len
        self._local_tokenizer = tokenizer
        self._session = Session()
        self._transport = Transport(
            base_url,
            api_key=api_key,
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            retries=retries or Retries(),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            name=self.name,
            transport=transport,
            async_transport=async_transport,
        )
        self._state = EngineState(
            probe or ModelsProbe(), TransportProbeHTTP(self._transport), interval_s=read_interval_s
        )
        self._limits = Limits(block_size=block_size, backend=self.name)
        self._counter: TokenCounter | None = None
        self._keys = itertools.count()
        Restarts.__init__(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._transport.base_url} {self._model}>"

    @property
    def name(self) -> str:
        return "openai"

    @property
    def model(self) -> str:
        return self._model

    @property
    def block_size(self) -> int:
        return self._limits.block_size

    # -- what the engine says -------------------------------------------------------------
    def reading(self, *, fresh: bool = False) -> EngineReading:
        """The engine's latest reading (at most ``read_interval_s`` old unless ``fresh``)."""
        suspect = self._session.suspect
        try:
            reading = self._state.read(fresh=fresh or suspect, suspect=suspect)
        except BackendUnavailable:
            self._session.suspect = True  # it may come back as a new engine
            raise
        self._session.observe(self._state.instance_of(reading))
        return reading

    def capacity(self) -> BackendCapacity:
        reading = self.reading()
        tokens = reading.num_tokens if reading.num_tokens is not None else self._declared
        if tokens is None:
            raise ConfigError(
                f"{self._state.probe.engine} at {self.base_url} does not say its KV capacity; "
                "declare it: capacity=<tokens> or capacity=(num_blocks, block_size)",
                setting="capacity",
            )
        num_blocks = self._num_blocks(reading, tokens)
        max_model_len = reading.max_model_len or self._max_model_len or tokens
        in_use = self._blocks_in_use(reading, num_blocks)
        return BackendCapacity(
            block_size=self.block_size,
            num_blocks=num_blocks,
            num_free_blocks=max(0, num_blocks - in_use),
            num_pinned_blocks=0,
            bytes_per_block=0,  # the engine does not say its KV bytes
            max_model_len=max_model_len,
        )

    def metrics(self) -> BackendMetrics:
        reading = self.reading()
        num_blocks = self.capacity().num_blocks
        in_use = self._blocks_in_use(reading, num_blocks)
        tokens = reading.num_tokens_in_use
        return BackendMetrics(
            num_blocks_in_use=in_use,
            num_blocks_free=max(0, num_blocks - in_use),
            num_blocks_cached=0,
            num_blocks_pinned=0,
            num_blocks_swapped=self._num_blocks_swapped(),
            num_requests_running=_or(reading.num_requests_running, self._limits.num_calls),
            num_requests_waiting=_or(reading.num_requests_waiting, 0),
            num_preemptions=_or(reading.num_preemptions, 0),
            prefix_cache_queries=_or(reading.prefix_cache_queries, 0),
            prefix_cache_hits=_or(reading.prefix_cache_hits, 0),
            num_tokens_in_use=tokens if tokens is not None else self._limits.tokens_reserved(),
        )

    def health(self) -> BackendHealth:
        if self._closed:
            return BackendHealth(ok=False, detail=f"closed; create a new {type(self).__name__}")
        try:
            self.reading(fresh=True)
        except BackendError as exc:  # reported, not raised: a health check answers
            self._session.suspect = True
            return BackendHealth(ok=False, detail=str(exc))
        return BackendHealth(ok=True)

    # -- budgets: the client's own --------------------------------------------------------
    def open_budget(self, name: str, *, max_blocks: int) -> None:
        self._limits.open(name, max_blocks)

    def resize_budget(self, name: str, *, max_blocks: int) -> None:
        self._limits.open(name, max_blocks)

    def close_budget(self, name: str) -> None:
        self._limits.close(name)

    def retain(self, *, budget: str) -> int:
        return 0  # no lever: the engine's prefix cache keeps what it keeps

    def release_retained(self, *, budget: str) -> None:
        return None

    def offload(self, *, budget: str) -> None:
        return None

    def restore(self, *, budget: str) -> None:
        return None

    def pin_prefix(
        self,
        prefix: str | Sequence[int] | Sequence[Message],
        *,
        cache_salt: str | None = None,
        shared: bool = False,
    ) -> PrefixHandle:
        """Nothing is pinned (the engine cannot): the handle counts the prefix's tokens and
        holds no blocks, so admission keeps every block for leases."""
        if isinstance(prefix, str):
            tokens = self.count_tokens(prefix)
        elif prefix and not isinstance(prefix[0], int):
            tokens = self.counter.count_messages(prefix)
        else:
            tokens = len(prefix)
        key = f"{self.name}-prefix-{next(self._keys)}"
        self._session.pinned(key, Pin([], cache_salt, key, shared))
        return PrefixHandle(key, tokens, 0, 0, cache_salt=cache_salt, shared=shared)

    def unpin_prefix(self, handle: PrefixHandle) -> None:
        if self._session.unpinned(handle.key, reached=True) is None:
            raise BackendError(
                f"prefix {handle.key!r} is not pinned here: unpin each handle once, on the "
                "backend that made it",
                backend=self.name,
            )

    # -- the same for an event loop: reads of the engine on a worker thread; the rest is
    # the client's own bookkeeping, or a slot save/restore an engine subclass makes
    async def acapacity(self) -> BackendCapacity:
        return await asyncio.to_thread(self.capacity)

    async def ametrics(self) -> BackendMetrics:
        return await asyncio.to_thread(self.metrics)

    async def aopen_budget(self, name: str, *, max_blocks: int) -> None:
        self.open_budget(name, max_blocks=max_blocks)

    async def aresize_budget(self, name: str, *, max_blocks: int) -> None:
        self.resize_budget(name, max_blocks=max_blocks)

    async def aclose_budget(self, name: str) -> None:
        await asyncio.to_thread(self.close_budget, name)

    async def aretain(self, *, budget: str) -> int:
        return await asyncio.to_thread(self.retain, budget=budget)

    async def arelease_retained(self, *, budget: str) -> None:
        await asyncio.to_thread(self.release_retained, budget=budget)

    async def aoffload(self, *, budget: str) -> None:
        await asyncio.to_thread(self.offload, budget=budget)

    async def arestore(self, *, budget: str) -> None:
        await asyncio.to_thread(self.restore, budget=budget)

    # -- counting ----------------------------------------------------------------------------
    @property
    def counter(self) -> TokenCounter:
        if self._counter is None:
            self._counter = self._make_counter()
        return self._counter

    def count_tokens(self, text: str) -> int:
        return self.counter.count(text)

    def count_messages(self, messages: Sequence[Message]) -> int:
        return self.counter.count_messages(messages)

    def _make_counter(self) -> TokenCounter:
        try:
            counted = self._count({"text": "a"})
        except BackendUnavailable:
            raise
        except BackendError as exc:
            if getattr(exc, "status_code", None) not in (400, 404, 405, 501):
                raise
            return local_counter(self._local_tokenizer, self.base_url, exc)
        if counted < 1:  # a /tokenize of another shape, which read no text from the body
            why = BackendError("its /tokenize counted no tokens in a text", backend=self.name)
            return local_counter(self._local_tokenizer, self.base_url, why)
        return TokenCounter(tokenizer=RemoteTokenizer({}, self._count))

    def _count(self, body: Mapping[str, Any]) -> int:
        """Tokens of ``{"text": ...}`` or ``{"messages": [...]}`` by the server's
        ``/tokenize`` (vLLM's and SGLang's shape; engines with another override it)."""
        sent: dict[str, Any] = {"model": self._model}
        if "messages" in body:
            sent |= {"messages": body["messages"], "add_generation_prompt": True}
        else:
            sent |= {"prompt": body["text"], "add_special_tokens": False}
        answer = self._transport.request("POST", "/tokenize", json=sent, idempotent=True).json()
        count = answer.get("count")
        return int(count) if isinstance(count, int) else len(answer.get("tokens") or ())

    # -- model calls ------------------------------------------------------------------------
    def generate(self, request: GenerationRequest) -> GenerationResult:
        self._before()
        call = self._admit(request)
        try:
            body = self._body(request, call, stream=False)
            response = self._send(path_of(request), body)
            return self._result(call, result_of(response.json(), backend=self.name))
        finally:
            self._done(call)

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        await self._abefore()
        call = await asyncio.to_thread(self._admit, request)
        try:
            body = await asyncio.to_thread(self._body, request, call, stream=False)
            try:
                response = await self._transport.arequest("POST", path_of(request), json=body)
            except BackendError as exc:
                await asyncio.to_thread(self._failed, exc)
                raise
            return self._result(call, result_of(response.json(), backend=self.name))
        finally:
            self._done(call)

    async def astream(self, request: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
        """Chunks as the engine streams them, then one with only the ``result``."""
        await self._abefore()
        call = await asyncio.to_thread(self._admit, request)
        try:
            body = await asyncio.to_thread(self._body, request, call, stream=True)
            state = StreamState(self.name)
            try:
                async with (
                    self._transport.astream(path_of(request), json=body) as lines,
                    aclosing(stream_chunks(lines, state)) as chunks,
                ):
                    async for chunk in chunks:
                        yield chunk
            except BackendError as exc:
                await asyncio.to_thread(self._failed, exc)
                raise
            # Some servers (transformers serve) end a stream without [DONE]: one that said
            # its finish reason and usage before closing ended whole.
            if not state.done and (state.finish_reason is None or state.usage is None):
                self._session.suspect = True
                raise BackendUnavailable("the stream ended before [DONE]", backend=self.name)
            yield GenerationChunk("", (), self._result(call, state.result()))
        finally:
            self._done(call)

    # -- for engine subclasses ----------------------------------------------------------------
    def _extras(self, request: GenerationRequest, body: dict[str, Any]) -> None:
        """Add the engine's own fields to ``body`` (none for a plain OpenAI server)."""

    def _num_blocks(self, reading: EngineReading, tokens: int) -> int:
        return tokens // self.block_size

    def _num_blocks_swapped(self) -> int:
        return 0

    def _engine_state_lost(self) -> None:
        """The engine restarted: forget what it held for this client (subclasses)."""

    # -- helpers ------------------------------------------------------------------------------
    def _admit(self, request: GenerationRequest) -> Call:
        if request.messages is not None:
            prompt_tokens = self.counter.count_messages(request.messages)
        elif isinstance(request.prompt, str):
            prompt_tokens = self.counter.count(request.prompt)
        else:
            prompt_tokens = len(request.prompt or ())
        call = self._limits.admit(
            prompt_tokens=prompt_tokens,
            max_tokens=request.max_tokens,
            ceiling=request.ceiling_tokens,
            budget=request.budget,
            max_model_len=self.capacity().max_model_len,
        )
        return call

    def _done(self, call: Call) -> None:
        self._limits.release(call)

    def _body(self, request: GenerationRequest, call: Call, *, stream: bool) -> dict[str, Any]:
        body = openai_body(request, model=self._model, stream=stream, max_tokens=call.max_tokens)
        self._extras(request, body)
        return body

    def _send(self, path: str, body: dict[str, Any]) -> httpx.Response | Reply:
        try:
            return self._transport.request("POST", path, json=body)
        except BackendError as exc:
            self._failed(exc)
            raise

    def _result(self, call: Call, result: GenerationResult) -> GenerationResult:
        self._state.served(result.prompt_tokens)
        reason = self._limits.finish_reason(call, result.finish_reason, result.completion_tokens)
        if reason == result.finish_reason:
            return result
        return GenerationResult(
            result.text,
            result.token_ids,
            reason,
            result.prompt_tokens,
            result.completion_tokens,
            result.cached_tokens,
        )

    def _blocks_in_use(self, reading: EngineReading, num_blocks: int) -> int:
        if reading.kv_usage is not None:
            return min(num_blocks, round(reading.kv_usage * num_blocks))
        tokens = reading.num_tokens_in_use
        if tokens is None:
            tokens = self._limits.tokens_reserved()
        return min(num_blocks, math.ceil(tokens / self.block_size))

    # -- restarts (``Restarts``' hooks) ---------------------------------------------------
    def _probe(self) -> None:
        self.reading(fresh=True)
        self._session.suspect = False

    def _set_up(self, budgets: dict[str, int], pins: dict[str, Pin]) -> None:
        self._engine_state_lost()  # budgets and pins are the client's: nothing to send


def _or(value: int | None, default: int) -> int:
    return default if value is None else value
