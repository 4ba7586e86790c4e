"""``ModelCall``: one OpenAI request turned into a ``GenerationRequest`` and run on the
backend, with what every model call of the server does around it.

Around each call: the model name and the budget's name are checked (404, 400), the
queue gate is passed (429, a bound key's share of it: ``limits.QueueGate``), the tenant's
budget name and cache salt are applied, a bound key's ``priority`` and ``order_age_s``
are lowered to the server's bounds (``ServeSettings``), ``request.*`` events are recorded,
the engine's errors become ``ApiError`` (a prompt over the model's context is 400
``context_length_exceeded``), and ``retain`` holds the KV once the call is done.

A call whose client goes away is cancelled: ``LocalBackend.astream`` aborts the engine
request when its consumer stops, ``LocalBackend.agenerate`` when it is cancelled, so its
blocks return at once. A non-streamed call (``agenerate``: the event loop wakes once per
call, not once per token) races the generation against the client's disconnect (the
request's ``receive``, which yields ``http.disconnect`` once the body has been read).
With ``return_token_ids`` the server tokenizes the prompt once and hands the engine the
ids.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from fastapi import Request

from governor.backend import GenerationChunk, GenerationRequest, GenerationResult
from kvgov.serve import tenancy
from kvgov.serve.errors import ApiError, from_exception
from kvgov.serve.limits import QueueGate
from kvgov.serve.openai_schemas import ChatCompletionRequest, CompletionRequest
from kvgov.serve.state import ServerState

__all__ = ["ApiContext", "ClientGone", "ModelCall"]

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


@dataclass(slots=True)
class ApiContext:
    """What the OpenAI routes keep besides ``ServerState`` (``app.state.kvgov_api``)."""

    gate: QueueGate
    max_model_len: int


@dataclass(slots=True)
class ModelCall:
    state: ServerState
    api: ApiContext
    request: Request
    body: ChatCompletionRequest | CompletionRequest
    kind: Literal["chat", "text"]
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    tenant: str = ""
    finished: bool = False  # the answer is whole (request.finished recorded)
    prompt_ids: list[int] | None = None  # tokenized once, by prompt_token_ids()

    def __post_init__(self) -> None:
        prefix = "chatcmpl" if self.kind == "chat" else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.tenant = tenancy.tenant_of(self.request)
        if self.body.budget is not None:
            try:
                tenancy.check_budget_name(self.body.budget, param="budget")
            except ApiError as exc:
                self._refused(exc.status, exc.code)
                raise
        model = self.body.model
        if model is not None and model != self.state.model_name:
            self._refused(404, "model_not_found")
            raise ApiError(
                404,
                f"The model `{model}` does not exist; this server serves "
                f"`{self.state.model_name}` (GET /v1/models lists it)",
                code="model_not_found",
                param="model",
            )

    @property
    def model(self) -> str:
        return self.state.model_name

    def generation_request(self) -> GenerationRequest:
        body = self.body
        budget = None if body.budget is None else tenancy.scoped_budget(self.tenant, body.budget)
        priority, order_age_s = body.priority, body.order_age_s
        if self.state.is_bound(self.tenant):  # see ServeSettings: no key jumps every queue
            settings = self.state.settings
            priority = min(priority, settings.tenant_max_priority)
            if order_age_s is not None:
                order_age_s = min(order_age_s, settings.tenant_max_order_age_s)
        prompt: str | list[int] | None = self.prompt_ids  # tokenized already: the engine takes them
        messages: list[dict[str, Any]] | None = None
        if prompt is None:
            if isinstance(body, ChatCompletionRequest):
                messages = body.message_dicts()
            else:
                prompt = body.one_prompt()
        return GenerationRequest(
            messages=messages,
            prompt=prompt,
            # Without a limit the call may use the rest of the context: the engine ends it
            # at the ceiling (finish "length"), as vLLM does with no max_tokens.
            max_tokens=body.output_limit or self.api.max_model_len,
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed,
            stop=body.stop_strings,
            ceiling_tokens=body.ceiling_tokens,
            budget=budget,
            cache_salt=tenancy.cache_salt_for(self.tenant, body.cache_salt),
            priority=priority,
            order_time=None if order_age_s is None else time.monotonic() - order_age_s,
            retain=body.retain,
        )

    async def prompt_token_ids(self) -> list[int]:
        """The prompt's ids, as the engine tokenizes it (for ``return_token_ids``). The
        call then hands the engine these ids, so the prompt is tokenized once."""
        if self.prompt_ids is None:
            tokenizer = self.state.backend.tokenizer
            body = self.body
            if isinstance(body, ChatCompletionRequest):
                ids = await asyncio.to_thread(tokenizer.encode_chat, body.message_dicts())
            elif isinstance(prompt := body.one_prompt(), str):
                ids = await asyncio.to_thread(tokenizer.encode, prompt)
            else:
                ids = list(prompt)
            self.prompt_ids = ids
        return self.prompt_ids

    # -- running ------------------------------------------------------------------------
    async def generate(self) -> GenerationResult:
        """The whole answer; ``ClientGone`` (after aborting) if the client left first.
        ``backend.agenerate`` wakes this event loop once, when the answer is whole, where
        a stream wakes it for every engine step."""
        return await self.until_disconnect(self._generate())

    async def _generate(self) -> GenerationResult:
        async with self._running() as generation:
            result = await self.state.backend.agenerate(generation)
            self._finish(result)
            return result

    async def stream(self) -> AsyncGenerator[GenerationChunk, None]:
        """The backend's chunks, inside the gate, events and error mapping."""
        async with (
            self._running() as generation,
            aclosing(self.state.backend.astream(generation)) as chunks,
        ):
            async for chunk in chunks:
                if chunk.result is not None:
                    self._finish(chunk.result)
                yield chunk

    @asynccontextmanager
    async def _running(self) -> AsyncIterator[GenerationRequest]:
        """A model call inside the gate: ``request.started``, then ``finished`` (recorded
        by ``_finish``), ``refused`` (the engine's errors, mapped) or ``aborted`` (the
        client left, the call was cancelled)."""
        await self._enter()
        refused = False
        try:
            generation = self.generation_request()
            self._record("request.started")
            yield generation
        except ApiError as exc:
            refused = True
            self._refused(exc.status, exc.code)
            raise
        except Exception as exc:
            refused = True
            error = self._translate(exc)
            self._refused(error.status, error.code)
            raise error from exc
        finally:
            self.api.gate.leave(self.tenant)
            if not self.finished and not refused:
                self._record("request.aborted", reason="client disconnected")

    async def until_disconnect(self, work: Awaitable[T]) -> T:
        """``work``'s result, or ``ClientGone`` once ``work`` is cancelled because the
        client disconnected first. ``work`` runs in the caller's task and only the watcher
        gets one of its own: racing two tasks under ``asyncio.wait`` cost every call a
        task, a wait and their callbacks more on the event loop."""
        task = asyncio.current_task()
        assert task is not None, "until_disconnect runs in a task (each request's)"
        gone = False

        async def watch() -> None:
            nonlocal gone
            await _disconnected(self.request)
            gone = True
            task.cancel()

        watcher = asyncio.ensure_future(watch())
        try:
            return await work
        except asyncio.CancelledError:
            if gone and _uncancel(task) == 0:  # the watcher's cancel, and nobody else's
                raise ClientGone() from None
            raise
        finally:
            watcher.cancel()

    async def _enter(self) -> None:
        try:
            await self.api.gate.enter(self.tenant, bound=self.state.is_bound(self.tenant))
        except ApiError as exc:
            self._refused(exc.status, exc.code)
            raise

    def _finish(self, result: GenerationResult) -> None:
        # ``retain``: the engine held the context in the step that finished the call.
        self.finished = True
        self._record(
            "request.finished",
            prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens,
            cached_tokens=result.cached_tokens,
            finish_reason=result.finish_reason,
        )

    def _translate(self, exc: Exception) -> ApiError:
        from engine.errors import CeilingExceededError

        limit = self.api.max_model_len
        if isinstance(exc, CeilingExceededError) and exc.ceiling_tokens == limit:
            what = "messages" if self.kind == "chat" else "prompt"
            prompt_tokens = exc.needed - 1
            return ApiError(
                400,
                f"This model's maximum context length is {limit} tokens. However, your "
                f"{what} resulted in {prompt_tokens} tokens, which leaves no room for a "
                f"completion. Please reduce the length of the {what}.",
                code="context_length_exceeded",
                param="messages" if self.kind == "chat" else "prompt",
                headers={"x-should-retry": "false"},
            )
        return from_exception(exc, tenant=self.tenant)

    def _record(self, kind: str, **fields: object) -> None:
        self.state.events.record(
            kind, id=self.id, tenant=self.tenant, budget=self.body.budget, **fields
        )

    def _refused(self, status: int, code: str | None) -> None:
        self._record("request.refused", status=status, code=code)


def _uncancel(task: asyncio.Task[object]) -> int:
    """``task.uncancel()`` where there is one (3.11+: the cancels still pending, which
    ``asyncio.timeout`` and task groups count on); 0 on 3.10."""
    uncancel = getattr(task, "uncancel", None)
    return 0 if uncancel is None else int(uncancel())


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
