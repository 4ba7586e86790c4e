"""Conversations of tool-using agents with planted facts, for ``kvgov bench context``.

``build_conversations(seeds=EVALUATION_SEEDS)`` returns one conversation per seed in the
OpenAI chat format (``tool_calls`` with ids, ``role: "tool"`` results): a system prompt,
the user's task, then rounds of one assistant tool call and its result, and a last user
message asking for the plan. The rounds are the seed's cases of
``policies.benchmarks.tool_outputs`` (every kind of tool output, 1,500-20,000 tokens
each, in a seeded order): the assistant says what it looks for (the case's question) and
calls the tool with the case's arguments; the result is the case's output.

Facts (``Fact.kind``) are the cases' own (``tool:<kind>``: what the call asked for, or
what stands out, each kept when all its needles are in the context), and two the user
states in messages between rounds:

- ``decision``: a decision the user states in the second user message, early in the
  conversation;
- ``user_identifier``: an id the user gives in a later message.

The tool-output corpus is written apart from any reducer, and only its evaluation seeds
are used here: ``TUNING_SEED`` never is. ``plant_facts`` plants facts in documents of
``policies.benchmarks.corpus``, for the open-loop workload.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from policies.benchmarks.corpus import Category, Document
from policies.benchmarks.tool_outputs import EVALUATION_SEEDS, Case, build_cases

__all__ = [
    "Conversation",
    "Fact",
    "build_conversations",
    "context_text",
    "plant_facts",
]

_PACKAGES = ("ledger", "billing", "ingest", "refunds", "webhooks", "catalog", "search")
_LIBRARIES = ("pydantic", "sqlalchemy", "httpx", "celery", "protobuf", "redis")
_EXCEPTIONS = ("ValueError", "KeyError", "TimeoutError", "IntegrityError", "PermissionError")


@dataclass(frozen=True, slots=True)
class Fact:
    """A planted fact: ``text`` for one string, or ``needles`` that must all be present."""

    kind: str
    text: str
    needles: tuple[str, ...] = ()

    def kept_in(self, text: str) -> bool:
        return all(needle in text for needle in self.needles or (self.text,))


@dataclass(frozen=True, slots=True)
class Conversation:
    name: str
    messages: tuple[Mapping[str, Any], ...]
    facts: tuple[Fact, ...]


def build_conversations(*, seeds: Sequence[int] = EVALUATION_SEEDS) -> tuple[Conversation, ...]:
    """One conversation per seed, of its tool-output cases (one of every kind)."""
    conversations = []
    for seed in seeds:
        rng = random.Random(f"kvgov-context:{seed}")
        cases = build_cases(seed, per_kind=1)
        rng.shuffle(cases)
        conversations.append(_conversation(rng, seed, cases))
    return tuple(conversations)


def context_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """Everything a model would read of ``messages``: contents and tool-call arguments."""
    parts = []
    for message in messages:
        content = message.get("content")
        parts.append(content if isinstance(content, str) else json.dumps(content))
        for call in message.get("tool_calls") or ():
            parts.append(str(call["function"]["arguments"]))
    return "\n".join(parts)


def _conversation(rng: random.Random, seed: int, cases: Sequence[Case]) -> Conversation:
    package = rng.choice(_PACKAGES)
    facts: list[Fact] = []
    messages: list[dict[str, Any]] = [
        {
            "role": "system",
            "content": "You are a coding agent. Use the tools to investigate, then propose "
            "a minimal fix. Keep track of what the user decides.",
        },
        {
            "role": "user",
            "content": f"The nightly {package} job fails since yesterday's deploy. Find the "
            "cause and tell me what to change.",
        },
    ]
    for round_index, case in enumerate(cases):
        call_id = f"call_{seed}_{round_index}"
        arguments = json.dumps(case.arguments)
        messages.append(
            {
                "role": "assistant",
                "content": case.question,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": case.tool_name, "arguments": arguments},
                    }
                ],
            }
        )
        for fact in case.facts:
            facts.append(Fact(f"tool:{case.kind}", fact.description, fact.needles))
        messages.append({"role": "tool", "tool_call_id": call_id, "content": case.text})
        if round_index == 0:
            library, version = rng.choice(_LIBRARIES), f"{rng.randint(1, 4)}.{rng.randint(0, 19)}"
            decision = f"keep {library} pinned at {version}.{rng.randint(10, 99)}"
            facts.append(Fact("decision", decision))
            messages.append(
                {
                    "role": "user",
                    "content": f"Decision: {decision} and do not upgrade it in this change; "
                    "the fix must work with it.",
                }
            )
        elif round_index % 2 == 1:
            customer = f"cust_{_code(rng, 8)}"
            facts.append(Fact("user_identifier", customer))
            messages.append(
                {
                    "role": "user",
                    "content": f"Support says the first customer to report it was {customer}; "
                    "check whether their data is involved.",
                }
            )
        else:
            messages.append({"role": "assistant", "content": "Noted. Looking further."})
    messages.append(
        {
            "role": "user",
            "content": "Now write the fix plan: the cause, the exact places to change, and "
            "everything we established on the way.",
        }
    )
    everything = context_text(messages)
    for kept in facts:  # not ``fact``: the cases' facts above are another type
        if not kept.needles:
            count = everything.count(kept.text)
            assert count == 1, f"fact {kept.text!r} occurs {count} times"
    return Conversation(f"seed-{seed:02d}", tuple(messages), tuple(facts))


def plant_facts(rng: random.Random, document: Document, package: str) -> tuple[str, list[Fact]]:
    """The document with its category's facts inserted at random places (the open-loop
    workload plants its tool outputs' facts with it too: ``openloop.facts``)."""
    if document.category is Category.JSON_API:
        return _plant_json(rng, document.text)
    lines = document.text.split("\n")
    planted: list[tuple[Fact, str]] = []
    module = f"{package}/{rng.choice(('sync', 'apply', 'window', 'adjust'))}_{_code(rng, 4)}.py"
    path = f"src/{module}:{rng.randint(40, 2400)}"
    if document.category in (Category.TEST_LOG, Category.STACK_TRACE):
        exception = rng.choice(_EXCEPTIONS)
        error = (
            f"ERROR {package}.worker: reconcile batch {rng.randint(10**6, 10**7)} failed: "
            f"{exception}: amount mismatch on entry {_code(rng, 10)}"
        )
        planted.append((Fact("error_line", error), error))
        planted.append((Fact("path_line", path), f"loaded settings override from {path}"))
    elif document.category is Category.DIRECTORY_LISTING:
        listed = f"./src/{package}/migrations/{rng.randint(1, 99):04d}_{_code(rng, 6)}.py"
        planted.append((Fact("identifier", listed), listed))
    else:  # a web page: an identifier in a sentence
        name = f"{package.upper()}_{rng.choice(('RETRY', 'BATCH', 'WINDOW'))}_{_code(rng, 5)}"
        sentence = f"In production the limit is read from {name}, which the deploy sets per region."
        planted.append((Fact("identifier", name), sentence))
    for _, line in planted:
        lines.insert(rng.randint(0, len(lines)), line)
    return "\n".join(lines), [fact for fact, _ in planted]


def _plant_json(rng: random.Random, text: str) -> tuple[str, list[Fact]]:
    body = json.loads(text)
    items = next(value for value in body.values() if isinstance(value, list) and value)
    number = str(rng.randint(10**7, 10**8 - 1))
    item = items[rng.randrange(len(items))]
    item["balance_cents"] = int(number)
    indent = 2 if text.startswith("{\n") else None
    return json.dumps(body, indent=indent, ensure_ascii=False), [Fact("json_number", number)]


def _code(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("abcdefghjkmnpqrstuvwxyz23456789") for _ in range(n))
