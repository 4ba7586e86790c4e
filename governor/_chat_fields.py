"""Chat messages as ``governor.tokens.TokenCounter`` reads them: a chat dict (``role``,
``content``, ``name``, ``tool_call_id``, ``tool_calls`` in OpenAI's form or LangChain's)
or a LangChain-style message object (``type`` and ``content``, its role from its type).

``chat_fields`` gives what the overhead rule counts, ``as_dict`` the dict a chat
template renders, and ``text_of`` the text of a content (a string or a list of parts,
of which only text parts count).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["ChatFields", "as_dict", "chat_fields", "text_of"]

# LangChain message types (chunks are "AIMessageChunk" and so on) to chat roles.
_LANGCHAIN_ROLES = {"human": "user", "ai": "assistant"}

# A message as the overhead rule reads it: role, content, name, tool call id, and its
# tool calls as (function name, arguments) pairs.
ChatFields = tuple[Any, Any, Any, Any, list[tuple[Any, Any]]]


def chat_fields(message: Any, index: int) -> ChatFields:
    """A chat dict's or a LangChain-style message's fields (``ChatFields``)."""
    if isinstance(message, Mapping):
        calls = []
        for call in message.get("tool_calls") or ():
            function = call.get("function", call) if isinstance(call, Mapping) else {}
            arguments = function.get("arguments", function.get("args", ""))
            calls.append((function.get("name", ""), arguments))
        get = message.get
        return get("role", ""), get("content"), get("name"), get("tool_call_id"), calls
    fields = _fields_of(message, index)
    kind = str(fields("type")).removesuffix("MessageChunk").lower()
    role = fields("role") or _LANGCHAIN_ROLES.get(kind, kind)
    calls = [(call.get("name"), call.get("args", {})) for call in fields("tool_calls") or ()]
    return role, fields("content"), fields("name"), fields("tool_call_id"), calls


def as_dict(message: Any, index: int) -> dict[str, Any]:
    """A chat message as a plain dict (for a chat template); LangChain-style objects are
    mapped to roles, and their tool calls to OpenAI's form."""
    if isinstance(message, Mapping):
        chat = dict(message)
    else:
        role, content, name, tool_call_id, _ = chat_fields(message, index)
        chat = {"role": role, "content": content}
        if name:
            chat["name"] = name
        if tool_call_id:
            chat["tool_call_id"] = tool_call_id
        calls = _fields_of(message, index)("tool_calls")
        if calls:
            chat["tool_calls"] = [
                {
                    "id": call.get("id"),
                    "type": "function",
                    "function": {"name": call.get("name"), "arguments": call.get("args", {})},
                }
                for call in calls
            ]
    content = chat.get("content")
    if isinstance(content, list):  # LangChain allows bare strings among the parts
        chat["content"] = [
            {"type": "text", "text": part} if isinstance(part, str) else part for part in content
        ]
    return chat


def _fields_of(message: object, index: int) -> Callable[[str], Any]:
    """``name -> getattr(message, name, None)`` for a LangChain-style message (one with
    ``type`` and ``content``). A pydantic model (a LangChain message) answers a missing
    attribute by raising inside its ``__getattr__``, which costs 2 us, and most messages
    miss two or three; so where the class defines none of the fields itself (as a
    property, say), they are read from the instance's ``__dict__``."""
    fields = getattr(message, "__dict__", None)
    kind = type(message)
    plain = _PLAIN.get(kind)
    if plain is None:
        plain = _PLAIN[kind] = not any(
            name in base.__dict__ for base in kind.__mro__ for name in _CHAT_FIELD_NAMES
        )
    if plain and isinstance(fields, dict) and "type" in fields and "content" in fields:
        return fields.get
    if hasattr(message, "type") and hasattr(message, "content"):
        return lambda name: getattr(message, name, None)
    raise TypeError(
        f"message {index} is a {type(message).__name__}; pass dicts with 'role' and "
        "'content', or LangChain messages"
    )


_CHAT_FIELD_NAMES = ("type", "content", "role", "name", "tool_call_id", "tool_calls")
# class -> whether it (or a base) defines none of _CHAT_FIELD_NAMES: _fields_of's memo.
_PLAIN: dict[type, bool] = {}


def text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(
        part
        if isinstance(part, str)  # LangChain allows bare strings among the parts
        else str(part.get("text", ""))
        for part in content
        if isinstance(part, str)
        or (isinstance(part, Mapping) and part.get("type", "text") == "text")
    )
