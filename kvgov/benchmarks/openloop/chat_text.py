"""The open-loop workload's histories are chat text: an assistant message that calls a
tool ends in ``Calling {json}``, and the next message is a user message ``Tool result:``
with the tool's output. Every system sends its prompts in that one format, so the ids
the engine is sent differ only by what each handling keeps.

A governor or a LangChain agent sees the same history as tool-call messages: this module
reads the text as OpenAI-style messages (an assistant message with ``tool_calls``, a
``tool`` message answering it by ``tool_call_id``) and writes them back as text, the
same text for the messages left as they were. ``workload`` compacts the history in that
form, as kvgov's ceiling policy sees it under LangGraph; ``langchain_context`` reads the
same calls into LangChain's messages.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from governor import TokenCounter

__all__ = ["CALLING", "RESULT", "TextCounter", "as_calls", "as_text", "call_of", "calling"]

CALLING = "\nCalling "
RESULT = "Tool result:\n"

Message = Mapping[str, Any]


def calling(name: str, arguments: Mapping[str, Any]) -> str:
    """The line that ends an assistant message calling ``name`` with ``arguments``."""
    return f"{CALLING}{json.dumps({'tool': name, 'arguments': arguments})}"


def call_of(said: str) -> tuple[str, str, dict[str, Any]] | None:
    """An assistant message's words, and the tool and arguments it ends in calling; None
    when it calls none."""
    at = said.rfind(CALLING)
    if at < 0:
        return None
    call = json.loads(said[at + len(CALLING) :])
    return said[:at], call["tool"], call["arguments"]


def as_calls(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """``messages`` (chat text) as OpenAI-style tool-call messages: each call gets the id
    ``call-<index of its message>``, and a ``Tool result:`` right after it answers it."""
    out: list[dict[str, Any]] = []
    asked: str | None = None  # the id of the call the message before made
    for index, message in enumerate(messages):
        role, content = message["role"], message["content"]
        call = call_of(content) if role == "assistant" else None
        if call is not None:
            words, name, arguments = call
            asked = f"call-{index}"
            function = {"name": name, "arguments": json.dumps(arguments)}
            out.append(
                {
                    "role": "assistant",
                    "content": words,
                    "tool_calls": [{"id": asked, "type": "function", "function": function}],
                }
            )
            continue
        if role == "user" and asked is not None and content.startswith(RESULT):
            out.append({"role": "tool", "tool_call_id": asked, "content": content[len(RESULT) :]})
        else:
            out.append(dict(message))
        asked = None
    return out


def as_text(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """``as_calls``'s messages (and any others) back as chat text."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message["role"]
        if role == "tool":
            out.append({"role": "user", "content": RESULT + str(message["content"])})
        elif role == "assistant" and message.get("tool_calls"):
            (call,) = message["tool_calls"]
            function = call["function"]
            tail = calling(function["name"], json.loads(function["arguments"]))
            out.append({"role": "assistant", "content": str(message["content"]) + tail})
        else:
            out.append(dict(message))
    return out


class TextCounter:
    """Counts ``as_calls``'s messages as the chat text they are sent as (``as_text``), by
    ``counter``: a ceiling policy that reads tool calls holds the prompt the engine gets
    under its ceiling."""

    def __init__(self, counter: TokenCounter) -> None:
        self._counter = counter

    def count(self, text: str) -> int:
        return self._counter.count(text)

    def truncate(self, text: str, max_tokens: int) -> str:
        return self._counter.truncate(text, max_tokens)

    def count_messages(self, messages: Sequence[Message]) -> int:
        return self._counter.count_messages(as_text(messages))
