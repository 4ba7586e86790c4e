"""``GovernedNode``: a LangGraph node's runnable, run inside its agent's lease.

Private to integrations/. ``govern`` puts one in place of each governed node's
``PregelNode.bound`` (and of every ``ToolNode``'s). Per execution it takes the lease its
frame plans (``integrations._graph_frame``), makes it the enclosing lease while the node
runs (so a subgraph's nodes find it), and settles the node's output within the lease:

- a tools node runs inside ``governor.tool_call``: the lease is idle meanwhile;
- the tool results the node returns are reduced to the agent's ``tool_output_tokens``
  by the governor's tool-output policy, each result once per run;
- the context the node leaves behind (the messages it saw merged with those it
  returned, by the state's own reducer) is counted into ``lease.tokens_in_context``;
  each assistant message it adds counts as one model call (``lease.num_calls``);
- when that context and the reply's reserve would pass the ceiling, the governor's
  ceiling policy decides (``governor.compact``): the default raises ``CeilingExceeded``;
  a compacting policy's result replaces the state's messages (``RemoveMessage`` of all
  with ``add_messages``, a plain write without a reducer). A node reached by ``Send``
  writes to a state its siblings share, so it is never compacted there: it raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, RemoveMessage, ToolMessage
from langchain_core.runnables import Runnable, RunnableConfig

from governor import AgentSpec, CeilingExceeded, Lease
from integrations._graph_frame import Frame, Turn, frame_of, lease_scope, reset_lease
from integrations._graph_messages import (
    from_chat,
    messages_in,
    messages_out,
    replace_messages,
    rewrite_messages,
    text_of,
    to_chat,
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
        frame = frame_of(config)
        turn = None if frame is None else self._plan(frame, config, input)
        if frame is None or turn is None:
            return self.inner.invoke(input, config, **kwargs)
        frame.begin(turn)
        error: BaseException | None = None
        try:
            token = lease_scope(turn.lease)
            try:
                if self.tool_node:
                    name, arguments = _describe(frame, input)
                    with frame.governor.tool_call(turn.lease, name, arguments):
                        output = self.inner.invoke(input, config, **kwargs)
                else:
                    output = self.inner.invoke(input, config, **kwargs)
            finally:
                reset_lease(token)
            return settle(frame, turn, input, output)
        except BaseException as exc:
            error = exc
            raise
        finally:
            frame.end(turn, error)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        frame = frame_of(config)
        turn = None if frame is None else self._plan(frame, config, input)
        if frame is None or turn is None:
            return await self.inner.ainvoke(input, config, **kwargs)
        await frame.abegin(turn)
        error: BaseException | None = None
        try:
            token = lease_scope(turn.lease)
            try:
                if self.tool_node:
                    name, arguments = _describe(frame, input)
                    async with frame.governor.tool_call(turn.lease, name, arguments):
                        output = await self.inner.ainvoke(input, config, **kwargs)
                else:
                    output = await self.inner.ainvoke(input, config, **kwargs)
            finally:
                reset_lease(token)
            return settle(frame, turn, input, output)
        except BaseException as exc:
            error = exc
            raise
        finally:
            frame.end(turn, error)

    def _plan(self, frame: Frame, config: RunnableConfig | None, value: Any) -> Turn | None:
        assert config is not None  # frame_of found a frame in it
        return frame.plan(
            self.node, self.spec, tool_node=self.tool_node, config=config, value=value
        )


def settle(frame: Frame, turn: Turn, value: Any, output: Any) -> Any:
    """The node's output, its tool results reduced and its context counted (and
    compacted, or refused, at the ceiling)."""
    lease = turn.lease
    governance = frame.governance
    key = governance.messages_key
    seen = messages_in(value, key)
    if lease.agent.tool_output_tokens is not None:
        calls = {str(call.get("id")): call for call in tool_calls(seen, value)}
        output = rewrite_messages(
            output, key, lambda messages: [_reduce(frame, lease, m, calls) for m in messages]
        )
    added = messages_out(output, key)
    if added is None and seen is None:
        return output
    tally = frame.scope.tally
    if added:
        frame.note_calls(lease, added)
        old = {id(m) for m in seen or ()}
        lease.num_calls += sum(
            1 for m in added if isinstance(m, AIMessage) and id(m) not in old and not tally.known(m)
        )
    if added is None:  # it only read: its context is at least what it saw
        context = seen or []
        tokens = max(lease.tokens_in_context, tally.count(context))
    else:
        context = _merge(governance.reducer, seen, added)
        tokens = tally.count(context)
    lease.tokens_in_context = tokens
    if tokens + _reserve(frame, lease) > lease.ceiling_tokens:
        output = _at_ceiling(frame, turn, output, context, tokens)
    return output


def _at_ceiling(
    frame: Frame, turn: Turn, output: Any, context: list[BaseMessage], tokens: int
) -> Any:
    lease, governor = turn.lease, frame.governor
    compacted, event = governor.compact(lease, [to_chat(m) for m in context])  # may raise
    if not event.changed:
        return output
    skip = 0  # a registered prefix the governor put first is not the state's
    if lease.agent.prefix is not None:
        prefix = governor.prefixes.lookup(
            lease.agent.prefix, tenant=lease.tenant, agent=lease.agent.name
        )
        skip = len(prefix.messages)
    messages = from_chat(compacted, context, skip_new=skip)
    replaced = None
    if not turn.push:
        key, reducer = frame.governance.messages_key, frame.governance.reducer
        replaced = replace_messages(output, key, messages, reducer=reducer)
    if replaced is None:  # nowhere to write the compacted conversation
        reserve = _reserve(frame, lease)
        raise CeilingExceeded(lease.agent.name, tokens + reserve, lease.ceiling_tokens)
    lease.tokens_in_context = frame.scope.tally.count(messages)
    return replaced


def _reduce(
    frame: Frame, lease: Lease, message: BaseMessage, calls: Mapping[str, Mapping[str, Any]]
) -> BaseMessage:
    if not isinstance(message, ToolMessage):
        return message
    reduced = frame.scope.reduced
    done = reduced.get(id(message))
    if done is not None and done[0] is message:
        return done[1]
    text = text_of(message)
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
            lease, text, tool=message.name or call.get("name"), arguments=call.get("args")
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
    try:
        merged = reducer(left, list(added))  # type: ignore[operator]
    except (ValueError, TypeError):  # a removal of a message this node did not see
        merged = None
    if not isinstance(merged, list):
        return [*left, *(m for m in added if not isinstance(m, RemoveMessage))]
    return merged


def _reserve(frame: Frame, lease: Lease) -> int:
    return frame.governor.reply_reserve(lease)


def _describe(frame: Frame, value: Any) -> tuple[str, Mapping[str, Any] | None]:
    """The tool name (names, comma-joined) and arguments that ``tool_call`` records."""
    calls = tool_calls(messages_in(value, frame.governance.messages_key), value)
    if len(calls) == 1:
        return str(calls[0].get("name")), calls[0].get("args")
    return ", ".join(str(call.get("name")) for call in calls) or "tools", None
