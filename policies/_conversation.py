"""Shared by the compaction policies: splitting a conversation into atomic turns.

Private to policies/. The head (every system message and the first user message) is
always kept. The rest is split into units that are kept or removed whole: an assistant
message with ``tool_calls`` together with the ``role: "tool"`` messages after it that
answer one of its calls, or any other single message. A tool message that answers no
call before it travels with the unit before it, so it is never kept alone. Units are
grouped into turns; a turn starts at each user message. ``by_round`` splits finer: a
turn also starts at each assistant unit after the first since the last user message, so
the rounds of an agent loop that answer one user message (model, tools, model,
tools...) can be dropped one by one when even the latest whole turn does not fit.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from governor import CompactionEvent, ConfigError, TokenCounter

Turn = list[int]  # indexes into the conversation, in order


@dataclass(frozen=True, slots=True)
class Split:
    head: list[int]  # system messages and the first user message
    turns: list[Turn]  # the rest, oldest first


@dataclass(slots=True)
class Compaction:
    """One ``compact`` call's measurements: what it started from, and its event."""

    messages: Sequence[Mapping[str, Any]]
    before: int  # tokens of the conversation as given
    room: int  # tokens the result may take: the ceiling less the reply's reserve
    started: float = field(default_factory=time.perf_counter)

    @classmethod
    def start(
        cls,
        messages: Sequence[Mapping[str, Any]],
        *,
        ceiling_tokens: int,
        reserve_tokens: int,
        counter: TokenCounter,
    ) -> Compaction:
        check_limits(ceiling_tokens, reserve_tokens)
        before = counter.count_messages(messages)
        return cls(messages, before, ceiling_tokens - reserve_tokens)

    @property
    def fits(self) -> bool:
        return self.before <= self.room

    def unchanged(self) -> tuple[list[dict[str, Any]], CompactionEvent]:
        kept = [dict(message) for message in self.messages]
        return kept, self.event("none", kept, self.before)

    def event(
        self, method: str, kept: Sequence[Mapping[str, Any]], after: int, *, summarized: int = 0
    ) -> CompactionEvent:
        return CompactionEvent(
            method=method,
            tokens_before=self.before,
            tokens_after=after,
            messages_before=len(self.messages),
            messages_after=len(kept),
            # A summary replaces what it summarizes: those count as dropped too.
            dropped=summarized or len(self.messages) - len(kept),
            summarized=summarized,
            elapsed_s=time.perf_counter() - self.started,
        )


def check_limits(ceiling_tokens: int, reserve_tokens: int) -> None:
    if not _whole(ceiling_tokens) or ceiling_tokens < 1:
        raise ConfigError.below_minimum("ceiling_tokens", ceiling_tokens, 1)
    if not _whole(reserve_tokens) or reserve_tokens < 0:
        raise ConfigError.below_minimum("reserve_tokens", reserve_tokens, 0)


def check_setting(name: str, value: object, minimum: int) -> None:
    if not _whole(value) or value < minimum:
        raise ConfigError.below_minimum(name, value, minimum)


def _whole(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def split(messages: Sequence[Mapping[str, Any]], *, by_round: bool = False) -> Split:
    head: list[int] = []
    seen_user = False
    units: list[list[int]] = []
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "system" or (role == "user" and not seen_user):
            seen_user = seen_user or role == "user"
            head.append(index)
            continue
        if role == "tool" and units:
            # A result of the unit's call, or an orphan that answers no call before it:
            # either way it stays with the unit before it.
            units[-1].append(index)
            continue
        units.append([index])
    turns: list[Turn] = []
    answered = False  # the current turn has an assistant unit already
    for unit in units:
        role = messages[unit[0]].get("role")
        if not turns or role == "user" or (by_round and answered and role == "assistant"):
            turns.append([])
            answered = False
        turns[-1].extend(unit)
        answered = answered or role == "assistant"
    return Split(head, turns)


def splits(messages: Sequence[Mapping[str, Any]]) -> tuple[Split, Split]:
    """By turn, then by round: what a policy tries when whole turns cannot fit."""
    return split(messages), split(messages, by_round=True)


def call_ids(message: Mapping[str, Any]) -> set[str]:
    ids: set[str] = set()
    for call in message.get("tool_calls") or ():
        if isinstance(call, Mapping) and call.get("id") is not None:
            ids.add(str(call["id"]))
    return ids


def pick(messages: Sequence[Mapping[str, Any]], indexes: Sequence[int]) -> list[dict[str, Any]]:
    return [dict(messages[i]) for i in sorted(indexes)]
