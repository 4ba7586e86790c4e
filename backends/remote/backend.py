"""``RemoteBackend``: the ``Backend`` protocol against ``kvgov serve``, over httpx.

The governor runs where the agents run; the engine runs on another machine behind
``kvgov serve``. Bookkeeping goes to the control plane (``/kvgov/v1``, the models of
``backends.remote.wire``); model calls to the OpenAI routes with kvgov's extras
(``backends.remote.generation``). Sync calls use one pooled ``httpx.Client``;
``agenerate``, ``astream`` and the ``a``-prefixed bookkeeping use an
``httpx.AsyncClient`` per event loop and never block it (``backends.http.transport``:
timeouts, and retries only where safe). Counting is exact and mostly local
(``backends.remote.tokens``). Imports no torch and no engine.

Errors: the server's error body names the engine's class and fields, and the call
raises a ``BackendError`` of that name with those fields, as ``LocalBackend`` does.
A server that cannot be reached, answers 5xx or restarts under a call raises
``BackendUnavailable`` (``retriable``). A restart (a new instance id) is noticed at the
next call; budgets are opened and prefixes pinned again before it runs
(``backends.remote.session``), and ``on_restart`` hooks (the governor's, which
forgets the held KV the restart lost) are called.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import aclosing
from typing import Any

import httpx

from backends.http import AnswerLimits
from backends.http.errors import InvalidNameError
from backends.http.transport import HttpLifecycle, Retries, Transport
from backends.remote import wire
from backends.remote._paths import API, budget_path, checked_name, prefix_path
from backends.remote.generation import StreamState, body_of, path_of, result_of, stream_chunks
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

__all__ = ["InvalidNameError", "RemoteBackend", "Retries"]

_NAME = "remote"
_MAX_RESPONSE_BYTES = AnswerLimits().max_body_bytes


class RemoteBackend(Restarts, HttpLifecycle):
    """The engine behind ``kvgov serve`` at ``base_url`` (``http://gpu-box:8000``).

    ``timeout``: seconds to wait for an answer (a model call's whole answer, so size it
    for the longest call); ``connect_timeout``: for a connection. ``api_key``: one of the
    server's ``--api-key``s. ``max_response_bytes``: the most one answer's body may hold
    (64 MiB by default; a streamed answer's lines, 8 MiB or this if less, each): a server
    that sends more is not read, and the call raises ``BackendUnavailable``.
    ``transport``/``async_transport``: httpx transports to send through instead of the
    network (proxies, tests), as httpx's clients take them.
    Thread-safe, and usable from any number of event loops.
    """

    # ``GenerationRequest.retain`` goes to the server, whose engine holds the context in
    # the step that finishes the call (``LocalBackend.retains_at_finish``).
    retains_at_finish = True
    # Its offloaded hold comes back as the server's engine adds the budget's next call
    # (``Engine.add_request``): the governor sends no restore first.
    restores_at_call = True

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 600.0,
        connect_timeout: float = 5.0,
        retries: Retries | None = None,
        max_connections: int = 100,
        max_response_bytes: int = _MAX_RESPONSE_BYTES,
        model: str | None = None,
        transport: httpx.BaseTransport | None = None,
        async_transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if isinstance(max_response_bytes, bool) or not (
            isinstance(max_response_bytes, int) and max_response_bytes >= 1
        ):
            raise ConfigError(
                f"max_response_bytes must be a positive int (bytes), not {max_response_bytes!r}",
                setting="max_response_bytes",
            )
        self._session = Session()
        self._transport = Transport(
            base_url,
            api_key=api_key,
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            retries=retries or Retries(),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            name=_NAME,
            on_instance=self._session.observe,
            instance_header=wire.INSTANCE_HEADER,
            transport=transport,
            async_transport=async_transport,
            answer_limits=AnswerLimits(
                max_body_bytes=max_response_bytes,
                max_line_bytes=min(max_response_bytes, AnswerLimits().max_line_bytes),
            ),
        )
        self._model = model
        self._counter: TokenCounter | None = None
        self._lock = threading.Lock()
        Restarts.__init__(self)

    def __repr__(self) -> str:
        return f"<RemoteBackend {self._transport.base_url}>"

    @property
    def name(self) -> str:
        return _NAME

    @property
    def model(self) -> str:
        if self._model is None:
            self._model = str(self._get("/version")["model"])
        return self._model

    async def _amodel(self) -> str:
        """``model``, asked for on the loop's client: the event loop never waits on it."""
        if self._model is None:
            self._model = str((await self._aget("/version"))["model"])
        return self._model

    # -- bookkeeping --------------------------------------------------------------------
    def capacity(self) -> BackendCapacity:
        return _capacity(self._get(f"{API}/capacity"))

    async def acapacity(self) -> BackendCapacity:
        return _capacity(await self._aget(f"{API}/capacity"))

    def metrics(self) -> BackendMetrics:
        return BackendMetrics(**wire.Metrics(**self._get(f"{API}/metrics")).model_dump())

    async def ametrics(self) -> BackendMetrics:
        return BackendMetrics(**wire.Metrics(**await self._aget(f"{API}/metrics")).model_dump())

    def held_contexts(self) -> Mapping[str, bool]:
        """The server's ``/kvgov/v1/holds``: this client's holds, budget -> offloaded (the
        governor reads it when ``num_holds_reclaimed`` moved: ``governor.idle``)."""
        return wire.Holds(**self._get(f"{API}/holds")).holds

    def kv_map(self) -> wire.KVMap:
        """The server's ``/kvgov/v1/kv``: this client's budgets' blocks at one instant."""
        return wire.KVMap(**self._get(f"{API}/kv"))

    def open_budget(self, name: str, *, max_blocks: int) -> None:
        checked_name(name, backend=_NAME)
        self._call("POST", f"{API}/budgets", {"name": name, "max_blocks": max_blocks})
        self._session.opened(name, max_blocks)

    async def aopen_budget(self, name: str, *, max_blocks: int) -> None:
        checked_name(name, backend=_NAME)
        await self._acall("POST", f"{API}/budgets", {"name": name, "max_blocks": max_blocks})
        self._session.opened(name, max_blocks)

    def resize_budget(self, name: str, *, max_blocks: int) -> None:
        path = budget_path(name, backend=_NAME)
        self._call("PUT", path, {"max_blocks": max_blocks}, idempotent=True)
        self._session.opened(name, max_blocks)

    async def aresize_budget(self, name: str, *, max_blocks: int) -> None:
        path = budget_path(name, backend=_NAME)
        await self._acall("PUT", path, {"max_blocks": max_blocks}, idempotent=True)
        self._session.opened(name, max_blocks)

    def close_budget(self, name: str) -> None:
        path = budget_path(name, backend=_NAME)
        try:
            self._call("DELETE", path)
        except BackendUnavailable:  # closed once the server is back, unless it restarted
            self._session.closed(name, reached=False)
            return
        self._session.closed(name, reached=True)

    async def aclose_budget(self, name: str) -> None:
        path = budget_path(name, backend=_NAME)
        try:
            await self._acall("DELETE", path)
        except BackendUnavailable:
            self._session.closed(name, reached=False)
            return
        self._session.closed(name, reached=True)

    def retain(self, *, budget: str) -> int:
        response = self._call("POST", budget_path(budget, "retain", backend=_NAME))
        return int(response.json()["tokens"])

    async def aretain(self, *, budget: str) -> int:
        response = await self._acall("POST", budget_path(budget, "retain", backend=_NAME))
        return int(response.json()["tokens"])

    def release_retained(self, *, budget: str) -> None:
        self._call("POST", budget_path(budget, "release", backend=_NAME), idempotent=True)

    async def arelease_retained(self, *, budget: str) -> None:
        await self._acall("POST", budget_path(budget, "release", backend=_NAME), idempotent=True)

    def offload(self, *, budget: str) -> None:
        self._call("POST", budget_path(budget, "offload", backend=_NAME))

    async def aoffload(self, *, budget: str) -> None:
        await self._acall("POST", budget_path(budget, "offload", backend=_NAME))

    def restore(self, *, budget: str) -> None:
        self._call("POST", budget_path(budget, "restore", backend=_NAME))

    async def arestore(self, *, budget: str) -> None:
        await self._acall("POST", budget_path(budget, "restore", backend=_NAME))

    def pin_prefix(
        self,
        prefix: str | Sequence[int] | Sequence[Message],
        *,
        cache_salt: str | None = None,
        shared: bool = False,
    ) -> PrefixHandle:
        sent = prefix if isinstance(prefix, str) else [_plain(item) for item in prefix]
        answer = self._pin(sent, cache_salt, shared)
        key = self._session.new_key()
        self._session.pinned(key, Pin(sent, cache_salt, answer.key, shared))
        return PrefixHandle(
            key=key,
            num_tokens=answer.num_tokens,
            num_pinned_tokens=answer.num_pinned_tokens,
            num_blocks=answer.num_blocks,
            cache_salt=cache_salt,
            shared=answer.shared,
        )

    def unpin_prefix(self, handle: PrefixHandle) -> None:
        server_key = self._session.server_key(handle.key)
        if server_key is None:
            raise BackendError(
                f"prefix {handle.key!r} is not pinned here: it was already unpinned or was "
                "pinned by another backend; unpin each handle once, on the backend that made it",
                backend=_NAME,
            )
        try:
            self._call("DELETE", prefix_path(server_key, backend=_NAME))
        except BackendUnavailable:
            self._session.unpinned(handle.key, reached=False)
            return
        self._session.unpinned(handle.key, reached=True)

    def health(self) -> BackendHealth:
        if self._closed:
            return BackendHealth(ok=False, detail="closed; create a new RemoteBackend")
        try:
            response = self._transport.request("GET", "/health")
        except BackendError as exc:  # reported, not raised: a health check answers
            self._session.suspect = True
            return BackendHealth(ok=False, detail=str(exc))
        body = response.json()
        self._session.observe(str(body.get("instance_id", "")))
        return BackendHealth(ok=bool(body.get("ok")), detail=str(body.get("detail", "")))

    # -- counting -----------------------------------------------------------------------
    @property
    def counter(self) -> TokenCounter:
        with self._lock:
            if self._counter is None:
                tokenizer = RemoteTokenizer(self._get(f"{API}/tokenizer"), self._count)
                self._counter = TokenCounter(tokenizer=tokenizer)
            return self._counter

    def count_tokens(self, text: str) -> int:
        return self.counter.count(text)

    def count_messages(self, messages: Sequence[Message]) -> int:
        return self.counter.count_messages(messages)

    def _count(self, body: Mapping[str, Any]) -> int:
        return int(self._call("POST", f"{API}/count", body, idempotent=True).json()["tokens"])

    # -- model calls ------------------------------------------------------------------
    def generate(self, request: GenerationRequest) -> GenerationResult:
        body = body_of(request, model=self.model, stream=False)
        return result_of(self._call("POST", path_of(request), body).json(), backend=_NAME)

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        body = body_of(request, model=await self._amodel(), stream=False)
        response = await self._acall("POST", path_of(request), body)
        return result_of(response.json(), backend=_NAME)

    async def astream(self, request: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
        """Chunks as the server streams them, then one with only the ``result``. A
        consumer that stops early closes the connection: the server aborts the call."""
        body = body_of(request, model=await self._amodel(), stream=True)
        await self._abefore()
        state = StreamState(_NAME)
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
        if not state.done:
            self._session.suspect = True
            raise BackendUnavailable("the stream ended before [DONE]", backend=_NAME)
        yield GenerationChunk("", (), state.result())

    # -- helpers ------------------------------------------------------------------------
    def _pin(self, prefix: Any, cache_salt: str | None, shared: bool) -> wire.Prefix:
        body = {"prefix": prefix, "cache_salt": cache_salt, "shared": shared}
        return wire.Prefix(**self._call("POST", f"{API}/prefixes", body).json())

    def _get(self, path: str) -> dict[str, Any]:
        return dict(self._call("GET", path).json())

    async def _aget(self, path: str) -> dict[str, Any]:
        return dict((await self._acall("GET", path)).json())


def _capacity(body: dict[str, Any]) -> BackendCapacity:
    return BackendCapacity(**wire.Capacity(**body).model_dump())


def _plain(item: Any) -> Any:
    return dict(item) if isinstance(item, dict) or hasattr(item, "keys") else item
