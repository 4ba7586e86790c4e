"""LangChain agents within the governor: ``GovernorMiddleware`` and ``GovernedChatModel``.

    agent = create_agent(
        model,
        tools=[run_tests, read_file],
        middleware=[GovernorMiddleware(governor, agent="coder", on_ceiling="compact")],
    )
    agent.invoke({"messages": [HumanMessage("Fix the failing test")]})

``GovernorMiddleware`` is an ``AgentMiddleware`` for ``create_agent`` (langchain 1.x):

- the lease: one per agent invocation, taken at its first model call and renewed
  (resumed if parked) for each later one once the turn is planned and goes to the
  model: a turn that ends at the ceiling (``on_ceiling`` "end" or "raise") never waits
  to be admitted again for nothing; released when the run ends
  (``after_agent``), when an error or a cancellation leaves a model or tool call (the
  run is over then; an outer retry takes a new lease), and, for an error raised
  anywhere else (another middleware's hook) or a stream closed early, when the agent
  graph's run reports its end to its callbacks (``integrations.langchain._run_end``),
  before ``invoke`` raises; as a last resort, when the run's state is
  garbage-collected (``integrations.langchain._state.RunHandle``). Between a model
  call and the run's next hook the lease is idle (``Governor.between_calls``): parked
  after ``park_after_s``, so a run its caller abandoned holds no admission room while it
  waits for the collector. While a model call runs, the lease is
  the current lease (``integrations._lease_context``): a ``GovernedChatModel`` without
  a lease of its own calls in it. Inside a node of a ``govern``-ed graph whose lease is
  of the same agent (by name) and governor, the run takes no lease of its own: it works
  in the node's (resumed before each model call, never released by the run: the graph
  holds it). A lease of another agent there is no business of the run's: it takes its
  own, as anywhere.
- ``wrap_model_call`` (details in ``integrations.langchain._turn``): the request's
  system message and messages are counted exactly (``governor.counter``, with the
  agent's registered prefix in front, as ``Governor.compact`` sees them) with
  ``max_tokens`` (else the governor's ``reply_reserve_tokens``, up to a quarter of the
  ceiling) kept for the reply. When they do not fit the lease's ceiling,
  ``on_ceiling`` decides:

  - ``"compact"``: ``Governor.compact`` applies the governor's ceiling policy
    (``Policies(ceiling=DropOldest())`` or ``SummarizeOldest()``; the default,
    ``RaiseAtCeiling``, raises). The compacted dicts are mapped back onto the original
    message objects (``integrations._messages.restore``); the call is sent with
    ``request.override(messages=...)``, and the state's messages become the compacted
    ones plus the reply (``RemoveMessage(REMOVE_ALL_MESSAGES)`` first, as LangChain's
    ``SummarizationMiddleware`` writes them), so later turns start compacted and
    resuming the thread from a checkpoint does too.
  - ``"end"``: the model is not called; the run ends (``jump_to`` end) with an
    ``AIMessage`` that says the context reached the ceiling.
  - ``"raise"``: ``governor.CeilingExceeded``.

  Usage is read from the reply's ``usage_metadata`` (our own counts when it has none)
  and recorded with ``Governor.record_call`` (the lease's ``tokens_in_context`` and
  ``num_calls``, a ``call.finished`` event) unless the model already called through
  the lease (``GovernedChatModel`` does).
- ``wrap_tool_call``: the tool runs inside ``Governor.tool_call`` (the lease idles, is
  parked after ``park_after_s``, its KV held or offloaded); a ``ToolMessage`` whose text
  exceeds the agent's ``tool_output_tokens`` is reduced by the tool-output policy before
  it enters the state, keeping its ``tool_call_id``, ``name``, ``status`` and ``id``.
- counters live in graph state (``GovernorState``): ``kvgov_model_calls``,
  ``kvgov_compactions``, ``kvgov_tokens_compacted``, ``kvgov_tool_tokens_saved``,
  ``kvgov_input_tokens``, ``kvgov_output_tokens`` (summed over the thread) and
  ``kvgov_peak_tokens`` (its largest prompt).

Sync and async hooks share one body; only waiting for admission and calling the
handler differ, and the async hooks run what may wait on the engine or a model off the
event loop (``asyncio.to_thread``): planning a call (counting, and compacting with a
ceiling policy that may summarize with a model), reducing a tool's output (the
tool-output policy may be an ``LLMSummarizer``) and releasing the lease (its engine
budget is closed). Where it sits among other middlewares matters (the first listed wraps
the others): it counts the request as the middlewares before it leave it, and a
compaction writes that request's messages to the state. Tool schemas bound to the
model are not counted (put them in the agent's registered prefix to have them counted
and shared). The compacting policies split a conversation into turns at user
messages, so the model/tool rounds that answer one user message are one turn to them,
compacted only as a whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

from langchain.agents.middleware.types import (
    AgentMiddleware,
    ContextT,
    ExtendedModelResponse,
    ModelRequest,
    ModelResponse,
    ResponseT,
)
from langchain_core.messages import AIMessage, ToolMessage
from langgraph.config import get_config
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.runtime import Runtime
from langgraph.types import Command

from governor import (
    AgentSpec,
    ConfigError,
    Governor,
    Lease,
    ToolCall,
    ToolOutputReduction,
    reduce_output,
)
from integrations._lease_context import LeaseScope, current_lease
from integrations._messages import last_request, text_of
from integrations.langchain._run_end import RUN_ENDS
from integrations.langchain._state import GovernorState, RunHandle
from integrations.langchain._turn import OnCeiling, Turns

__all__ = ["GovernorMiddleware"]

_ON_CEILING = ("compact", "end", "raise")
_RUN = "kvgov_run"

ModelHandler = Callable[[ModelRequest[ContextT]], ModelResponse[ResponseT]]
AsyncModelHandler = Callable[[ModelRequest[ContextT]], Awaitable[ModelResponse[ResponseT]]]
ToolResult = ToolMessage | Command[Any]


class GovernorMiddleware(AgentMiddleware[GovernorState[ResponseT], ContextT, ResponseT]):
    """Runs a ``create_agent`` agent within a governor lease; see the module docstring.

    ``agent``: an agent's name or an ``AgentSpec`` (None: an agent named ``"agent"``
    with the governor's ``default_ceiling_tokens``); ``ceiling_tokens`` and
    ``tool_output_tokens`` override the spec's. A name the governor does not know is
    created from them (the governor's ``default_ceiling_tokens`` when only
    ``tool_output_tokens`` is given) and registered with the governor; with neither it
    is refused, as a misspelling would be. ``on_ceiling``: ``"compact"``, ``"end"``
    or ``"raise"``. ``max_tokens``: the room kept for the reply when counting against
    the ceiling (None: the governor's default reserve). ``tenant``: the leases' tenant
    (their cache salt, and their per-tenant admission limits).
    """

    state_schema = GovernorState  # type: ignore[assignment]  # the generic class: no ResponseT here

    def __init__(
        self,
        governor: Governor,
        *,
        agent: str | AgentSpec | None = None,
        ceiling_tokens: int | None = None,
        tool_output_tokens: int | None = None,
        on_ceiling: OnCeiling = "compact",
        max_tokens: int | None = None,
        tenant: str | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(governor, Governor):
            raise ConfigError(
                f"GovernorMiddleware needs a governor.Governor, got {type(governor).__name__}",
                setting="governor",
            )
        if on_ceiling not in _ON_CEILING:
            raise ConfigError(
                f"on_ceiling must be one of {', '.join(map(repr, _ON_CEILING))}, "
                f"got {on_ceiling!r}",
                setting="on_ceiling",
            )
        if max_tokens is not None and (
            not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
        ):
            raise ConfigError.below_minimum("max_tokens", max_tokens, 1)
        self.governor = governor
        self.spec = _spec(governor, agent, ceiling_tokens, tool_output_tokens)
        self.on_ceiling = on_ceiling
        self.max_tokens = max_tokens
        self.tenant = tenant
        self.turns = Turns(governor, on_ceiling, max_tokens)

    def __repr__(self) -> str:
        return (
            f"GovernorMiddleware(agent={self.spec.name!r}, "
            f"ceiling_tokens={self.spec.ceiling_tokens}, on_ceiling={self.on_ceiling!r})"
        )

    # -- the run ------------------------------------------------------------------------
    def before_agent(
        self, state: GovernorState[ResponseT], runtime: Runtime[ContextT]
    ) -> dict[str, Any] | None:
        return {_RUN: _watched(RunHandle())}

    async def abefore_agent(
        self, state: GovernorState[ResponseT], runtime: Runtime[ContextT]
    ) -> dict[str, Any] | None:
        return self.before_agent(state, runtime)

    def after_agent(
        self, state: GovernorState[ResponseT], runtime: Runtime[ContextT]
    ) -> dict[str, Any] | None:
        handle = _handle(state)
        if handle is not None:
            handle.close()
        return None

    async def aafter_agent(
        self, state: GovernorState[ResponseT], runtime: Runtime[ContextT]
    ) -> dict[str, Any] | None:
        handle = _handle(state)
        if handle is not None:
            await handle.aclose()
        return None

    # -- model calls --------------------------------------------------------------------
    def wrap_model_call(
        self, request: ModelRequest[ContextT], handler: ModelHandler[ContextT, ResponseT]
    ) -> ModelResponse[ResponseT] | AIMessage | ExtendedModelResponse[ResponseT]:
        handle, update = self._run(request.state)
        with handle.closing_on_error():
            lease = self._lease(handle)
            renew = lease is not None  # resumed (if parked) once the turn goes to the model
            if lease is None:
                lease = handle.hold(self.governor, self.governor.acquire(self._new_lease()))
            turn = self.turns.plan(lease, request, update)
            if turn.ending is not None:
                return self.turns.ended(turn)
            if renew:
                self.governor.resume(lease)
            with LeaseScope(lease):
                response = handler(turn.request)
            answered = self.turns.answered(turn, response)
            self._between_calls(handle, lease)
            return answered

    async def awrap_model_call(
        self, request: ModelRequest[ContextT], handler: AsyncModelHandler[ContextT, ResponseT]
    ) -> ModelResponse[ResponseT] | AIMessage | ExtendedModelResponse[ResponseT]:
        handle, update = self._run(request.state)
        async with handle.aclosing_on_error():
            lease = self._lease(handle)
            renew = lease is not None
            if lease is None:
                lease = handle.hold(self.governor, await self.governor.aacquire(self._new_lease()))
            turn = await asyncio.to_thread(self.turns.plan, lease, request, update)
            if turn.ending is not None:
                return self.turns.ended(turn)
            if renew:
                await self.governor.aresume(lease)
            with LeaseScope(lease):
                response = await handler(turn.request)
            answered = self.turns.answered(turn, response)
            self._between_calls(handle, lease)
            return answered

    def _between_calls(self, handle: RunHandle, lease: Lease) -> None:
        """The run's own lease is idle until its next hook (a tool call, a model call, the
        run's end), which a caller that stops reading a stream never reaches: parked in
        time, it holds no admission room until the run is collected. A governed node's
        lease is the node's to park."""
        if handle.live() is lease:
            self.governor.between_calls(lease)

    def _lease(self, handle: RunHandle) -> Lease | None:
        """The lease the run works in: its own, else a governed graph node's of this agent
        (see the module docstring); None before its first model call."""
        lease = handle.live()
        if lease is not None:
            return lease
        current = current_lease(self.governor)
        return current if current is not None and current.agent.name == self.spec.name else None

    def _new_lease(self) -> Lease:
        return self.governor.lease(self.spec, tenant=self.tenant).lease  # admitted next

    def _run(self, state: Any) -> tuple[RunHandle, dict[str, Any]]:
        """The run's handle, and the state update that stores it when it is new (a run
        resumed from an interrupt has none: ``before_agent`` did not run)."""
        handle = _handle(state)
        if handle is not None:
            return handle, {}
        handle = _watched(RunHandle())
        return handle, {_RUN: handle}

    # -- tool calls ---------------------------------------------------------------------
    def wrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], ToolResult]
    ) -> ToolResult:
        handle = _handle(request.state)
        lease = None if handle is None else self._lease(handle)
        if handle is None or lease is None:
            return self._reduced(None, request, handler(request))
        with handle.closing_on_error():
            with self._tool_call(lease, request) as call:
                result = handler(request)
            return self._reduced(call, request, result)

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolResult]],
    ) -> ToolResult:
        handle = _handle(request.state)
        lease = None if handle is None else self._lease(handle)
        if handle is None or lease is None:
            return await asyncio.to_thread(self._reduced, None, request, await handler(request))
        async with handle.aclosing_on_error():
            async with self._tool_call(lease, request) as call:
                result = await handler(request)
            return await asyncio.to_thread(self._reduced, call, request, result)

    def _tool_call(self, lease: Lease, request: ToolCallRequest) -> ToolCall:
        call = request.tool_call
        return self.governor.tool_call(
            lease, call["name"], call.get("args"), question=_question(request)
        )

    def _reduced(
        self, call: ToolCall | None, request: ToolCallRequest, result: ToolResult
    ) -> ToolResult:
        """``result`` with its text fitted to ``tool_output_tokens``; a ``Command`` that
        also counts the tokens saved when it was reduced. A run without a lease (resumed
        at its tools from an interrupt) is reduced by the policy alone."""
        budget = self.spec.tool_output_tokens
        if budget is None or not isinstance(result, ToolMessage):
            return result
        text = text_of(result.content)
        if text is None:
            return result
        if call is not None:
            reduction = call.reduce(text)
        else:
            reduction = self._reduce_unleased(request, text, budget)
        if not reduction.changed:
            return result
        reduced = result.model_copy(update={"content": reduction.text})
        return Command(
            update={"messages": [reduced], "kvgov_tool_tokens_saved": reduction.tokens_saved}
        )

    def _reduce_unleased(
        self, request: ToolCallRequest, text: str, budget: int
    ) -> ToolOutputReduction:
        call = request.tool_call
        return reduce_output(
            self.governor.tool_output_policy,
            text,
            budget_tokens=budget,
            tool_name=call["name"],
            arguments=call.get("args"),
            question=_question(request),
        )


def _question(request: ToolCallRequest) -> str | None:
    """The agent's last request before this call, from the state's messages."""
    state = request.state
    messages = state.get("messages") if isinstance(state, Mapping) else None
    return last_request(messages) if isinstance(messages, list) else None


def _watched(handle: RunHandle) -> RunHandle:
    """``handle``, closed when its agent graph run ends, whatever ends it
    (``integrations.langchain._run_end``): called from a node of that run."""
    try:
        config = get_config()
    except RuntimeError:  # not inside a runnable: the collector is the last resort
        return handle
    node_run = getattr(config.get("callbacks"), "parent_run_id", None)
    if node_run is not None:
        RUN_ENDS.watch(node_run, handle)
    return handle


def _handle(state: Any) -> RunHandle | None:
    handle = state.get(_RUN) if isinstance(state, Mapping) else getattr(state, _RUN, None)
    return handle if isinstance(handle, RunHandle) else None


def _spec(
    governor: Governor,
    agent: str | AgentSpec | None,
    ceiling_tokens: int | None,
    tool_output_tokens: int | None,
) -> AgentSpec:
    """The middleware's agent: a name, registered (its spec, with the settings given) or
    not (a new spec of the settings given, registered with the governor so that later
    middlewares, chat models and leases of that name find it); an ``AgentSpec``; or None
    (``"agent"`` at the governor's ``default_ceiling_tokens``)."""
    settings: dict[str, Any] = {}
    if ceiling_tokens is not None:
        settings["ceiling_tokens"] = ceiling_tokens
    if tool_output_tokens is not None:
        settings["tool_output_tokens"] = tool_output_tokens
    if agent is None:
        spec = AgentSpec(name="agent", ceiling_tokens=governor.config.default_ceiling_tokens)
    elif isinstance(agent, AgentSpec):
        spec = agent
    elif isinstance(agent, str):
        if agent not in governor.agents:
            if not settings:  # most likely a misspelt name: creating it would hide that
                raise ConfigError(
                    f"no agent named {agent!r} (known: "
                    f"{', '.join(map(repr, sorted(governor.agents))) or 'none yet'}); give its "
                    f"settings here to create it (GovernorMiddleware(governor, agent={agent!r}, "
                    "ceiling_tokens=...)), register it (governor.register_agent(AgentSpec("
                    f"name={agent!r}, ...))) or use a known name",
                    setting="agent",
                )
            ceiling = settings.pop("ceiling_tokens", governor.config.default_ceiling_tokens)
            created = AgentSpec(name=agent, ceiling_tokens=ceiling, **settings)  # validates
            governor.register_agent(created)
            return created
        spec = governor.agent(agent)
    else:
        raise ConfigError(
            f"agent must be an agent's name or an AgentSpec, got {type(agent).__name__}",
            setting="agent",
        )
    if not settings:
        return spec
    try:
        return replace(spec, **settings)  # AgentSpec validates them
    except ConfigError as exc:
        given = ", ".join(f"{key}={value!r}" for key, value in settings.items())
        raise ConfigError(
            f"GovernorMiddleware({given}) does not fit agent {spec.name!r} "
            f"(ceiling_tokens={spec.ceiling_tokens}, tool_output_tokens="
            f"{spec.tool_output_tokens}): {exc}; give settings that fit together, or a "
            "spec of its own (agent=AgentSpec(...))",
            setting=exc.setting,
        ) from exc
