"""``kvgov bench context``: every method's context fits its budget, kvgov never separates a
tool result from its call, and the facts are counted by exact presence, derived here.

The methods run for real: kvgov's policies, LangChain's ``ContextEditingMiddleware``
(through its ``wrap_model_call``) and ``trim_messages``. The model of the middleware's
request is never called (the handler records what it would be sent): no model reads the
contexts, as the benchmark says.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from governor import TokenCounter
from kvgov.benchmarks import context
from kvgov.benchmarks.context_workload import Conversation, build_conversations
from kvgov.cli import BENCHMARKS
from policies.benchmarks.tool_outputs import TUNING_SEED, build_cases

BUDGETS = (4_000, 8_000)
SEEDS = (1, 2)


@pytest.fixture(scope="module")
def conversations() -> tuple[Conversation, ...]:
    return build_conversations(seeds=SEEDS)


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter()


@pytest.fixture(scope="module")
def contexts(
    conversations: tuple[Conversation, ...], counter: TokenCounter
) -> dict[tuple[str, int, int], list[dict[str, Any]]]:
    methods = {
        "kvgov": context.kvgov_context,
        "context_editing": context.context_editing,
        "trim_messages": context.trim,
    }
    return {
        (name, budget, i): method(c.messages, budget, counter)
        for name, method in methods.items()
        for budget in BUDGETS
        for i, c in enumerate(conversations)
    }


def _everything(messages: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for m in messages:
        parts.append(m["content"])
        parts += [c["function"]["arguments"] for c in m.get("tool_calls") or ()]
    return "\n".join(parts)


def test_every_fact_is_planted_where_its_kind_says(
    conversations: tuple[Conversation, ...],
) -> None:
    assert build_conversations(seeds=SEEDS) == conversations  # seeded
    for seed, c in zip(SEEDS, conversations, strict=True):
        text = _everything(c.messages)
        results = "\n".join(m["content"] for m in c.messages if m["role"] == "tool")
        users = _everything([m for m in c.messages if m["role"] == "user"])
        cases = build_cases(seed, per_kind=1)
        # Every case of the seed is a round: its question, its call, its output.
        assert sorted(m["content"] for m in c.messages if m["role"] == "tool") == sorted(
            case.text for case in cases
        )
        tool_facts = [f for f in c.facts if f.kind.startswith("tool:")]
        assert [f.needles for f in tool_facts] != []
        assert sorted(f.needles for f in tool_facts) == sorted(
            fact.needles for case in cases for fact in case.facts
        )
        for fact in tool_facts:
            assert fact.kept_in(results)
        for fact in c.facts:
            if not fact.kind.startswith("tool:"):
                assert text.count(fact.text) == 1 and fact.text in users
        kinds = {f.kind for f in c.facts}
        assert {"decision", "user_identifier"} <= kinds and len(kinds) >= 12
        assert c.messages[2]["role"] == "assistant" and c.messages[-1]["role"] == "user"
    assert TUNING_SEED not in SEEDS and TUNING_SEED not in context.EVALUATION_SEEDS


def test_every_context_fits_its_budget_and_kvgov_never_orphans(
    contexts: dict[tuple[str, int, int], list[dict[str, Any]]], counter: TokenCounter
) -> None:
    for (method, budget, _), messages in contexts.items():
        assert counter.count_messages(messages) <= budget, (method, budget)
        assert messages[0]["role"] == "system"
        if method != "kvgov":
            continue
        called = set()
        answered = []
        for m in messages:
            called |= {c["id"] for c in m.get("tool_calls") or ()}
            if m["role"] == "tool":
                assert m["tool_call_id"] in called  # its call came before it
                answered.append(m["tool_call_id"])
        assert called == set(answered)


def test_facts_are_counted_by_exact_presence(
    conversations: tuple[Conversation, ...],
    contexts: dict[tuple[str, int, int], list[dict[str, Any]]],
    counter: TokenCounter,
) -> None:
    for (_, _, i), messages in contexts.items():
        outcome = context.measure(conversations[i], messages, counter)
        text = _everything(messages)
        expected = sum(
            all(n in text for n in f.needles) if f.needles else f.text in text
            for f in conversations[i].facts
        )
        assert outcome.facts_kept == expected
        assert outcome.facts == len(conversations[i].facts)
        assert outcome.tokens == counter.count_messages(messages)


def test_the_langchain_methods_do_what_their_source_says(
    conversations: tuple[Conversation, ...],
    contexts: dict[tuple[str, int, int], list[dict[str, Any]]],
) -> None:
    for (method, _, i), messages in contexts.items():
        original = [dict(m) for m in conversations[i].messages]
        if method == "context_editing":
            # Results cleared to the placeholder, never removed: every message is still there.
            assert len(messages) == len(original)
            for kept, before in zip(messages, original, strict=True):
                assert kept["content"] in (before["content"], "[cleared]")
        elif method == "trim_messages":
            # The system message, then a suffix of the conversation that starts on a human.
            assert messages[1:] == original[len(original) - len(messages) + 1 :]
            assert messages[1]["role"] == "user"


def test_orphans_are_counted_both_ways(
    conversations: tuple[Conversation, ...], counter: TokenCounter
) -> None:
    messages = [dict(m) for m in conversations[0].messages]
    first_call = next(i for i, m in enumerate(messages) if m.get("tool_calls"))
    without_call = messages[:first_call] + messages[first_call + 1 :]
    assert context.measure(conversations[0], without_call, counter).orphaned_results == 1
    without_result = messages[: first_call + 1] + messages[first_call + 2 :]
    assert context.measure(conversations[0], without_result, counter).orphaned_calls == 1


def test_quick_run_figures_agree_with_its_rows() -> None:
    assert BENCHMARKS["context"] == "kvgov.benchmarks.context"
    figures = {m["metric"]: m for m in context.run(quick=True)}
    json.dumps(list(figures.values()))  # one JSON object per line in the CLI
    middle = context.BUDGETS[1]
    for method in context.METHODS:
        for budget in context.BUDGETS:
            note = figures[f"facts_retained_pct_{method}_{budget}"]["note"]
            kept, total = (int(n) for n in note.split(" facts")[0].split(" of "))
            assert figures[f"facts_retained_pct_{method}_{budget}"]["value"] == 100 * kept / total
            most = int(note.split("max ")[1].split(" ")[0].replace(",", ""))
            assert most <= budget
        row = figures[f"facts_retained_pct_{method}_{middle}"]["value"]
        assert figures[f"facts_retained_pct_{method}"]["value"] == row
    best = max(figures[f"facts_retained_pct_{m}"]["value"] for m in context.METHODS[1:])
    ratio = figures["facts_retained_kvgov_over_best_langchain"]
    assert ratio["value"] == figures["facts_retained_pct_kvgov"]["value"] / best
    assert ratio["target"] == 1.5
    assert figures["orphaned_tool_results_kvgov"]["value"] == 0
    for method in context.METHODS:
        for budget in context.BUDGETS:
            per_1k = figures[f"facts_per_1k_tokens_{method}_{budget}"]
            kept = int(per_1k["note"].split(" facts")[0])
            tokens = int(per_1k["note"].split(" in ")[1].split(" tokens")[0].replace(",", ""))
            assert per_1k["value"] == 1_000 * kept / tokens
