"""``kvgov bench context``: the facts an agent's context keeps when it is compacted to fit.

The conversations of ``kvgov.benchmarks.context_workload`` (tool-using agents whose tool
outputs are the evaluation seeds' cases of ``policies.benchmarks.tool_outputs``, one of
every kind, with their facts, and facts the user states; one conversation per seed, 10,
or 3 with ``--quick``) are brought under each token budget (``BUDGETS``) by three
methods, each as its users run it:

- ``kvgov``: the tool-output and ceiling policies a user configures
  (``Policies(tool_output=ExtractiveSummarizer(counter), ceiling=SummarizeOldest(...))``
  with ``AgentSpec(tool_output_tokens=budget // 8, ceiling_tokens=budget)``), called
  directly in the order the governor calls them: each tool output reduced as it is
  appended, and before each model call the history, when it is over the ceiling,
  compacted and kept compacted (as ``GovernorMiddleware`` writes it back to the agent's
  state); the summary takes at most a quarter of the budget, and no reply reserve is
  kept (every method gets the whole budget).
- ``context_editing``: LangChain's ``ContextEditingMiddleware`` with ``ClearToolUsesEdit``
  called through its ``wrap_model_call`` on the full history at the last model call (it
  edits a copy per call, never the state), triggered at the budget, tool inputs kept,
  counting with the same exact counter, and ``keep`` (the latest tool results left
  whole) the largest that brings the history under the budget, per conversation: better
  than any one setting a user could pick.
- ``trim_messages``: ``langchain_core.messages.trim_messages`` on the full history,
  ``strategy="last"``, ``include_system=True``, the same exact counter, and of
  ``start_on`` ("human", or "human" or "ai": both keep every tool result with its call)
  and ``allow_partial`` the setting that keeps the most facts at that budget.

Every context is measured the same way: tokens by ``TokenCounter().count_messages``
(cl100k, the chat overhead included), a fact kept when its exact text (a tool output's
fact: every one of its needles) is in the context's contents or tool-call arguments (a
case's arguments and question never hold all of its needles), a tool result orphaned
when no tool call before it has its id and a tool call orphaned when no result answers
it. Figures: ``facts_retained_pct_{method}_{budget}`` for every method and budget
(notes: tokens kept, orphans), ``facts_per_1k_tokens_{method}_{budget}`` (facts kept per
1,000 tokens of context), ``facts_retained_pct_{method}`` at the middle budget,
``facts_retained_kvgov_over_best_langchain`` (target >= 1.5) and
``orphaned_tool_results_kvgov`` over every budget (target 0). No model reads the
contexts: what a model would answer from them was not judged.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from governor import TokenCounter
from kvgov.benchmarks.context_workload import Conversation, build_conversations, context_text
from kvgov.benchmarks.figure import figure
from policies import ExtractiveSummarizer, SummarizeOldest
from policies.benchmarks.tool_outputs import EVALUATION_SEEDS

__all__ = ["BUDGETS", "METHODS", "Outcome", "run"]

BUDGETS = (4_000, 8_000, 16_000)
METHODS = ("kvgov", "context_editing", "trim_messages")
_BENCH = "context"
_QUICK = 3  # evaluation seeds with --quick
Messages = list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Outcome:
    """One conversation brought under one budget by one method."""

    found: tuple[tuple[str, bool], ...]  # each planted fact's kind, and whether it is there
    tokens: int
    orphaned_results: int
    orphaned_calls: int

    @property
    def facts_kept(self) -> int:
        return sum(kept for _, kept in self.found)

    @property
    def facts(self) -> int:
        return len(self.found)


def run(*, quick: bool = False) -> Iterator[Mapping[str, object]]:
    conversations = build_conversations(
        seeds=EVALUATION_SEEDS[:_QUICK] if quick else EVALUATION_SEEDS
    )
    counter = TokenCounter()
    results: dict[tuple[str, int], list[Outcome]] = {}
    settings: dict[int, str] = {}
    for budget in BUDGETS:
        results["kvgov", budget] = [
            measure(c, kvgov_context(c.messages, budget, counter), counter) for c in conversations
        ]
        results["context_editing", budget] = [
            measure(c, context_editing(c.messages, budget, counter), counter) for c in conversations
        ]
        results["trim_messages", budget], settings[budget] = _best_trim(
            conversations, budget, counter
        )
    for budget in BUDGETS:
        for method in METHODS:
            yield _row(method, budget, results[method, budget], settings[budget])
    for budget in BUDGETS:
        for method in METHODS:
            outcomes = results[method, budget]
            kept, tokens = sum(o.facts_kept for o in outcomes), sum(o.tokens for o in outcomes)
            yield figure(
                _BENCH,
                f"facts_per_1k_tokens_{method}_{budget}",
                1_000 * kept / tokens,
                "facts/1k tokens",
                note=f"{kept} facts in {tokens:,} tokens of context over {len(outcomes)} "
                "conversations",
            )
    middle = BUDGETS[len(BUDGETS) // 2]
    share = {m: _share(results[m, middle]) for m in METHODS}
    for method in METHODS:
        yield figure(
            _BENCH,
            f"facts_retained_pct_{method}",
            share[method],
            "%",
            note=f"at the middle budget, {middle:,} tokens, {len(conversations)} conversations",
        )
    best = max(("context_editing", "trim_messages"), key=lambda m: share[m])
    yield figure(
        _BENCH,
        "facts_retained_kvgov_over_best_langchain",
        share["kvgov"] / share[best] if share[best] else float("inf"),
        "x",
        target=1.5,
        note=f"kvgov {share['kvgov']:.1f}% over {best} {share[best]:.1f}% at {middle:,} tokens",
    )
    orphans = sum(o.orphaned_results for b in BUDGETS for o in results["kvgov", b])
    yield figure(
        _BENCH,
        "orphaned_tool_results_kvgov",
        orphans,
        "results",
        target=0,
        direction="lower",
        note=f"tool results without their call in kvgov's contexts, every budget "
        f"({', '.join(f'{b:,}' for b in BUDGETS)} tokens)",
    )


# -- the methods ---------------------------------------------------------------------------
SUMMARY_SHARE = 0.25  # of the ceiling, for the running summary unless a benchmark tunes it


def kvgov_compaction(
    reducer: ExtractiveSummarizer,
    ceiling_tokens: int,
    summary_share: float = SUMMARY_SHARE,
    compact_to: float = 1.0,
) -> SummarizeOldest:
    """kvgov's compaction as the benchmarks run it (here and ``kvgov bench openloop``'s
    workloads): a running summary of up to ``summary_share`` of the ceiling (a quarter
    unless given), the rest for the latest turns whole; each compaction to ``compact_to``
    of the ceiling where it can (to the ceiling unless given)."""
    return SummarizeOldest(
        reducer,
        summary_tokens=max(1, int(ceiling_tokens * summary_share)),
        compact_to=compact_to,
    )


def kvgov_context(
    messages: Sequence[Mapping[str, Any]], budget: int, counter: TokenCounter
) -> Messages:
    """The context of kvgov's last model call: tool outputs reduced on arrival, the history
    compacted (and kept compacted) before any model call that would exceed the ceiling."""
    reducer = ExtractiveSummarizer(counter)
    ceiling = kvgov_compaction(reducer, budget)
    calls = {
        call["id"]: call["function"]
        for message in messages
        for call in message.get("tool_calls") or ()
    }
    history: Messages = []
    request = ""  # the latest user or assistant words: what the middleware passes
    for message in messages:
        message = dict(message)
        if message["role"] == "tool":
            call = calls[message["tool_call_id"]]
            message["content"] = reducer.reduce(
                message["content"],
                budget_tokens=budget // 8,
                tool_name=call["name"],
                arguments=json.loads(call["arguments"]),
                question=request or None,
            ).text
        elif message["role"] in ("user", "assistant") and message.get("content"):
            request = message["content"]
        history.append(message)
        model_called_next = message["role"] in ("user", "tool")
        if model_called_next and counter.count_messages(history) > budget:
            history, _ = ceiling.compact(
                history, ceiling_tokens=budget, reserve_tokens=0, counter=counter
            )
    return history


def context_editing(
    messages: Sequence[Mapping[str, Any]], budget: int, counter: TokenCounter
) -> Messages:
    """What ``ContextEditingMiddleware`` sends the model at the last call, with the most
    tool results kept that still fits (``keep`` from all down to none)."""
    from langchain.agents.middleware import ClearToolUsesEdit, ContextEditingMiddleware
    from langchain.agents.middleware.types import ModelRequest
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel

    system, *rest = to_langchain(messages)
    count = _lc_counter(counter, head=[system])
    num_results = sum(1 for m in messages if m["role"] == "tool")
    sent: Messages = []
    for keep in range(num_results, -1, -1):
        edit = ClearToolUsesEdit(trigger=budget, keep=keep, clear_tool_inputs=False)
        middleware = ContextEditingMiddleware(edits=[edit], token_counter=count)
        # The handler stands in for the model: it records what the model would be sent.
        request = ModelRequest(
            model=GenericFakeChatModel(messages=iter(())), messages=rest, system_message=system
        )
        seen: list[Any] = []
        middleware.wrap_model_call(request, seen.append)  # type: ignore[arg-type]  # reply unread
        sent = from_langchain([seen[0].system_message, *seen[0].messages])
        if counter.count_messages(sent) <= budget:
            return sent
    return sent


def _best_trim(
    conversations: Sequence[Conversation], budget: int, counter: TokenCounter
) -> tuple[list[Outcome], str]:
    best: tuple[list[Outcome], str] | None = None
    for start_on in ("human", ("human", "ai")):
        for allow_partial in (False, True):
            outcomes = [
                measure(c, trim(c.messages, budget, counter, start_on, allow_partial), counter)
                for c in conversations
            ]
            if best is None or _share(outcomes) > _share(best[0]):
                label = start_on if isinstance(start_on, str) else " or ".join(start_on)
                best = outcomes, f"trim_messages start_on={label}, allow_partial={allow_partial}"
    assert best is not None
    return best


def trim(
    messages: Sequence[Mapping[str, Any]],
    budget: int,
    counter: TokenCounter,
    start_on: str | tuple[str, ...] = "human",
    allow_partial: bool = False,
) -> Messages:
    from langchain_core.messages import trim_messages

    kept = trim_messages(
        to_langchain(messages),
        max_tokens=budget,
        token_counter=_lc_counter(counter),
        strategy="last",
        include_system=True,
        start_on=start_on,
        allow_partial=allow_partial,
    )
    return from_langchain(kept)


# -- measuring -----------------------------------------------------------------------------
def measure(conversation: Conversation, context: Messages, counter: TokenCounter) -> Outcome:
    text = context_text(context)
    called: set[str] = set()
    answered: set[str] = set()
    orphaned_results = 0
    for message in context:
        for call in message.get("tool_calls") or ():
            called.add(call["id"])
        if message["role"] == "tool":
            answered.add(message["tool_call_id"])
            orphaned_results += message["tool_call_id"] not in called
    return Outcome(
        found=tuple((fact.kind, fact.kept_in(text)) for fact in conversation.facts),
        tokens=counter.count_messages(context),
        orphaned_results=orphaned_results,
        orphaned_calls=len(called - answered),
    )


def to_langchain(messages: Sequence[Mapping[str, Any]]) -> list[Any]:
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    out: list[Any] = []
    for m in messages:
        if m["role"] == "system":
            out.append(SystemMessage(m["content"]))
        elif m["role"] == "user":
            out.append(HumanMessage(m["content"]))
        elif m["role"] == "tool":
            out.append(ToolMessage(m["content"], tool_call_id=m["tool_call_id"]))
        else:
            calls = [
                {
                    "name": c["function"]["name"],
                    "args": json.loads(c["function"]["arguments"]),
                    "id": c["id"],
                    "type": "tool_call",
                }
                for c in m.get("tool_calls") or ()
            ]
            out.append(AIMessage(m["content"], tool_calls=calls))
    return out


def from_langchain(messages: Sequence[Any]) -> Messages:
    """LangChain messages back in the chat format they were made from."""
    roles = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool"}
    out: Messages = []
    for m in messages:
        message: dict[str, Any] = {"role": roles[m.type], "content": m.content}
        if m.type == "tool":
            message["tool_call_id"] = m.tool_call_id
        if m.type == "ai" and m.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": json.dumps(c["args"])},
                }
                for c in m.tool_calls
            ]
        out.append(message)
    return out


def _lc_counter(counter: TokenCounter, head: Sequence[Any] = ()) -> Callable[[Sequence[Any]], int]:
    """Exact tokens of LangChain messages (``head`` in front), as ``measure`` counts them."""
    return lambda messages: counter.count_messages(from_langchain([*head, *messages]))


# -- figures -------------------------------------------------------------------------------
def _share(outcomes: Sequence[Outcome]) -> float:
    return 100 * sum(o.facts_kept for o in outcomes) / sum(o.facts for o in outcomes)


def _row(
    method: str, budget: int, outcomes: Sequence[Outcome], trim_setting: str
) -> Mapping[str, object]:
    tokens = [o.tokens for o in outcomes]
    note = (
        f"{sum(o.facts_kept for o in outcomes)} of {sum(o.facts for o in outcomes)} facts; "
        f"tokens kept mean {sum(tokens) / len(tokens):,.0f}, max {max(tokens):,} "
        f"(budget {budget:,}); orphaned tool results "
        f"{sum(o.orphaned_results for o in outcomes)}, tool calls "
        f"{sum(o.orphaned_calls for o in outcomes)}"
    )
    kinds: dict[str, list[int]] = {}
    for outcome in outcomes:
        for kind, kept in outcome.found:
            kind = "tool outputs" if kind.startswith("tool:") else kind
            kinds.setdefault(kind, [0, 0])[0] += kept
            kinds[kind][1] += 1
    note += "; by kind " + ", ".join(f"{k} {n}/{of}" for k, (n, of) in kinds.items())
    if method == "trim_messages":
        note += f"; {trim_setting}"
    return figure(_BENCH, f"facts_retained_pct_{method}_{budget}", _share(outcomes), "%", note=note)
