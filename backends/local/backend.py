"""``LocalBackend``: the bundled engine, in process, behind the ``Backend`` protocol.

The only governor module that touches engine/, and only lazily (inside functions or
under ``TYPE_CHECKING``), so ``import governor`` never pulls in torch.

Every engine call goes through one ``EngineLoop``: the engine lives on the loop's thread
and each call runs there between steps, so any thread or event loop may use the backend
at once. A bookkeeping call that changes the engine (budgets, pins, holds) waits for the
engine's current step to end, but for ``close_budget_soon`` and cancels, which are queued
and not waited for. ``metrics`` and ``capacity`` read the snapshot the engine thread
publishes after every step and command (``engine.loop_snapshot``), exact as of the last
step; they wait for no step, only for this backend's unwaited commands still queued, so a
read sees every change asked before it. Tokenizing happens in the caller's thread (the
tokenizer is immutable and thread-safe), which keeps long prompts from stalling the
engine thread.

``agenerate`` and ``astream`` never wait on the engine on the event loop, and make one
hand-off each way: the request goes on the engine loop's queue without waiting
(``EngineLoop.submit_nowait``), and its end (``agenerate``) or each output (``astream``)
comes back by ``call_soon_threadsafe``. A short prompt is tokenized on the engine thread
as the request is added (tens of microseconds, less than a hop to a worker thread
costs); a long one on a worker thread first, so it stalls neither the event loop nor the
engine's steps. Cancelling aborts the request through ``EngineLoop.cancel``, queued
behind it, so the abort always finds it and reaches the engine before whatever the
caller does next (a lease released, a budget closed).

Errors: an engine error keeps its own class, message and fields (``needed``,
``available``, ``name``...) and is also a ``governor.errors.BackendError``. It is raised
as a class derived from both, built once per engine class, with the original as
``__cause__``: engine-aware code catches ``engine.errors.BudgetExceededError``,
backend-agnostic code catches ``BackendError``, and neither loses information
(``backends.local._engine_errors``). Failures of the backend itself (closed, unknown prefix
handle) are plain ``BackendError``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import itertools
import os
import threading
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import fields
from typing import TYPE_CHECKING, Any, TypeVar

from backends.local._engine_errors import EngineErrors, reraise
from backends.local._helpers import (
    UnwaitedCommands,
    backend_capacity,
    backend_metrics,
    check_settings,
    config_and_engine,
    generation_result,
    is_short_prompt,
    merge_queued,
)
from governor import (
    BackendCapacity,
    BackendError,
    BackendHealth,
    BackendMetrics,
    ConfigError,
    GenerationChunk,
    GenerationRequest,
    GenerationResult,
    Message,
    PrefixHandle,
    ThreadedAsyncBookkeeping,
    TokenCounter,
)

if TYPE_CHECKING:
    from engine.block_results import PinnedPrefix
    from engine.engine import Engine
    from engine.engine_loop import EngineLoop, Submission
    from engine.host_swap import HostSwap
    from engine.loop_snapshot import LoopSnapshot
    from engine.outputs import EngineSnapshot, KVSnapshot
    from engine.sampling import SamplingParams
    from engine.tokenizer import Tokenizer

__all__ = ["LocalBackend"]

T = TypeVar("T")
_NAME = "local"
_HEALTH_TIMEOUT_S = 5.0
_Prompt = list[int]
_Options = dict[str, Any]


class LocalBackend(ThreadedAsyncBookkeeping):
    """The bundled engine as a ``Backend``.

    ``LocalBackend()`` builds the ``tiny-random`` preset; ``config`` is a mapping of
    ``EngineConfig`` fields (``{"model": "/models/qwen3", "num_blocks": 4096}``); or
    hand over an ``Engine`` or an ``EngineLoop``. The backend owns what it is given, as
    ``httpx.Client`` owns its transport: ``close()`` aborts every request in flight and
    stops the loop. The engine's budgets and pins are left as they are, so an ``Engine``
    can be wrapped again once that backend is closed: one loop drives an engine at a time
    (a second backend on one still driven: ``ConfigError``; share the backend or loop).
    """

    retains_at_finish = True  # GenerationRequest.retain: held in the step ending the call
    restores_at_call = True  # an offloaded hold comes back as its budget's call is added

    def __init__(
        self,
        engine_or_loop: Engine | EngineLoop | None = None,
        *,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        from engine.engine import Engine
        from engine.engine_loop import EngineInUseError, EngineLoop
        from engine.weights import weights_nbytes

        if isinstance(engine_or_loop, EngineLoop):
            if config is not None:
                raise config_and_engine()
            self._loop = engine_or_loop
        elif isinstance(engine_or_loop, Engine):
            if config is not None:
                raise config_and_engine()
            try:
                self._loop = EngineLoop(engine_or_loop)
            except EngineInUseError as exc:
                raise ConfigError(str(exc), setting="engine_or_loop") from exc
        elif engine_or_loop is None:
            self._loop = EngineLoop(_build_engine(config or {}))
        else:
            raise ConfigError(
                "LocalBackend takes an engine.Engine, an engine.EngineLoop or nothing, got "
                f"{type(engine_or_loop).__name__}; pass config={{...}} to build an engine",
                setting="engine_or_loop",
            )
        engine = self._loop.engine
        self._engine = engine
        self._tokenizer = engine.tokenizer
        self._counter = TokenCounter(tokenizer=engine.tokenizer)
        self._model = os.path.basename(os.path.normpath(engine.config.model))
        self._weights_bytes = weights_nbytes(engine.model)
        self._lock = threading.Lock()
        self._pins: dict[str, PinnedPrefix] = {}
        self._pin_keys = itertools.count()
        self._unwaited = UnwaitedCommands()  # closes and cancels queued, not waited for
        self._closed = False

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"<LocalBackend model={self._model!r} device={self._engine.device.type}{state}>"

    @property
    def name(self) -> str:
        return _NAME

    @property
    def model(self) -> str:
        return self._model

    # -- lifecycle ----------------------------------------------------------------------
    def close(self) -> None:
        """Abort every request in flight (their blocks return) and stop the engine thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._loop.close()

    def __enter__(self) -> LocalBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- bookkeeping --------------------------------------------------------------------
    def capacity(self) -> BackendCapacity:
        return backend_capacity(self._snapshot().capacity, self._weights_bytes)

    def open_budget(self, name: str, *, max_blocks: int) -> None:
        self._call(self._engine.open_budget, name, max_blocks)

    def close_budget_soon(
        self, name: str, *, on_error: Callable[[BaseException], None] | None = None
    ) -> concurrent.futures.Future[None]:
        """Queue ``close_budget`` and return at once; the future holds its outcome (the
        engine's error, untranslated). ``on_error`` runs on the engine thread before the
        future settles, so any read after it sees what it recorded; it must not block.
        Commands run in order, so whatever this backend queued before reaches the engine
        first (``governor.unwaited``)."""
        self._check_open()
        engine = self._engine

        def close() -> None:
            try:
                engine.close_budget(name)
            except Exception as exc:
                if on_error is not None:
                    on_error(exc)
                raise

        future = self._translated(self._loop.call_soon, close)
        self._unwaited.track(future)
        return future

    def _snapshot(self) -> LoopSnapshot:
        """The engine loop's latest snapshot, once every write queued here without
        waiting has run: a reader sees what was asked of the engine before it read."""
        self._check_open()
        self._unwaited.wait()
        return self._loop.snapshot()

    def resize_budget(self, name: str, *, max_blocks: int) -> None:
        self._call(self._engine.resize_budget, name, max_blocks)

    def close_budget(self, name: str) -> None:
        self._call(self._engine.close_budget, name)

    def pin_prefix(
        self,
        prefix: str | Sequence[int] | Sequence[Message],
        *,
        cache_salt: str | None = None,
        shared: bool = False,
    ) -> PrefixHandle:
        if prefix and not isinstance(prefix, str) and isinstance(prefix[0], Mapping):
            token_ids = self._translated(
                self._tokenizer.encode_chat, list(prefix), add_generation_prompt=False
            )
        else:
            token_ids = self._encode(prefix)  # type: ignore[arg-type]  # not messages: text or ids
        pinned = self._call(
            self._engine.pin_prefix, token_ids, cache_salt=cache_salt, shared=shared
        )
        with self._lock:
            key = f"{_NAME}-prefix-{next(self._pin_keys)}"
            self._pins[key] = pinned
        return PrefixHandle(
            key=key,
            num_tokens=len(token_ids),
            num_pinned_tokens=pinned.num_tokens,
            num_blocks=len(pinned.block_ids),
            cache_salt=cache_salt,
            shared=shared,
        )

    def unpin_prefix(self, handle: PrefixHandle) -> None:
        with self._lock:
            pinned = self._pins.pop(handle.key, None)
        if pinned is None:
            raise BackendError(
                f"prefix {handle.key!r} is not pinned here: it was already unpinned or was "
                "pinned by another backend; unpin each handle once, on the backend that made it",
                backend=_NAME,
            )
        self._call(self._engine.unpin, pinned)

    @property
    def counter(self) -> TokenCounter:
        return self._counter

    @property
    def tokenizer(self) -> Tokenizer:
        """The engine's tokenizer (immutable, thread-safe): what ``kvgov serve``'s
        ``/tokenize`` and ``return_token_ids`` encode with."""
        return self._tokenizer

    def count_tokens(self, text: str) -> int:
        return self._translated(self._counter.count, text)

    def count_messages(self, messages: Sequence[Message]) -> int:
        """Exactly the prompt length ``generate`` prefills: the chat template's ids."""
        return self._translated(self._counter.count_messages, messages)

    def retain(self, *, budget: str) -> int:
        return self._call(self._engine.retain, budget)

    def release_retained(self, *, budget: str) -> None:
        self._call(self._engine.release_retained, budget)

    def offload(self, *, budget: str) -> None:
        self._call(self._engine.offload, budget=budget)

    def restore(self, *, budget: str) -> None:
        self._call(self._engine.restore, budget=budget)

    def metrics(self) -> BackendMetrics:
        return backend_metrics(self._snapshot().metrics)

    def held_contexts(self) -> Mapping[str, bool]:
        """Holds, budget -> offloaded: what the engine moved or ended itself (governor.idle)."""
        return self._call(self._engine.retained.states)

    def kv_snapshot(self) -> KVSnapshot:
        """The engine's ``kv_snapshot``: every budget's blocks (device and host), one instant."""
        return self._call(self._engine.kv_snapshot)

    def live_snapshot(self) -> EngineSnapshot:
        """The engine's ``snapshot``: metrics, capacity, KV map and requests at one instant."""
        return self._call(self._engine.snapshot)

    @property
    def weights_bytes(self) -> int:
        """Device memory the model's weights take."""
        return self._weights_bytes

    @property
    def host_swap(self) -> HostSwap:
        """The engine's host swap space for offloaded KV: its size, and why that size
        (set in the config, or sized from the model). Fixed once the engine is built."""
        return self._engine.host_swap

    def health(self) -> BackendHealth:
        """Ok when the engine thread answers within a few seconds."""
        engine = self._engine
        if self._closed:
            return BackendHealth(ok=False, detail="closed; create a new LocalBackend")
        future = self._loop.call_soon(engine.capacity)
        try:
            cap = future.result(timeout=_HEALTH_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return BackendHealth(
                ok=False, detail=f"the engine thread did not answer in {_HEALTH_TIMEOUT_S} s"
            )
        except Exception as exc:  # reported, not raised: a health check answers
            return BackendHealth(ok=False, detail=f"{type(exc).__name__}: {exc}")
        return BackendHealth(
            ok=True,
            detail=(
                f"model {self._model} on {engine.device} "
                f"({str(engine.dtype).removeprefix('torch.')}); "
                f"{cap.num_free_blocks}/{cap.num_blocks} blocks of {cap.block_size} tokens free"
            ),
        )

    # -- model calls --------------------------------------------------------------------
    def generate(self, request: GenerationRequest) -> GenerationResult:
        prompt, sampling, options = self._prepare(request)
        self._check_open()
        completion = self._translated(self._loop.generate, prompt, sampling, **options)
        return generation_result(completion)

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        """The whole answer; cancelling the call aborts the request. Only the request's
        end wakes the event loop (``astream`` wakes it for every engine step)."""
        from engine.engine_loop import settle
        from engine.outputs import RequestOutput

        loop = asyncio.get_running_loop()
        ended: asyncio.Future[object] = loop.create_future()

        def sink(item: object) -> None:
            if isinstance(item, RequestOutput):
                return
            with suppress(RuntimeError):  # as astream's sink: the loop may have closed
                loop.call_soon_threadsafe(settle, ended, item)

        submission = await self._asubmit(request, sink)
        try:
            item = await ended
        except asyncio.CancelledError:
            self._unwaited.track(self._loop.cancel(submission))
            raise
        if isinstance(item, BaseException):
            reraise(item, backend=_NAME, engine_errors=_engine_errors())
        assert submission.stream is not None  # added before its end was sunk
        return generation_result(submission.stream.result())

    async def astream(self, request: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
        """A chunk per engine step with new tokens, then one with only the ``result``; a
        consumer that fell behind gets the steps it missed in one chunk (``merge_queued``).

        A consumer that stops early (``aclose()``, a cancelled task) aborts the request,
        so its blocks return at once.
        """
        from engine.outputs import RequestOutput

        loop = asyncio.get_running_loop()
        items: asyncio.Queue[object] = asyncio.Queue()

        def sink(item: object) -> None:
            # Runs on the engine thread, which must survive a consumer whose event loop
            # closed before its abort arrived: a raise here would end that thread.
            with suppress(RuntimeError):
                loop.call_soon_threadsafe(items.put_nowait, item)

        submission = await self._asubmit(request, sink)
        finished = False
        later: object = None  # what ended a merge: handled on the next turn
        try:
            while True:
                item, later = (later, None) if later is not None else (await items.get(), None)
                if isinstance(item, BaseException):
                    finished = True
                    reraise(item, backend=_NAME, engine_errors=_engine_errors())
                if not isinstance(item, RequestOutput):
                    # The loop's end marker: it comes after the completion was set.
                    finished = True
                    assert submission.stream is not None  # added before its end was sunk
                    yield GenerationChunk("", (), generation_result(submission.stream.result()))
                    return
                text, token_ids, later = merge_queued(items, item, RequestOutput)
                if token_ids or text:
                    yield GenerationChunk(text, token_ids)
        finally:
            if not finished:
                self._unwaited.track(self._loop.cancel(submission))

    async def _asubmit(
        self, request: GenerationRequest, sink: Callable[[object], None]
    ) -> Submission:
        """Queue the request on the engine loop without waiting for it; ``sink`` hears
        its outputs and end, or the error that refused it. The loop's ``sink`` hook rather
        than its astream: that one never hands back the Completion, which has the cached
        tokens. A caller cancelled while a long prompt is tokenized has queued nothing."""
        from engine.engine_loop import EngineLoopClosedError

        self._check_open()
        sampling, options = self._sampling_and_options(request)
        prompt: _Prompt | Callable[[], _Prompt]
        if is_short_prompt(request):
            prompt = functools.partial(self._prompt_of, request)  # on the engine thread
        else:
            prompt = await asyncio.to_thread(self._translated, self._prompt_of, request)
            self._check_open()
        try:
            return self._loop.submit_nowait(prompt, sampling, sink=sink, **options)
        except EngineLoopClosedError as exc:
            reraise(exc, backend=_NAME, engine_errors=_engine_errors())

    # -- helpers ------------------------------------------------------------------------
    def _prepare(self, request: GenerationRequest) -> tuple[_Prompt, SamplingParams, _Options]:
        """The engine's view of a request: prompt ids, sampling, and add_request options."""
        prompt = self._translated(self._prompt_of, request)
        return (prompt, *self._sampling_and_options(request))

    def _prompt_of(self, request: GenerationRequest) -> _Prompt:
        """The request's prompt ids (engine errors untranslated: callers translate)."""
        if request.messages is not None:
            return self._tokenizer.encode_chat(request.messages)
        prompt = request.prompt
        assert prompt is not None  # GenerationRequest holds messages or a prompt
        if isinstance(prompt, str):
            return self._tokenizer.encode(prompt)
        return list(prompt)

    def _sampling_and_options(self, request: GenerationRequest) -> tuple[SamplingParams, _Options]:
        from engine.sampling import SamplingParams

        sampling = self._translated(
            SamplingParams,
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed,
            stop=request.stop,
        )
        options = {
            "ceiling_tokens": request.ceiling_tokens,
            "budget": request.budget,
            "cache_salt": request.cache_salt,
            "priority": request.priority,
            "order_time": request.order_time,
            "retain": request.retain and request.budget is not None,
        }
        return sampling, options

    def _encode(self, prompt: str | Sequence[int]) -> _Prompt:
        if isinstance(prompt, str):
            return self._translated(self._tokenizer.encode, prompt)
        return list(prompt)

    def _check_open(self) -> None:
        if self._closed:
            raise BackendError("this LocalBackend is closed; create a new one", backend=_NAME)

    def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` on the engine thread, between steps."""
        self._check_open()
        return self._translated(self._loop.call, fn, *args, **kwargs)

    def _translated(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        from engine.errors import EngineError

        try:
            return fn(*args, **kwargs)
        except EngineError as exc:
            reraise(exc, backend=_NAME, engine_errors=_engine_errors())


@functools.cache
def _engine_errors() -> EngineErrors:
    from engine.engine_loop import EngineLoopClosedError
    from engine.errors import EngineError

    return EngineError, EngineLoopClosedError


def _build_engine(config: Mapping[str, Any]) -> Engine:
    from engine.config import EngineConfig
    from engine.engine import Engine
    from engine.errors import EngineError

    check_settings(config, {f.name for f in fields(EngineConfig)})
    try:
        return Engine(EngineConfig(**config))
    except EngineError as exc:
        raise ConfigError(f"cannot build the engine from {dict(config)!r}: {exc}") from exc
