"""``GovernedChatModel``: a LangChain chat model that calls a governor ``Backend`` in a lease.

    model = GovernedChatModel(governor, agent="coder", max_tokens=256)
    model.invoke("Fix the failing test")        # also ainvoke, stream, astream, batch

Every call goes through ``Governor.complete`` / ``acomplete`` / ``astream``, so it gets
what a governed call gets: the agent's shared prefix first (and its cache salt), the
conversation compacted by the ceiling policy when it would not fit with the reply, the
lease's engine budget, exact usage. The result is an ``AIMessage`` whose
``usage_metadata`` holds the backend's exact counts (``input_token_details.cache_read``
is the prompt served from the prefix cache) and whose ``response_metadata`` holds the
``finish_reason`` (``"stop"``, ``"length"``, ``"ceiling"``, ``"budget"``, ``"abort"``).

The lease a call runs in, first found first:

1. ``lease=``: a ``Lease`` the caller holds, or a function returning one (or None);
2. the current lease of the same governor (``integrations._lease_context``): the one
   ``GovernorMiddleware`` holds for the agent run the call is part of, or the one the
   node of a ``govern``-ed graph that makes the call runs in;
3. its own: a lease of ``agent`` taken for the call and released after it.

A lease given with ``lease=`` must be live; a current lease that was released is passed
over.

Streaming: ``astream`` yields the backend's pieces as they come, and a last empty chunk
with the usage. ``stream`` (sync) runs the same async stream on an event loop of its own
in a helper thread, so it works from any thread, one with a running loop included.

Tools: ``bind_tools`` binds OpenAI-format schemas so ``create_agent`` can use the model,
but a ``GenerationRequest`` carries no tools, so they reach neither the prompt nor the
count. Register a tool schema as the agent's prefix to put it in context. A model that
calls tools needs a backend that reports the calls; this one answers in text.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Sequence
from typing import Annotated, Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, SkipValidation

from governor import (
    AgentSpec,
    ConfigError,
    GenerationChunk,
    GenerationResult,
    Governor,
    Lease,
    LeaseContext,
    LeaseState,
)
from integrations._lease_context import current_lease
from integrations._messages import to_chats, usage_metadata

__all__ = ["GovernedChatModel"]

LeaseSource = Lease | Callable[[], Lease | None]
# Keyword arguments LangChain passes that a GenerationRequest has no field for.
_DROPPED = frozenset({"tools", "tool_choice", "parallel_tool_calls", "ls_structured_output_format"})
_OPTIONS = ("max_tokens", "temperature", "top_p", "seed")


class GovernedChatModel(BaseChatModel):
    """A ``BaseChatModel`` over ``governor``'s backend; see the module docstring.

    ``agent``: the agent (a registered name or an ``AgentSpec``) whose lease a call takes
    when it runs in none, for ``tenant`` (its cache salt). ``lease``: a lease, or a
    function returning the lease to call in. ``max_tokens``, ``temperature``, ``top_p``,
    ``seed``, ``stop``: the request's settings; ``bind`` or call arguments of the same
    names override them.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    governor: Governor
    agent: Annotated[str | AgentSpec | None, SkipValidation] = None
    # A LeaseSource or None, checked in __init__: pydantic would build a schema for the
    # Lease dataclass (whose fields name the Governor) and copy a lease on validation.
    lease: Any = None
    tenant: str | None = None
    max_tokens: int | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] | None = None

    def __init__(self, governor: Governor | None = None, /, **kwargs: Any) -> None:
        if governor is not None:
            kwargs["governor"] = governor
        super().__init__(**kwargs)
        governor = self.governor
        agent = self.agent
        if agent is not None and not isinstance(agent, (str, AgentSpec)):
            raise ConfigError(
                f"agent must be an agent's name or an AgentSpec, got {type(agent).__name__}",
                setting="agent",
            )
        if isinstance(agent, str):
            governor.agent(agent)  # an unknown name fails here, not at the first call
        if self.lease is not None and not (isinstance(self.lease, Lease) or callable(self.lease)):
            raise ConfigError(
                f"lease must be a Lease or a function returning one, got {self.lease!r}",
                setting="lease",
            )

    @property
    def _llm_type(self) -> str:
        return "kvgov"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        agent = self.agent.name if isinstance(self.agent, AgentSpec) else self.agent
        return {
            "backend": self.governor.backend.name,
            "model": self.governor.backend.model,
            "agent": agent,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
        }

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind the tools' schemas (see the module docstring for what becomes of them)."""
        schemas = [convert_to_openai_tool(tool) for tool in tools]
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        return self.bind(tools=schemas, **kwargs)

    # -- calls --------------------------------------------------------------------------
    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        chats, options = to_chats(messages), self._options(stop, kwargs)
        with self._lease() as lease:
            result = self.governor.complete(lease, chats, **options)
        return self._chat_result(result)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        chats, options = to_chats(messages), self._options(stop, kwargs)
        async with self._lease() as lease:
            result = await self.governor.acomplete(lease, chats, **options)
        return self._chat_result(result)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        # Each stream is closed here, not left to the garbage collector: a consumer that
        # stops early must have its call aborted (its blocks back) before the lease ends.
        async with contextlib.aclosing(self._chunks(messages, stop, kwargs)) as chunks:
            async for chunk in chunks:
                if run_manager is not None and chunk.text:
                    await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
                yield chunk

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        bound = self._bound()  # read here: the helper thread's context is a copy anyway
        for chunk in _drive(lambda: self._chunks(messages, stop, kwargs, bound=bound)):
            if run_manager is not None and chunk.text:
                run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk

    async def _chunks(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None,
        kwargs: dict[str, Any],
        *,
        bound: Lease | None = None,
    ) -> AsyncGenerator[ChatGenerationChunk, None]:
        chats, options = to_chats(messages), self._options(stop, kwargs)
        async with (
            self._lease(bound) as lease,
            contextlib.aclosing(self.governor.astream(lease, chats, **options)) as pieces,
        ):
            async for piece in pieces:
                yield self._chunk(piece)

    # -- pieces -------------------------------------------------------------------------
    def _options(self, stop: list[str] | None, kwargs: dict[str, Any]) -> dict[str, Any]:
        options: dict[str, Any] = {"temperature": self.temperature, "top_p": self.top_p}
        if self.max_tokens is not None:
            options["max_tokens"] = self.max_tokens
        if self.seed is not None:
            options["seed"] = self.seed
        extra = {k: v for k, v in kwargs.items() if k not in _DROPPED}
        options.update((k, extra.pop(k)) for k in _OPTIONS if k in extra)
        if extra:
            raise TypeError(
                f"GovernedChatModel takes no {', '.join(sorted(extra))}; its settings are "
                f"{', '.join(_OPTIONS)} and stop"
            )
        stops = stop if stop is not None else self.stop
        if stops:
            options["stop"] = tuple(stops)
        return options

    def _chat_result(self, result: GenerationResult) -> ChatResult:
        message = AIMessage(
            content=result.text,
            usage_metadata=usage_metadata(result),
            response_metadata=self._metadata(result),
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _chunk(self, piece: GenerationChunk) -> ChatGenerationChunk:
        if piece.result is None:
            return ChatGenerationChunk(message=AIMessageChunk(content=piece.text))
        message = AIMessageChunk(
            content="",
            usage_metadata=usage_metadata(piece.result),
            response_metadata=self._metadata(piece.result),
            chunk_position="last",
        )
        return ChatGenerationChunk(message=message)

    def _metadata(self, result: GenerationResult) -> dict[str, Any]:
        return {
            "finish_reason": result.finish_reason,
            "model_name": self.governor.backend.model,
            "model_provider": "kvgov",
        }

    # -- the lease ----------------------------------------------------------------------
    def _bound(self) -> Lease | None:
        """The lease given with ``lease=``, else the current one (see the module docstring)."""
        source: LeaseSource | None = self.lease
        lease = source() if callable(source) else source
        if lease is None:
            return current_lease(self.governor)
        if lease.state is LeaseState.RELEASED:
            raise ConfigError(
                f"lease {lease.lease_id} of agent {lease.agent.name!r} was released; bind a "
                "live lease, or none to take one per call",
                setting="lease",
            )
        return lease

    def _lease(self, bound: Lease | None = None) -> LeaseContext | contextlib.nullcontext[Lease]:
        """``with`` or ``async with``: the lease a call runs in; its own, taken for the
        call and released after it, when none is bound."""
        lease = bound or self._bound()
        if lease is not None:
            return contextlib.nullcontext(lease)
        if self.agent is None:
            raise ConfigError(
                "GovernedChatModel was called outside any lease and names no agent; pass "
                "agent=... (or lease=..., or run it under GovernorMiddleware or in a node "
                "of a govern()-ed graph)",
                setting="agent",
            )
        return self.governor.lease(self.agent, tenant=self.tenant)


_DONE = object()


def _drive(
    stream: Callable[[], AsyncGenerator[ChatGenerationChunk, None]],
) -> Iterator[ChatGenerationChunk]:
    """Iterate an async stream from sync code: it runs on an event loop of its own in a
    helper thread (with a copy of this context), handing items over a queue. Closing
    the iterator early stops the stream at its next item."""
    items: queue.Queue[tuple[Any, BaseException | None]] = queue.Queue()
    stop = threading.Event()

    async def pump() -> None:
        try:
            async with contextlib.aclosing(stream()) as chunks:
                async for chunk in chunks:
                    items.put((chunk, None))
                    if stop.is_set():
                        break
        except BaseException as exc:  # handed to the consumer, raised there
            items.put((_DONE, exc))
        else:
            items.put((_DONE, None))

    context = contextvars.copy_context()
    thread = threading.Thread(
        target=context.run, args=(asyncio.run, pump()), name="kvgov-stream", daemon=True
    )
    thread.start()
    try:
        while True:
            item, error = items.get()
            if error is not None:
                raise error
            if item is _DONE:
                return
            yield item
    finally:
        stop.set()
        thread.join()
