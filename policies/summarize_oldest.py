"""Compaction by summary: fold the oldest turns into one running-summary message.

``SummarizeOldest`` keeps every system message, the first user message and as many of the
latest turns as fit, and replaces the turns before them with one user message,
``[Summary of N earlier messages]``. What the user said has the first claim on the
summary's room; an assistant message that calls tools and its results are summarized or
kept together; when even the head, a summary and the last turn do not fit it raises
``CeilingExceeded``. What the summary keeps, how it shares its room, and ``compact_to``:
docs/design/summarizers.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from governor import (
    CeilingExceeded,
    CompactionEvent,
    ConfigError,
    TokenCounter,
    ToolOutputPolicy,
)
from policies._conversation import Compaction, Split, check_setting, splits
from policies.extractive_summarizer import ExtractiveSummarizer

__all__ = ["SummarizeOldest"]

_SUMMARY = re.compile(r"\[Summary of (\d+) earlier messages?\]\n")
_SAID = ("user: ", "assistant: ")  # a summary's lines of what was said
_CALLED = re.compile(r"([A-Za-z_][\w.-]*)\((.*?)\) -> ")  # a summary's line of a call
# The fewest tokens a folded result keeps; below it the oldest results go instead.
_LEAST_RESULT_TOKENS = 24


class SummarizeOldest:
    """A ``CeilingPolicy`` that replaces the oldest turns with one running summary."""

    def __init__(
        self,
        summarizer: ToolOutputPolicy | None = None,
        summary_tokens: int = 256,
        *,
        compact_to: float = 1.0,
        agent: str = "agent",
    ) -> None:
        check_setting("summary_tokens", summary_tokens, 1)
        if not (
            isinstance(compact_to, (int, float))
            and not isinstance(compact_to, bool)
            and 0 < compact_to <= 1
        ):
            raise ConfigError(
                f"compact_to must be a share of the ceiling in (0, 1], got {compact_to!r}; "
                "pass 1 to compact to the ceiling, or less (such as 0.8) to leave room for "
                "the next calls to append to a cached prompt",
                setting="compact_to",
            )
        self._summarizer = summarizer
        self._summary_tokens = summary_tokens
        self._compact_to = float(compact_to)
        self._agent = agent

    def __repr__(self) -> str:
        return (
            f"SummarizeOldest(summarizer={self._summarizer!r}, "
            f"summary_tokens={self._summary_tokens}, compact_to={self._compact_to:g}, "
            f"agent={self._agent!r})"
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
        summarizer = self._summarizer or ExtractiveSummarizer(counter)
        tokens = run.before
        # Under the ceiling by compact_to where that fits, else to the brim.
        share = self._compact_to
        under = (max(1, int(run.room * share)), max(1, int(self._summary_tokens * share)))
        for room, summary in dict.fromkeys((under, (run.room, self._summary_tokens))):
            for parts in splits(messages):  # whole turns first, then an agent loop's rounds
                found = self._fold(messages, parts, room, summary, summarizer, counter)
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
        summary_tokens: int,
        summarizer: ToolOutputPolicy,
        counter: TokenCounter,
    ) -> tuple[list[dict[str, Any]], int] | None:
        """The latest turns that fit with a summary of the ones before, or None. The
        summary keeps its room: the most turns that leave ``summary_tokens`` for it (or
        what the folded span holds, where less), else the most that leave any."""
        for whole in (True, False):
            for k in range(len(parts.turns) - 1, 0, -1):
                span = [i for turn in parts.turns[:-k] for i in turn]
                kept_indexes = parts.head + [i for turn in parts.turns[-k:] for i in turn]
                folded, said, rest = _span(messages, span)
                empty = _build(messages, span, kept_indexes, folded, "")
                free = room - counter.count_messages(empty)
                if whole and free < min(summary_tokens, _size(said, rest, counter)):
                    continue
                found = self._within(
                    messages,
                    span,
                    kept_indexes,
                    (folded, said, rest),
                    (room, free, summary_tokens),
                    summarizer,
                    counter,
                )
                if found is not None:
                    return found
        return None

    def _within(
        self,
        messages: Sequence[Mapping[str, Any]],
        span: list[int],
        kept_indexes: list[int],
        folded_span: tuple[int, list[str], list[_Entry]],
        sizes: tuple[int, int, int],
        summarizer: ToolOutputPolicy,
        counter: TokenCounter,
    ) -> tuple[list[dict[str, Any]], int] | None:
        """The kept messages with a summary of the span (of at most ``summary_tokens``)
        in the ``free`` tokens of ``room`` they leave (``sizes``: the three), or None
        where it does not fit."""
        folded, said, rest = folded_span
        room, free, summary_tokens = sizes
        budget = min(summary_tokens, free)
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


def _size(said: list[str], rest: list[_Entry], counter: TokenCounter) -> int:
    """Tokens of a span's summary body kept whole: what was said and every call."""
    return sum(counter.count(line) + 1 for line in said) + sum(
        counter.count(e.text()) + 1 for e in rest
    )


@dataclass(slots=True)
class _Entry:
    """One folded tool call and what it returned, as a summary holds it: one line
    ``name(arguments) -> result``, the result's further lines after it. A result whose
    call is not in the span has ``tool(<call id>)`` for its call; text from any other
    message stands alone."""

    call: str = ""
    content: str = ""
    tool_name: str | None = None
    arguments: Mapping[str, Any] | None = None
    gisted: bool = False  # read back from an earlier summary: its lines most telling first

    def text(self, content: str | None = None) -> str:
        content = self.content if content is None else content
        return f"{self.call} -> {content}" if self.call else content


def _body(
    said: list[str],
    rest: list[_Entry],
    budget: int,
    summarizer: ToolOutputPolicy,
    counter: TokenCounter,
) -> str:
    """What was said, verbatim, then the tool calls and their results in the room left.
    Where they do not all fit, what the user said comes first, whole; what the model
    said keeps a share of the room left in proportion to its part of the span's tokens
    (``_said_within``), and the calls and results the rest (``_results_within``): a
    model that narrates at length never crowds every tool result out of the summary."""
    head = "\n".join(said)
    if said:
        room = budget
        results = sum(counter.count(e.text()) + 1 for e in rest)
        if rest and counter.count(head) + results > budget:
            lines = [(line, counter.count(line) + 1) for line in said]
            users = sum(n for line, n in lines if line.startswith("user: "))
            models = sum(n for line, n in lines if not line.startswith("user: "))
            room = min(budget, users + (budget - users) * models // (models + results))
        head = _said_within(said, room, summarizer, counter)
    left = budget - counter.count(head + "\n") if head else budget
    while left >= 1 and rest:
        tail = _results_within(rest, left, summarizer, counter)
        if not tail:
            break
        body = f"{head}\n{tail}" if head else tail
        over = counter.count(body) - budget
        if over <= 0:
            return body
        left -= over  # BPE merges at the seams: shrink and retry
    return head


def _said_within(
    said: list[str], room: int, summarizer: ToolOutputPolicy, counter: TokenCounter
) -> str:
    """What was said within ``room`` tokens: every line where all fit; else whole lines,
    the user's first and then the model's, the latest of each first, in their order;
    where not even the user's lines fit, the summarizer's reduction of them (their
    first and last lines first); the model's alone leave nothing where none fits."""
    whole = "\n".join(said)
    if counter.count(whole) <= room:
        return whole
    order = sorted(range(len(said)), key=lambda i: (not said[i].startswith("user: "), -i))
    kept: set[int] = set()
    used = -1  # a newline between lines, none after the last
    for i in order:
        cost = counter.count(said[i]) + 1
        if used + cost <= room:
            kept.add(i)
            used += cost
    users = [line for line in said if line.startswith("user: ")]
    if users and not any(said[i].startswith("user: ") for i in kept) and room >= 1:
        return summarizer.reduce("\n".join(users), budget_tokens=room).text
    return "\n".join(said[i] for i in sorted(kept))


def _results_within(
    rest: list[_Entry], room: int, summarizer: ToolOutputPolicy, counter: TokenCounter
) -> str:
    """The tool calls and results within about ``room`` tokens: each call with its
    result whole where all fit. Else, with a summarizer that gives gists
    (``ExtractiveSummarizer.gist``), each call with its result's gist (the summarizer
    told its tool and arguments) in an equal share, the shorter ones whole and their
    room shared by the rest; the oldest go first while a share would leave a result
    fewer than ``_LEAST_RESULT_TOKENS``. With any other summarizer, its reduction of
    them all at once. Empty where nothing fits."""
    whole = "\n".join(e.text() for e in rest)
    if counter.count(whole) <= room:
        return whole
    gist = getattr(summarizer, "gist", None)
    if not callable(gist):
        return summarizer.reduce(whole, budget_tokens=room).text
    sizes = [counter.count(e.text()) + 1 for e in rest]  # and the newline between
    fixed = [counter.count(e.text("")) + 1 for e in rest]  # the call's line alone
    first = 0
    while first < len(rest):
        cap = _level(sizes[first:], room)
        cut = [f for f, size in zip(fixed[first:], sizes[first:], strict=True) if size > cap]
        if not cut or cap >= max(cut) + _LEAST_RESULT_TOKENS:
            break
        first += 1  # the oldest call and its result go
    else:
        return ""
    parts = []
    for entry, size, own in zip(rest[first:], sizes[first:], fixed[first:], strict=True):
        if size <= cap:
            parts.append(entry.text())
            continue
        if entry.gisted:  # a gist already: a shorter one is its first lines
            kept = _leading(entry.content, cap - own, counter)
        else:
            kept = gist(
                entry.content,
                budget_tokens=cap - own,
                tool_name=entry.tool_name,
                arguments=entry.arguments,
            )
        parts.append(entry.text(kept))
    return "\n".join(parts)


def _leading(text: str, budget: int, counter: TokenCounter) -> str:
    """The first lines of ``text`` within ``budget`` tokens; the first line's longest
    prefix where not even it fits."""
    lines = text.split("\n")
    used = -1
    for n, line in enumerate(lines):
        used += counter.count(line) + 1
        if used > budget:
            kept = "\n".join(lines[:n])
            break
    else:
        kept = text
    while kept and counter.count(kept) > budget:  # BPE merges at the seams
        kept = kept.rsplit("\n", 1)[0] if "\n" in kept else ""
    return kept or counter.truncate(lines[0], budget)


def _level(sizes: list[int], room: int) -> int:
    """The most tokens each may keep so that their sum fits ``room``: the water level
    over ``sizes`` (each keeps ``min(size, level)``)."""
    left, count = room, len(sizes)
    for size in sorted(sizes):
        if size * count > left:
            return left // count
        left -= size
        count -= 1
    return max(sizes, default=0)


def _span(
    messages: Sequence[Mapping[str, Any]], span: list[int]
) -> tuple[int, list[str], list[_Entry]]:
    """How many original messages the span stands for, the lines the user and the model
    said (one per message), and the tool calls with their results, in order."""
    folded = 0
    said: list[str] = []
    rest: list[_Entry] = []
    by_id: dict[str, _Entry] = {}  # a call's id -> its entry, for the result answering it
    for i in span:
        message = messages[i]
        role = str(message.get("role", ""))
        content = _text(message.get("content"))
        match = _SUMMARY.match(content) if role == "user" else None
        if match is not None:  # an earlier running summary: fold it in
            folded += int(match.group(1))
            lines = content[match.end() :].split("\n")
            said += [line for line in lines if line.startswith(_SAID)]
            rest += _entries([line for line in lines if not line.startswith(_SAID)])
            continue
        folded += 1
        if content and role in ("user", "assistant"):
            one_line = content.replace("\n", " ")  # a said line is one line, folded or not
            said.append(f"{role}: {one_line}")
        elif role == "tool":
            call_id = str(message.get("tool_call_id"))
            entry = by_id.pop(call_id, None)
            if entry is None:
                entry = _Entry(call=f"tool({call_id})")
                rest.append(entry)
            entry.content = content
        elif content:
            rest.append(_Entry(content=f"{role}: {content}"))
        for call in message.get("tool_calls") or ():
            function = call.get("function", call) if isinstance(call, Mapping) else {}
            name = str(function.get("name", ""))
            arguments = function.get("arguments", function.get("args", ""))
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments, ensure_ascii=False)
            entry = _Entry(f"{name}({arguments})", "", name or None, _arguments(arguments))
            rest.append(entry)
            if isinstance(call, Mapping) and call.get("id") is not None:
                by_id[str(call["id"])] = entry
    return folded, said, rest


def _entries(lines: list[str]) -> list[_Entry]:
    """An earlier summary's tool calls and results, read back from its lines: a line
    ``name(arguments) -> ...`` starts an entry, every other line continues the one
    before it."""
    out: list[_Entry] = []
    for line in lines:
        called = _CALLED.match(line)
        if called is not None:
            name, arguments = called.group(1), called.group(2)
            call, content = line[: called.end(2) + 1], line[called.end() :]
            out.append(_Entry(call, content, name, _arguments(arguments), gisted=True))
        elif out:
            out[-1].content += "\n" + line
        elif line:
            out.append(_Entry(content=line))
    return out


def _arguments(text: str) -> Mapping[str, Any] | None:
    """A call's arguments as a mapping, where they are a JSON object."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, Mapping) else None


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
