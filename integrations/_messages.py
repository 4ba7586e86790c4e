"""LangChain messages as the governor's chat dicts, and back: the one converter.

Private to integrations/. ``GovernorMiddleware``, ``GovernedChatModel`` and ``govern``'s
nodes all speak to the governor in chat dicts (``role``, ``content``, and ``name``,
``tool_calls``, ``tool_call_id`` where they apply); this is the one place that converts.

- ``to_chat`` maps a message the way ``TokenCounter.count_messages`` maps a LangChain
  message itself (for string content the counts are the same): ``human`` is
  ``user``, ``ai`` is ``assistant``, a tool call is ``{"id", "type": "function",
  "function": {"name", "arguments"}}`` with the arguments as a dict. Content made only
  of text parts is joined into one string (chat templates take strings); other content
  lists are kept, bare strings among them made text parts. With ``ids=True`` a message's
  id rides along under ``"id"`` (kept by the policies, which copy dicts, and ignored by
  the counter) for ``restore``; never in what is sent to a backend.
- ``from_chat`` builds a new message from a dict a policy wrote (a running summary).
- ``restore`` maps the dicts a ceiling policy returned back onto the original message
  objects: a dict whose ``"id"`` names an original, or (without one) that equals the
  next unmatched original's dict in order, is that original object (its id and identity
  kept, so state updates can name it; a copy with the new content when the policy
  changed it); anything else is a new message. ``compact`` runs ``Governor.compact`` on
  messages and restores its result, the registered prefix the governor put first left
  out (it is not the caller's).
- ``usage_metadata`` and ``reported_usage`` carry a call's usage between a
  ``GenerationResult`` and an ``AIMessage``'s ``usage_metadata``.
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
from langchain_core.messages.ai import UsageMetadata

from governor import CompactionEvent, GenerationResult, Governor, Lease

__all__ = [
    "ID_KEY",
    "compact",
    "from_chat",
    "last_request",
    "reported_usage",
    "restore",
    "text_of",
    "to_chat",
    "to_chats",
    "usage_metadata",
]

ID_KEY = "id"
_REQUEST_CHARS = 2_000  # a request is read for its terms; a long one's end holds the ask
_ROLES = {"human": "user", "ai": "assistant"}


def to_chat(message: BaseMessage, *, ids: bool = False) -> dict[str, Any]:
    """One message as a chat dict (see the module docstring)."""
    kind = message.type.removesuffix("MessageChunk").lower()
    chat: dict[str, Any] = {
        "role": (message.role if isinstance(message, ChatMessage) else None)
        or _ROLES.get(kind, kind),
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
    if ids and message.id is not None:
        chat[ID_KEY] = message.id
    return chat


def to_chats(messages: Sequence[BaseMessage], *, ids: bool = False) -> list[dict[str, Any]]:
    return [to_chat(message, ids=ids) for message in messages]


def from_chat(chat: Mapping[str, Any]) -> BaseMessage:
    """A new message for a chat dict that stands for no original one."""
    role = chat.get("role")
    content = chat.get("content")
    content = "" if content is None else content
    fields: dict[str, Any] = {"content": content, "name": chat.get("name"), "id": chat.get(ID_KEY)}
    if role == "user":
        return HumanMessage(**fields)
    if role == "system":
        return SystemMessage(**fields)
    if role == "assistant":
        calls = [_tool_call(call) for call in chat.get("tool_calls") or ()]
        return AIMessage(**fields, tool_calls=calls)
    if role == "tool":
        return ToolMessage(**fields, tool_call_id=str(chat.get("tool_call_id") or ""))
    return ChatMessage(**fields, role=str(role))


def restore(
    compacted: Sequence[Mapping[str, Any]],
    originals: Sequence[BaseMessage],
    chats: Sequence[Mapping[str, Any]],
    *,
    prefix: Sequence[Mapping[str, Any]] = (),
) -> list[BaseMessage]:
    """Messages for the dicts a policy returned (see the module docstring); ``chats`` are
    ``to_chats(originals)``, with or without ids. The leading dicts equal to ``prefix``,
    in order, are left out."""
    assert len(chats) == len(originals), "chats are the originals' dicts"
    by_id = {chat[ID_KEY]: j for j, chat in enumerate(chats) if chat.get(ID_KEY) is not None}
    restored: list[BaseMessage] = []
    start = skipped = 0
    for chat in compacted:
        if not restored and skipped < len(prefix) and chat == prefix[skipped]:
            skipped += 1
            continue
        match = by_id.get(chat.get(ID_KEY))
        if match is None:
            match = next((j for j in range(start, len(chats)) if chats[j] == chat), None)
        if match is None:
            restored.append(from_chat(chat))
            continue
        original = originals[match]
        if chats[match] != chat:  # the policy rewrote it: same message, new content
            original = original.model_copy(update={"content": chat.get("content")})
        restored.append(original)
        start = match + 1
    return restored


def compact(
    governor: Governor,
    lease: Lease,
    messages: Sequence[BaseMessage],
    *,
    max_tokens: int | None = None,
) -> tuple[list[BaseMessage] | None, CompactionEvent]:
    """``governor.compact`` on ``messages``, its result restored onto them (the prefix the
    governor put first left out); None for the messages when nothing changed. Raises
    what the ceiling policy raises."""
    chats = to_chats(messages, ids=True)
    compacted, event = governor.compact(lease, chats, max_tokens=max_tokens)
    if not event.changed:
        return None, event
    sent, _ = governor.with_prefix(lease, chats)
    prefix = sent[: len(sent) - len(chats)]
    return restore(compacted, messages, chats, prefix=prefix), event


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


def last_request(messages: Sequence[BaseMessage] | None) -> str | None:
    """The agent's last request before a tool call: the text of the latest user or
    assistant message that has any (an assistant message that only calls tools has none),
    its last ``_REQUEST_CHARS`` characters; None when there is none."""
    for message in reversed(messages or ()):
        if isinstance(message, (HumanMessage, AIMessage)):
            text = text_of(message.content)
            if text and text.strip():
                return text.strip()[-_REQUEST_CHARS:]
    return None


def usage_metadata(result: GenerationResult) -> UsageMetadata:
    """A governed call's exact usage, as LangChain reports it."""
    return UsageMetadata(
        input_tokens=result.prompt_tokens,
        output_tokens=result.completion_tokens,
        total_tokens=result.prompt_tokens + result.completion_tokens,
        input_token_details={"cache_read": result.cached_tokens},
    )


def reported_usage(reply: AIMessage) -> dict[str, Any] | None:
    """The usage a model reported with ``reply``, as ``Governor.record_call``'s keywords
    (``prompt_tokens``, ``completion_tokens``, ``cached_tokens``, ``finish_reason``);
    None when it reported none."""
    usage = reply.usage_metadata
    if usage is None:
        return None
    details = usage.get("input_token_details") or {}
    finish = reply.response_metadata.get("finish_reason")
    return {
        "prompt_tokens": usage["input_tokens"],
        "completion_tokens": usage["output_tokens"],
        "cached_tokens": details.get("cache_read") or 0,
        "finish_reason": finish if isinstance(finish, str) else "stop",
    }


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
