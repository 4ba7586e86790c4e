"""Compaction by summary: fold the oldest turns into one running-summary message.

``SummarizeOldest`` keeps every system message, the first user message and as many of
the latest turns as fit, and replaces the turns before them with one message::

    {"role": "user", "content": "[Summary of N earlier messages]\\n<summary>"}

It is a user message rather than a system one because many chat templates accept a
system message only at the start. ``N`` counts the original messages it stands for. The
summary holds, within ``summary_tokens`` tokens (fewer when less room is left), what the
user and the model said in the span, verbatim, one ``role: content`` line per message
(instructions and decisions, which no tool can give back), then the summarizer's
reduction (``ExtractiveSummarizer`` over the counter in use by default) of the rest: the
tool calls and their results. When what was said does not fit on its own, it alone is
reduced (the summarizer keeps its tail and head lines first) and the tool output goes. A
running summary from an earlier compaction is folded into the next one, its count carried
over and its said lines kept as said. An assistant message that calls tools and its
results are summarized or kept together; when no whole turn can be kept (an agent loop
answering one user message), the loop's rounds are folded from the oldest instead. When
even the head, a summary and the last turn do not fit it raises ``CeilingExceeded``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from governor import CeilingExceeded, CompactionEvent, TokenCounter, ToolOutputPolicy
from policies._conversation import Compaction, Split, check_setting, splits
from policies.extractive_summarizer import ExtractiveSummarizer

__all__ = ["SummarizeOldest"]

_SUMMARY = re.compile(r"\[Summary of (\d+) earlier messages?\]\n")
_SAID = ("user: ", "assistant: ")  # a summary's lines of what was said


class SummarizeOldest:
    """A ``CeilingPolicy`` that replaces the oldest turns with one running summary."""

    def __init__(
        self,
        summarizer: ToolOutputPolicy | None = None,
        summary_tokens: int = 256,
        *,
        agent: str = "agent",
    ) -> None:
        check_setting("summary_tokens", summary_tokens, 1)
        self._summarizer = summarizer
        self._summary_tokens = summary_tokens
        self._agent = agent

    def __repr__(self) -> str:
        return (
            f"SummarizeOldest(summarizer={self._summarizer!r}, "
            f"summary_tokens={self._summary_tokens}, agent={self._agent!r})"
        )

    def compact(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        ceiling_tokens: int,
        reserve_tokens: int,
        counter: TokenCounter,
    ) -> tuple[list[dict[str, Any]], CompactionEvent]:
        run = Compaction.start(
            messages, ceiling_tokens=ceiling_tokens, reserve_tokens=reserve_tokens, counter=counter
        )
        if run.fits:
            return run.unchanged()
        room = run.room
        summarizer = self._summarizer or ExtractiveSummarizer(counter)
        tokens = run.before
        for parts in splits(messages):  # whole turns first, then an agent loop's rounds
            found = self._fold(messages, parts, room, summarizer, counter)
            if found is not None:
                kept, tokens = found
                gone = len(messages) - len(kept) + 1  # the summary stands in for them
                return kept, run.event("summarize_oldest", kept, tokens, summarized=gone)
        raise CeilingExceeded(self._agent, tokens + reserve_tokens, ceiling_tokens)

    def _fold(
        self,
        messages: Sequence[Mapping[str, Any]],
        parts: Split,
        room: int,
        summarizer: ToolOutputPolicy,
        counter: TokenCounter,
    ) -> tuple[list[dict[str, Any]], int] | None:
        """The latest turns that fit with a summary of the ones before, or None."""
        for k in range(len(parts.turns) - 1, 0, -1):
            span = [i for turn in parts.turns[:-k] for i in turn]
            kept_indexes = parts.head + [i for turn in parts.turns[-k:] for i in turn]
            folded, said, rest = _span(messages, span)
            empty = _build(messages, span, kept_indexes, folded, "")
            budget = min(self._summary_tokens, room - counter.count_messages(empty))
            while budget >= 1:
                body = _body(said, rest, budget, summarizer, counter)
                kept = _build(messages, span, kept_indexes, folded, body)
                tokens = counter.count_messages(kept)
                if tokens <= room:
                    return kept, tokens
                budget -= tokens - room  # BPE merges at the seam: shrink and retry
        return None


def _build(
    messages: Sequence[Mapping[str, Any]], span: list[int], keep: list[int], folded: int, body: str
) -> list[dict[str, Any]]:
    """The kept messages in their order, the summary where the span began."""
    note = {"role": "user", "content": f"[Summary of {folded} earlier messages]\n{body}"}
    placed = [(float(i), dict(messages[i])) for i in keep]
    placed.append((span[0] - 0.5, note))
    return [message for _, message in sorted(placed, key=lambda item: item[0])]


def _body(
    said: list[str],
    rest: list[str],
    budget: int,
    summarizer: ToolOutputPolicy,
    counter: TokenCounter,
) -> str:
    """What was said, verbatim, then the rest reduced to the room left; or, when what was
    said alone is over ``budget``, what was said reduced (its first and last lines first)."""
    head = "\n".join(said)
    left = budget - counter.count(head + "\n") if said else budget
    if left < 0:
        return summarizer.reduce(head, budget_tokens=budget).text
    while left >= 1 and rest:
        tail = summarizer.reduce("\n".join(rest), budget_tokens=left).text
        body = f"{head}\n{tail}" if said else tail
        over = counter.count(body) - budget
        if over <= 0:
            return body
        left -= over  # BPE merges at the seam: shrink and retry
    return head


def _span(
    messages: Sequence[Mapping[str, Any]], span: list[int]
) -> tuple[int, list[str], list[str]]:
    """How many original messages the span stands for, the lines the user and the model
    said (one per message), and the lines of the rest: tool calls and results."""
    folded = 0
    said: list[str] = []
    rest: list[str] = []
    for i in span:
        message = messages[i]
        role = str(message.get("role", ""))
        content = _text(message.get("content"))
        match = _SUMMARY.match(content) if role == "user" else None
        if match is not None:  # an earlier running summary: fold it in
            folded += int(match.group(1))
            for line in content[match.end() :].split("\n"):
                (said if line.startswith(_SAID) else rest).append(line)
            continue
        folded += 1
        if content and role in ("user", "assistant"):
            one_line = content.replace("\n", " ")  # a said line is one line, folded or not
            said.append(f"{role}: {one_line}")
        elif content:
            label = f"tool ({message.get('tool_call_id')})" if role == "tool" else role
            rest.append(f"{label}: {content}")
        for call in message.get("tool_calls") or ():
            function = call.get("function", call) if isinstance(call, Mapping) else {}
            arguments = function.get("arguments", function.get("args", ""))
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments, ensure_ascii=False)
            rest.append(f"{role} called {function.get('name', '')}({arguments})")
    return folded, said, rest


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "\n".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, Mapping) and part.get("type", "text") == "text"
        )
    return "" if content is None else str(content)
