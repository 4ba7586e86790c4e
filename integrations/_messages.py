"""LangChain messages as the governor's chat dicts, and back, for ``integrations.langchain``.

Private to integrations/. ``GovernorMiddleware`` and ``GovernedChatModel`` both speak to
the governor in chat dicts (``role``, ``content``, and ``name``, ``tool_calls``,
``tool_call_id`` where they apply); this is the one place that converts.

- ``to_chat`` maps a message the way ``TokenCounter.count_messages`` maps a LangChain
  message itself (for string content the counts are the same): ``human`` is
  ``user``, ``ai`` is ``assistant``, a tool call is ``{"id", "type": "function",
  "function": {"name", "arguments"}}`` with the arguments as a dict. Content made only
  of text parts is joined into one string (chat templates take strings); other content
  lists are kept, bare strings among them made text parts.
- ``from_chat`` builds a new message from a dict a policy wrote (a running summary).
- ``restore`` maps the dicts a ceiling policy returned back onto the original message
  objects. Policies keep the order of what they keep and copy kept dicts unchanged, so
  the dicts are matched to the originals in order by equality: a match is the original
  object itself (its id and identity kept, so state updates can name it), anything
  else is a new message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolCall,
    ToolMessage,
)

__all__ = ["from_chat", "restore", "text_of", "to_chat", "to_chats"]

_ROLES = {"human": "user", "ai": "assistant"}


def to_chat(message: BaseMessage) -> dict[str, Any]:
    """One message as a chat dict (see the module docstring)."""
    kind = message.type.removesuffix("MessageChunk").lower()
    chat: dict[str, Any] = {
        "role": getattr(message, "role", None) or _ROLES.get(kind, kind),
        "content": _content(message.content),
    }
    if message.name:
        chat["name"] = message.name
    if isinstance(message, ToolMessage) and message.tool_call_id:
        chat["tool_call_id"] = message.tool_call_id
    if isinstance(message, AIMessage) and message.tool_calls:
        chat["tool_calls"] = [
            {
                "id": call.get("id"),
                "type": "function",
                "function": {"name": call.get("name"), "arguments": call.get("args", {})},
            }
            for call in message.tool_calls
        ]
    return chat


def to_chats(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    return [to_chat(message) for message in messages]


def from_chat(chat: Mapping[str, Any]) -> BaseMessage:
    """A new message for a chat dict that stands for no original one."""
    role = chat.get("role")
    content = chat.get("content")
    content = "" if content is None else content
    name = chat.get("name")
    if role == "user":
        return HumanMessage(content=content, name=name)
    if role == "system":
        return SystemMessage(content=content, name=name)
    if role == "assistant":
        calls = [_tool_call(call) for call in chat.get("tool_calls") or ()]
        return AIMessage(content=content, name=name, tool_calls=calls)
    if role == "tool":
        return ToolMessage(content=content, name=name, tool_call_id=str(chat.get("tool_call_id")))
    return ChatMessage(role=str(role), content=content, name=name)


def restore(
    compacted: Sequence[Mapping[str, Any]],
    originals: Sequence[BaseMessage],
    chats: Sequence[Mapping[str, Any]],
) -> list[BaseMessage]:
    """Messages for the dicts a policy returned; ``chats`` are ``to_chats(originals)``.

    Each dict equal to the next unmatched original's dict (in order) is that original
    object; any other dict becomes a new message (``from_chat``)."""
    assert len(chats) == len(originals), "chats are the originals' dicts"
    restored: list[BaseMessage] = []
    start = 0
    for chat in compacted:
        match = next((j for j in range(start, len(chats)) if chats[j] == chat), None)
        if match is None:
            restored.append(from_chat(chat))
        else:
            restored.append(originals[match])
            start = match + 1
    return restored


def text_of(content: str | list[str | dict[str, Any]]) -> str | None:
    """A message's text, or None when its content holds anything but text."""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, Mapping) and part.get("type") == "text":
            parts.append(str(part.get("text", "")))
        else:
            return None
    return "".join(parts)


def _tool_call(call: Mapping[str, Any]) -> ToolCall:
    function = call.get("function", call)
    arguments = function.get("arguments", function.get("args", {}))
    if isinstance(arguments, str):  # OpenAI's wire format: JSON text
        arguments = json.loads(arguments) if arguments else {}
    return ToolCall(id=call.get("id"), name=str(function.get("name", "")), args=dict(arguments))


def _content(content: str | list[str | dict[str, Any]]) -> Any:
    text = text_of(content)
    if text is not None:
        return text
    return [{"type": "text", "text": part} if isinstance(part, str) else part for part in content]
