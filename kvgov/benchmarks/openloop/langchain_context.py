"""What a LangChain user's agent sends at each call of the open-loop workload, its raw
history brought under the model's context window by LangChain's own functions.

Two handlings, each run as ``kvgov bench context`` runs them (the real objects):

- ``trim_messages``: ``langchain_core.messages.trim_messages`` on the whole history at
  every call, ``strategy="last"``, ``include_system=True``, ``start_on`` a human or an AI
  message (so a tool result is never kept without the call that asked for it),
  ``allow_partial=False``, ``max_tokens`` the model's window less the call's reply.
- ``context_editing``: ``ContextEditingMiddleware`` with ``ClearToolUsesEdit`` (its
  ``trigger``, ``keep`` the latest results whole, tool inputs kept), called through its
  ``wrap_model_call`` on the whole history at every call, as the middleware edits a copy
  of the agent's state before each model call. Where the edited history is still over
  the window, it is trimmed as above (``HandledScripts.num_trimmed_after_edit``): the
  request a user's model would refuse.

The open-loop history is chat text (an assistant message ending ``Calling {json}``, then
a user message ``Tool result:`` with its output); it is read as LangChain's tool-call
messages (an ``AIMessage`` with the call, a ``ToolMessage`` answering it) and written
back in the same text, a cleared result as ``Tool result:`` and the placeholder, so
every system's prompts are in one format. Tokens are the engine's (``counter``), each
message counted once: a chat's count is its messages' sum and the reply's priming (the
template renders each message alone), which ``system`` checks against the ids sent.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from governor import TokenCounter
from kvgov.benchmarks.swarm.workload import AgentScript, Message

__all__ = ["CONTEXT_EDITING", "HANDLINGS", "TRIM", "ContextHandling", "HandledScripts", "handle"]

TRIM = "trim_messages"
CONTEXT_EDITING = "context_editing"
HANDLINGS = (TRIM, CONTEXT_EDITING)
_CALLING = "\nCalling "
_RESULT = "Tool result:\n"


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextHandling:
    """A LangChain user's context handling: ``name`` one of ``HANDLINGS``; the model's
    context window; context editing's ``trigger_tokens`` and ``keep``."""

    name: str
    window_tokens: int
    trigger_tokens: int | None = None
    keep: int = 3  # ClearToolUsesEdit's default

    def __post_init__(self) -> None:
        if self.name not in HANDLINGS:
            raise ValueError(f"context handling {self.name!r} is not one of {HANDLINGS}")
        if self.name == CONTEXT_EDITING and not (
            isinstance(self.trigger_tokens, int) and 0 < self.trigger_tokens <= self.window_tokens
        ):
            raise ValueError(
                f"context editing needs trigger_tokens, an int in 1-{self.window_tokens:,} "
                f"(the window), got {self.trigger_tokens!r}"
            )
        if not (isinstance(self.keep, int) and self.keep >= 0):
            raise ValueError(
                f"context editing's keep is the tool results kept whole, an int of at least "
                f"0, got {self.keep!r}"
            )

    @property
    def label(self) -> str:
        if self.name == TRIM:
            return f"trim_messages (last, at the {self.window_tokens:,}-token window)"
        return (
            f"ContextEditingMiddleware + ClearToolUsesEdit (trigger {self.trigger_tokens:,}, "
            f"keep {self.keep})"
        )


@dataclass(frozen=True, slots=True)
class HandledScripts:
    scripts: tuple[AgentScript, ...]
    num_trimmed_after_edit: int  # calls context editing left over the window


def handle(
    scripts: Sequence[AgentScript], handling: ContextHandling, counter: TokenCounter
) -> HandledScripts:
    """``scripts`` (raw histories) with every call's messages as ``handling`` sends them;
    each call's tools, latencies and replies unchanged."""
    out = []
    num_trimmed = 0
    for script in scripts:
        agent = _Agent(counter)
        turns = []
        for turn in script.turns:
            room = handling.window_tokens - (turn.reply_tokens or 0)
            history = agent.read(turn.messages)
            if handling.name == CONTEXT_EDITING:
                history = _edited(history, handling, agent.count)
                if agent.count(history) > room:
                    num_trimmed += 1
                    history = _trimmed(history, room, agent.count)
            elif agent.count(history) > room:
                history = _trimmed(history, room, agent.count)
            turns.append(dataclasses.replace(turn, messages=agent.write(history)))
        out.append(dataclasses.replace(script, turns=tuple(turns)))
    return HandledScripts(tuple(out), num_trimmed)


class _Agent:
    """One agent's history as LangChain messages, each message read and counted once (a
    history repeats every message of the call before)."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self.lc: dict[int, Any] = {}  # id() of a history's message -> its LangChain message
        # A LangChain message's id -> the message it was read from, and its content then.
        self.original: dict[str, tuple[Message, str]] = {}
        self.costs: dict[tuple[str, str], int] = {}
        probe: Message = {"role": "user", "content": "x"}
        # What counting a chat adds once, beyond its messages: the reply's priming.
        self.primer = 2 * counter.count_messages([probe]) - counter.count_messages([probe] * 2)

    def read(self, messages: Sequence[Message]) -> list[Any]:
        from langchain_core.messages import (
            AIMessage,
            BaseMessage,
            HumanMessage,
            SystemMessage,
            ToolMessage,
        )

        out: list[BaseMessage] = []
        for index, message in enumerate(messages):
            known = self.lc.get(id(message))
            if known is None:
                key, role, content = f"m{len(self.original)}", message["role"], message["content"]
                call = _call(content) if role == "assistant" else None
                if role == "system":
                    known = SystemMessage(content, id=key)
                elif role == "assistant":
                    calls = [] if call is None else [{**call, "id": key, "type": "tool_call"}]
                    known = AIMessage(content, id=key, tool_calls=calls)
                elif (
                    content.startswith(_RESULT)
                    and out
                    and isinstance(out[-1], AIMessage)  # the only kind that calls tools
                    and out[-1].tool_calls
                ):
                    asked = out[-1].tool_calls[0]["id"]
                    known = ToolMessage(content[len(_RESULT) :], id=key, tool_call_id=asked)
                else:
                    known = HumanMessage(content, id=key)
                self.lc[id(message)] = known
                text = known.content
                assert isinstance(text, str)  # made from text just above
                self.original[key] = (message, text)
            assert index or known.type == "system", "a history starts with its system prompt"
            out.append(known)
        return out

    def write(self, history: Sequence[Any]) -> tuple[Message, ...]:
        out = []
        for m in history:
            original, content = self.original[m.id]
            if m.content != content:  # a tool result context editing cleared
                original = {"role": "user", "content": _RESULT + m.content}
            out.append(original)
        return tuple(out)

    def count(self, history: Sequence[Any]) -> int:
        total = self.primer
        for m in history:
            key = (m.id, m.content)
            cost = self.costs.get(key)
            if cost is None:
                cost = self.costs[key] = (
                    self.counter.count_messages(list(self.write([m]))) - self.primer
                )
            total += cost
        return total


def _call(said: str) -> dict[str, Any] | None:
    """The tool call an assistant message ends in (``Calling {json}``), if any."""
    at = said.rfind(_CALLING)
    if at < 0:
        return None
    call = json.loads(said[at + len(_CALLING) :])
    return {"name": call["tool"], "args": call["arguments"]}


def _trimmed(history: list[Any], max_tokens: int, count: Callable[[list[Any]], int]) -> list[Any]:
    from langchain_core.messages import trim_messages

    return trim_messages(
        history,
        max_tokens=max_tokens,
        token_counter=count,
        strategy="last",
        include_system=True,
        start_on=("human", "ai"),
        allow_partial=False,
    )


def _edited(
    history: list[Any], handling: ContextHandling, count: Callable[[list[Any]], int]
) -> list[Any]:
    from langchain.agents.middleware import ClearToolUsesEdit, ContextEditingMiddleware
    from langchain.agents.middleware.types import ModelRequest
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel

    system, *rest = history
    edit = ClearToolUsesEdit(
        trigger=handling.trigger_tokens or 0, keep=handling.keep, clear_tool_inputs=False
    )
    # The middleware counts the messages it is given, without the system prompt.
    middleware = ContextEditingMiddleware(
        edits=[edit], token_counter=lambda messages: count([system, *messages])
    )
    # The handler stands in for the model: it records what the model would be sent.
    request = ModelRequest(
        model=GenericFakeChatModel(messages=iter(())), messages=rest, system_message=system
    )
    seen: list[Any] = []
    middleware.wrap_model_call(request, seen.append)  # type: ignore[arg-type]  # reply unread
    return [system, *seen[0].messages]
