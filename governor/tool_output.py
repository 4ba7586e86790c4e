"""The tool-output protocol: a tool result over its budget is reduced before it is appended.

The governor owns the protocol; implementations live in policies/ (``ExtractiveSummarizer``
and the model-backed ``LLMSummarizer``). Every reduction is a ``ToolOutputReduction``: the
new text and a record of what it cost and what it removed, so that each decision is
explicit.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["ToolOutputPolicy", "ToolOutputReduction", "reduce_output"]


@dataclass(frozen=True, slots=True)
class ToolOutputReduction:
    """One reduced tool output and its record.

    ``method`` names how it was reduced (``"none"`` when the text already fit);
    ``elided`` lists what was removed as ``(what, count)`` pairs, such as
    ``("lines", 1999)`` or ``("json items", 497)``, in the order first removed.
    ``detail`` says in words why this method was used when it was not the policy's
    first choice (``"llm timed out after 2 s"`` before an extractive fallback), or
    what was done first; empty when there is nothing to add.
    """

    text: str
    tokens_before: int
    tokens_after: int
    method: str
    elapsed_s: float
    elided: tuple[tuple[str, int], ...] = ()
    detail: str = ""

    @property
    def tokens_saved(self) -> int:
        return self.tokens_before - self.tokens_after

    @property
    def changed(self) -> bool:
        return self.method != "none"


@runtime_checkable
class ToolOutputPolicy(Protocol):
    """Reduces a tool's output to at most ``budget_tokens`` tokens.

    ``tool_name`` and ``arguments`` describe the call that produced the output, and
    ``question`` is the agent's last request before it (the latest user or assistant
    turn with text), so a policy can keep what the caller asked about. A policy never
    returns more than ``budget_tokens`` tokens and raises ``ConfigError`` for a budget
    below 1. Policies written before ``question`` existed still work: the governor passes
    it only to a ``reduce`` that takes it (``reduce_output``).
    """

    def reduce(
        self,
        text: str,
        *,
        budget_tokens: int,
        tool_name: str | None = None,
        arguments: Mapping[str, Any] | None = None,
        question: str | None = None,
    ) -> ToolOutputReduction: ...


def reduce_output(
    policy: ToolOutputPolicy,
    text: str,
    *,
    budget_tokens: int,
    tool_name: str | None = None,
    arguments: Mapping[str, Any] | None = None,
    question: str | None = None,
) -> ToolOutputReduction:
    """``policy.reduce``, given ``question`` where its signature takes it."""
    if question is not None and _takes_question(policy):
        return policy.reduce(
            text,
            budget_tokens=budget_tokens,
            tool_name=tool_name,
            arguments=arguments,
            question=question,
        )
    return policy.reduce(
        text, budget_tokens=budget_tokens, tool_name=tool_name, arguments=arguments
    )


def _takes_question(policy: ToolOutputPolicy) -> bool:
    try:
        parameters = inspect.signature(policy.reduce).parameters.values()
    except (TypeError, ValueError):  # no signature to read: call it as the old protocol
        return False
    return any(p.name == "question" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
