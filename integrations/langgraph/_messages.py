"""Chat messages in LangGraph node inputs and outputs, for ``integrations.langgraph``.

Private to integrations/. A node reads its messages from its input (a state dict, a state
object, a bare list, or a ``Send`` payload) and returns them in its output (a dict, a
``Command``'s update, or a list of those). These helpers find them, rewrite them, say
that the state's messages become others, and count them. Converting them to the
governor's chat dicts and back is ``integrations._messages``'s.

``Tally`` counts a context message by message and remembers each message's count by
identity for one run, so a context that grows by a turn costs the new turn, not the
whole conversation again. That is exact only without a chat template (the counter's
overhead rule is per message); with one, every count renders the whole conversation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, RemoveMessage, convert_to_messages
from langgraph.graph.message import REMOVE_ALL_MESSAGES, add_messages
from langgraph.types import Command

from governor import TokenCounter

__all__ = [
    "Rewrite",
    "Tally",
    "can_replace",
    "is_add_messages",
    "messages_in",
    "messages_out",
    "replace_messages",
    "rewrite_messages",
    "tool_calls",
]

Rewrite = Callable[[list[BaseMessage]], list[BaseMessage]]


def messages_in(value: Any, key: str) -> list[BaseMessage] | None:
    """The messages a node was given, or None when its input holds none."""
    if isinstance(value, Mapping):
        found = value.get(key)
    elif isinstance(value, list):
        found = None if value and _is_call(value[-1]) else value
    else:
        found = getattr(value, key, None)
    return _as_messages(found)


def calling_messages(value: Any, key: str) -> list[BaseMessage] | None:
    """The messages before a tools node's calls: its input's, or, for the one call a
    ``ToolCallWithContext`` carries, those of the state it carries."""
    found = messages_in(value, key)
    if found is None and isinstance(value, Mapping) and isinstance(value.get("state"), Mapping):
        return messages_in(value["state"], key)
    return found


def messages_out(output: Any, key: str) -> list[BaseMessage] | None:
    """The messages a node returned (every update's, in order), or None for none."""
    if type(output) is dict:  # the usual node output: one update
        return _as_messages(output.get(key))
    found: list[BaseMessage] = []
    any_found = False
    for update in _updates(output):
        if isinstance(update, BaseMessage):
            found.append(update)
            any_found = True
            continue
        messages = _as_messages(update.get(key)) if isinstance(update, Mapping) else None
        if messages is not None:
            found.extend(messages)
            any_found = True
    return found if any_found else None


def rewrite_messages(output: Any, key: str, rewrite: Rewrite) -> Any:
    """``output`` with every list of messages it returns passed through ``rewrite``."""
    if isinstance(output, Mapping) and key in output:
        messages = _as_messages(output[key])
        if messages is None:
            return output
        return {**output, key: rewrite(messages)}
    if isinstance(output, Command) and isinstance(output.update, Mapping):
        return dataclasses.replace(output, update=rewrite_messages(output.update, key, rewrite))
    if isinstance(output, list):
        if output and all(isinstance(m, BaseMessage) for m in output):
            return rewrite(list(output))
        return [rewrite_messages(item, key, rewrite) for item in output]
    return output


def can_replace(output: Any, *, reducer: object) -> bool:
    """Whether ``replace_messages`` can say that the state's messages become others: with
    no reducer or ``add_messages``, in a node output of no update, a dict, or a
    ``Command`` whose update is a dict."""
    if reducer is not None and not is_add_messages(reducer):
        return False  # a reducer that only appends
    if output is None or isinstance(output, Mapping):
        return True
    return isinstance(output, Command) and (
        output.update is None or isinstance(output.update, Mapping)
    )


def replace_messages(output: Any, key: str, messages: list[BaseMessage], *, reducer: object) -> Any:
    """``output`` changed so that the state's messages become ``messages``; only where
    ``can_replace`` says it can."""
    assert can_replace(output, reducer=reducer), "checked with can_replace first"
    written: list[BaseMessage] = (
        messages if reducer is None else [RemoveMessage(id=REMOVE_ALL_MESSAGES), *messages]
    )
    if output is None:
        return {key: written}
    if isinstance(output, Mapping):
        return {**output, key: written}
    return dataclasses.replace(output, update={**(output.update or {}), key: written})


def is_add_messages(reducer: object) -> bool:
    return reducer is add_messages or getattr(reducer, "func", None) is add_messages


def tool_calls(messages: Sequence[BaseMessage] | None, value: Any) -> list[Mapping[str, Any]]:
    """The tool calls a tools node runs, as ``ToolNode`` reads its input: a list of
    calls, the one call a ``ToolCallWithContext`` carries, or those of the latest
    assistant message that made calls."""
    if isinstance(value, list) and value and _is_call(value[-1]):
        return [call for call in value if _is_call(call)]
    if isinstance(value, Mapping) and isinstance(value.get("tool_call"), Mapping):
        return [value["tool_call"]]
    for message in reversed(messages or ()):
        if isinstance(message, AIMessage) and message.tool_calls:
            return list(message.tool_calls)
    return []


class Tally:
    """Counts contexts for one run, each message once (see the module docstring)."""

    __slots__ = ("_counter", "_known", "_per_message", "_priming")

    def __init__(self, counter: TokenCounter) -> None:
        self._counter = counter
        self._per_message = not counter.has_chat_template
        self._priming = counter.count_messages([]) if self._per_message else 0
        # id(message) -> (message, its tokens); the message is held so its id stays
        # unique. Entries are only added (one dict store each, atomic under the GIL).
        self._known: dict[int, tuple[BaseMessage, int]] = {}

    def known(self, message: BaseMessage) -> bool:
        return id(message) in self._known

    def count(self, messages: Sequence[BaseMessage]) -> int:
        """``counter.count_messages(messages)``, from the per-message counts."""
        if not self._per_message:
            for message in messages:
                self._known.setdefault(id(message), (message, 0))
            return self._counter.count_messages(messages)
        total = self._priming
        for message in messages:
            entry = self._known.get(id(message))
            if entry is None or entry[0] is not message:
                entry = self._known[id(message)] = (message, self._counter.count_message(message))
            total += entry[1]
        return total

    def count_content(self, message: BaseMessage, text: str) -> int:
        """Tokens of ``text``, the whole text of ``message``'s content. The message's own
        count is kept on the way: its content adds to it, less a chat template."""
        counter = self._counter
        tokens = counter.count(text)
        if self._per_message and id(message) not in self._known:
            whole = counter.count_message(message, content_tokens=tokens)
            self._known[id(message)] = (message, whole)
        return tokens


def _is_call(value: object) -> bool:
    return isinstance(value, Mapping) and value.get("type") == "tool_call"


def _as_messages(found: Any) -> list[BaseMessage] | None:
    if isinstance(found, BaseMessage):
        return [found]
    if not isinstance(found, list):
        return None
    for message in found:
        if not isinstance(message, BaseMessage):
            break
    else:
        return found
    try:  # dicts, tuples and strings, as add_messages coerces them
        return convert_to_messages(found)
    except (ValueError, TypeError, NotImplementedError):  # not messages after all
        return None


def _updates(output: Any) -> list[Any]:
    if isinstance(output, Command):
        update = output.update
        if isinstance(update, Mapping):
            return [update]
        if isinstance(update, list | tuple):  # (key, value) pairs
            return [dict(pair for pair in update if isinstance(pair, tuple) and len(pair) == 2)]
        return []
    if isinstance(output, list):
        if output and all(isinstance(m, BaseMessage) for m in output):
            return list(output)
        return [u for item in output for u in _updates(item)]
    return [output]
