"""``GovernedNode``: a LangGraph node's runnable, run inside its agent's lease.

Private to integrations/. ``govern`` puts one in place of each governed node's
``PregelNode.bound`` (and of every ``ToolNode``'s). Per execution it takes the lease its
frame plans (``integrations.langgraph._frame``), makes it the current lease while the node
runs (``integrations._lease_context``: a subgraph's nodes find it, and a
``GovernedChatModel`` given no lease calls in it), and settles the node's output within
the lease:

- a tools node runs inside ``governor.tool_call``: the lease is idle meanwhile;
- the tool results the node returns are reduced to the agent's ``tool_output_tokens``
  by the governor's tool-output policy, each result once per run;
- each assistant message it adds is one model call of the lease. Unless a call went
  through the governor during the node (a ``GovernedChatModel``, a
  ``GovernorMiddleware``, a governed node of a subgraph: ``lease.num_calls`` moved,
  and those calls are recorded already), a reply whose ``usage_metadata`` says its usage
  is recorded with ``governor.record_call`` (a ``call.finished`` event; the node's run
  time shared among its replies), and one without is counted in ``lease.num_calls``;
- the context the node leaves behind (the messages it saw merged with those it
  returned, by the state's own reducer) is counted into ``lease.tokens_in_context``
  (after any recorded call: the state's count, not the reply's usage, is what the
  agent holds next);
- when that context and the reply's reserve (``governor.reply_reserve``) would pass
  the ceiling, the governor's ceiling policy decides (``governor.compact``): the default
  raises ``CeilingExceeded``; a compacting policy's result replaces the state's messages
  (``RemoveMessage`` of all with ``add_messages``, a plain write without a reducer). A
  node reached by ``Send`` writes to a state its siblings share, and a reducer that only
  appends cannot drop messages, so neither is compacted: it raises ``CeilingExceeded``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, RemoveMessage, ToolMessage
from langchain_core.runnables import Runnable, RunnableConfig

from governor import AgentSpec, CeilingExceeded, Lease, ToolCall
from integrations._lease_context import LeaseScope
from integrations._messages import compact, last_request, reported_usage, text_of
from integrations.langgraph._frame import Frame, Turn, frame_of
from integrations.langgraph._messages import (
    calling_messages,
    can_replace,
    is_add_messages,
    messages_in,
    messages_out,
    replace_messages,
    rewrite_messages,
    tool_calls,
)

__all__ = ["GovernedNode"]


class GovernedNode(Runnable[Any, Any]):
    """Runs ``inner`` (the node's own runnable) with its lease; see the module docstring.

    ``spec`` is None for a ``ToolNode`` that ``agents=`` does not name: it runs in the
    lease of whoever asked for its calls, or ungoverned when nobody did."""

    def __init__(
        self, inner: Runnable[Any, Any], *, node: str, spec: AgentSpec | None, tool_node: bool
    ) -> None:
        self.inner = inner
        self.node = node
        self.spec = spec
        self.tool_node = tool_node
        self.name = inner.get_name()

    def __repr__(self) -> str:
        agent = None if self.spec is None else self.spec.name
        return f"GovernedNode({self.node!r}, agent={agent!r}, inner={self.inner!r})"

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        step = self._plan(config, input)
        if step is None:
            return self.inner.invoke(input, config, **kwargs)
        frame, turn = step.frame, step.turn
        frame.begin(turn)
        with frame.ending(turn):
            with LeaseScope(turn.lease), self._tool_call(step):
                output = self.inner.invoke(input, config, **kwargs)
            return settle(step, input, output)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        step = self._plan(config, input)
        if step is None:
            return await self.inner.ainvoke(input, config, **kwargs)
        frame, turn = step.frame, step.turn
        await frame.abegin(turn)
        with frame.ending(turn):
            if step.calls is None:  # no governor.tool_call: no coroutine to enter
                with LeaseScope(turn.lease):
                    output = await self.inner.ainvoke(input, config, **kwargs)
            else:
                async with self._tool_call(step):
                    with LeaseScope(turn.lease):
                        output = await self.inner.ainvoke(input, config, **kwargs)
            # The tool-output and ceiling policies may call a model: they run off the
            # loop. Most turns call neither and settle on it (a thread hop costs more).
            if reduces_a_result(step, output):
                return await asyncio.to_thread(settle, step, input, output)
            output, context, tokens = account(step, input, output)
            if context is None or not _over_ceiling(step, tokens):
                return output
            return await asyncio.to_thread(
                _at_ceiling, step.frame, step.turn, output, context, tokens
            )

    def _plan(self, config: RunnableConfig | None, value: Any) -> _Step | None:
        """This execution's frame, lease and input messages; None: run ungoverned."""
        frame = frame_of(config)
        if frame is None:
            return None
        assert config is not None  # frame_of found a frame in it
        seen = messages_in(value, frame.governance.messages_key)
        calls = tool_calls(seen, value) if self.tool_node else None
        turn = frame.plan(
            self.node, self.spec, tool_node=self.tool_node, config=config, calls=calls
        )
        if turn is None:
            return None
        question = None
        if calls:  # the request in the input, or the one the calling node saw
            given = calling_messages(value, frame.governance.messages_key)
            question = last_request(given) or frame.question_for(calls)
        return _Step(frame, turn, seen, calls, question)

    def _tool_call(self, step: _Step) -> ToolCall | contextlib.nullcontext[None]:
        """A tools node runs inside ``governor.tool_call``; any other node in nothing."""
        if step.calls is None:
            return contextlib.nullcontext()
        name, arguments = _describe(step.calls)
        return step.frame.governor.tool_call(
            step.turn.lease, name, arguments, question=step.question
        )


class _Step:
    """One governed node execution: its frame and turn, the messages it was given, and
    (a tools node's) the tool calls it runs and the agent's last request before them."""

    __slots__ = ("calls", "frame", "question", "seen", "turn")

    def __init__(
        self,
        frame: Frame,
        turn: Turn,
        seen: list[BaseMessage] | None,
        calls: list[Mapping[str, Any]] | None,
        question: str | None = None,
    ) -> None:
        self.frame = frame
        self.turn = turn
        self.seen = seen
        self.calls = calls
        self.question = question


def settle(step: _Step, value: Any, output: Any) -> Any:
    """The node's output, its tool results reduced, its calls recorded and its context
    counted (and compacted, or refused, at the ceiling)."""
    output, context, tokens = account(step, value, output)
    if context is not None and _over_ceiling(step, tokens):
        output = _at_ceiling(step.frame, step.turn, output, context, tokens)
    return output


def account(step: _Step, value: Any, output: Any) -> tuple[Any, list[BaseMessage] | None, int]:
    """``settle`` up to the ceiling: the output with its tool results reduced, its calls
    recorded, and the context it leaves with its count (None: the node neither read nor
    wrote messages)."""
    frame, turn, seen = step.frame, step.turn, step.seen
    lease = turn.lease
    governance = frame.governance
    key = governance.messages_key
    added = messages_out(output, key)
    if lease.agent.tool_output_tokens is not None and _has_tool_results(added):
        listed = step.calls if step.calls is not None else tool_calls(seen, value)
        calls = {str(call.get("id")): call for call in listed}
        question = step.question
        output = rewrite_messages(
            output,
            key,
            lambda messages: [_reduce(frame, lease, m, calls, question) for m in messages],
        )
        added = messages_out(output, key)
    if added is None and seen is None:
        return output, None, 0
    tally = frame.scope.tally
    if added:
        frame.note_calls(lease, added, seen)
        if lease.num_calls == turn.calls_before:  # no call went through the governor
            replies = [m for m in added if isinstance(m, AIMessage) and not tally.known(m)]
            if replies and seen:
                old = {id(m) for m in seen}
                replies = [m for m in replies if id(m) not in old]
            if replies:
                _record(frame, turn, replies)
    if added is None:  # it only read: its context is at least what it saw
        context = seen or []
        tokens = max(lease.tokens_in_context, tally.count(context))
    else:
        context = _merge(governance.reducer, seen, added)
        tokens = tally.count(context)
    lease.tokens_in_context = tokens
    return output, context, tokens


def reduces_a_result(step: _Step, output: Any) -> bool:
    """Whether ``settle`` will ask the tool-output policy to reduce a tool result (one
    over the agent's ``tool_output_tokens``). Its counts are the tally's: ``settle``
    looks them up."""
    lease, tally = step.turn.lease, step.frame.scope.tally
    budget = lease.agent.tool_output_tokens
    if budget is None:
        return False
    for message in messages_out(output, step.frame.governance.messages_key) or ():
        if isinstance(message, ToolMessage):
            text = text_of(message.content)
            if text is not None and tally.count_content(message, text) > budget:
                return True
    return False


def _over_ceiling(step: _Step, tokens: int) -> bool:
    lease = step.turn.lease
    return tokens + step.frame.governor.reply_reserve(lease) > lease.ceiling_tokens


def _record(frame: Frame, turn: Turn, replies: list[AIMessage]) -> None:
    """The model calls whose replies the node added (see the module docstring)."""
    lease = turn.lease
    elapsed_s = (time.perf_counter() - turn.started) / len(replies)
    for reply in replies:
        usage = reported_usage(reply)
        if usage is None:  # a call of unknown usage: counted, not recorded
            lease.num_calls += 1
        else:
            frame.governor.record_call(lease, **usage, elapsed_s=elapsed_s)


def _at_ceiling(
    frame: Frame, turn: Turn, output: Any, context: list[BaseMessage], tokens: int
) -> Any:
    lease, governor = turn.lease, frame.governor
    reducer = frame.governance.reducer
    if turn.push or not can_replace(output, reducer=reducer):  # nowhere to write it
        reserve = governor.reply_reserve(lease)
        raise CeilingExceeded(lease.agent.name, tokens + reserve, lease.ceiling_tokens)
    messages, _ = compact(governor, lease, context)  # may raise
    if messages is None:
        return output
    lease.tokens_in_context = frame.scope.tally.count(messages)
    return replace_messages(output, frame.governance.messages_key, messages, reducer=reducer)


def _reduce(
    frame: Frame,
    lease: Lease,
    message: BaseMessage,
    calls: Mapping[str, Mapping[str, Any]],
    question: str | None,
) -> BaseMessage:
    if not isinstance(message, ToolMessage):
        return message
    reduced = frame.scope.reduced
    done = reduced.get(id(message))
    if done is not None and done[0] is message:
        return done[1]
    text = text_of(message.content)
    result: BaseMessage = message
    budget = lease.agent.tool_output_tokens
    # A result that fits is left as it is without asking the policy, which would only
    # count it again.
    if (
        text is not None
        and budget is not None
        and frame.scope.tally.count_content(message, text) > budget
    ):
        call = calls.get(message.tool_call_id) or {}
        reduction = frame.governor.reduce_tool_output(
            lease,
            text,
            tool=message.name or call.get("name"),
            arguments=call.get("args"),
            question=question,
        )
        if reduction.changed:
            result = message.model_copy(update={"content": reduction.text})
    reduced[id(message)] = (message, result)
    reduced[id(result)] = (result, result)
    return result


def _merge(
    reducer: object, seen: list[BaseMessage] | None, added: list[BaseMessage]
) -> list[BaseMessage]:
    """The messages the state will hold after the node: its reducer's merge."""
    if reducer is None:
        return added
    left = list(seen or ())
    if is_add_messages(reducer):
        appended = _appended(left, added)
        if appended is not None:
            return appended
    try:
        merged = reducer(left, list(added))  # type: ignore[operator]  # a channel's reducer: callable
    except (ValueError, TypeError):  # a removal of a message this node did not see
        merged = None
    if not isinstance(merged, list):
        return [*left, *(m for m in added if not isinstance(m, RemoveMessage))]
    return merged


def _appended(left: list[BaseMessage], added: list[BaseMessage]) -> list[BaseMessage] | None:
    """``add_messages(left, added)`` where it only appends, without calling it; None
    where it would do more. ``added`` may hold messages of ``left`` themselves (a
    subgraph returns the state it was given): those stay where they are. It only appends
    when no new message removes one or has the id of one already there (or of another
    new one)."""
    present = {id(m) for m in left}
    new = [m for m in added if id(m) not in present]
    ids = set()
    for message in new:
        if isinstance(message, RemoveMessage):
            return None
        if message.id is not None:
            if message.id in ids:
                return None
            ids.add(message.id)
    if ids and any(m.id in ids for m in left):
        return None
    return [*left, *new]


def _has_tool_results(messages: list[BaseMessage] | None) -> bool:
    return any(isinstance(message, ToolMessage) for message in messages or ())


def _describe(calls: list[Mapping[str, Any]]) -> tuple[str, Mapping[str, Any] | None]:
    """The tool name (names, comma-joined) and arguments that ``tool_call`` records."""
    if len(calls) == 1:
        return str(calls[0].get("name")), calls[0].get("args")
    return ", ".join(str(call.get("name")) for call in calls) or "tools", None
