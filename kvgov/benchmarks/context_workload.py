"""Conversations of tool-using agents with planted facts, for ``kvgov bench context``.

``build_conversations(seed=0, num_conversations=8)`` returns seeded conversations in the
OpenAI chat format (``tool_calls`` with ids, ``role: "tool"`` results): a system prompt,
the user's task, then rounds of one assistant tool call and its result, the result being
a document of ``policies.benchmarks.corpus`` (test logs, JSON API responses, directory
listings, service logs with stack traces, web pages as text; 2,000-40,000 tokens each),
a user message every two rounds, and a last user message asking for the plan.

Each fact is a string planted once, at a random place, where such a fact sits in real
work (``Fact.kind``):

- ``error_line``: a log line reporting an error, in a test log or a service log;
- ``json_number``: an 8-digit number in a field added to one random item of a JSON
  response;
- ``path_line``: a source path with a line number, in a log line that is not an error;
- ``identifier``: a code identifier in a sentence of a web page, or a file path in a
  directory listing;
- ``decision``: a decision the user states in the second user message, early in the
  conversation;
- ``user_identifier``: an id the user gives in a later message.

``Fact.text`` is the exact string that must be present in a compacted context for the
fact to count as kept; the builder checks that it occurs exactly once in the whole
conversation, so presence can only come from the planted copy.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from policies.benchmarks.corpus import Category, Document, build_corpus

__all__ = ["Conversation", "Fact", "build_conversations", "context_text", "plant_facts"]

_ROUNDS = 10  # tool calls per conversation: more than budget // 8 each can hold
_PACKAGES = ("ledger", "billing", "ingest", "refunds", "webhooks", "catalog", "search")
_LIBRARIES = ("pydantic", "sqlalchemy", "httpx", "celery", "protobuf", "redis")
_EXCEPTIONS = ("ValueError", "KeyError", "TimeoutError", "IntegrityError", "PermissionError")


@dataclass(frozen=True, slots=True)
class Fact:
    kind: str
    text: str


@dataclass(frozen=True, slots=True)
class Conversation:
    name: str
    messages: tuple[Mapping[str, Any], ...]
    facts: tuple[Fact, ...]


def build_conversations(*, seed: int = 0, num_conversations: int = 8) -> tuple[Conversation, ...]:
    """``num_conversations`` conversations of ``_ROUNDS`` tool results each."""
    corpus = build_corpus(seed=seed, num_documents=num_conversations * _ROUNDS)
    conversations = []
    for index in range(num_conversations):
        rng = random.Random(f"kvgov-context:{seed}:{index}")
        documents = corpus[index * _ROUNDS : (index + 1) * _ROUNDS]
        conversations.append(_conversation(rng, index, documents))
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


def _conversation(rng: random.Random, index: int, documents: Sequence[Document]) -> Conversation:
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
    for round_index, document in enumerate(documents):
        call_id = f"call_{index}_{round_index}"
        arguments = json.dumps(dict(document.arguments))
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": document.tool_name, "arguments": arguments},
                    }
                ],
            }
        )
        text, planted = plant_facts(rng, document, package)
        facts.extend(planted)
        messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
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
    for fact in facts:
        count = everything.count(fact.text)
        assert count == 1, f"fact {fact.text!r} occurs {count} times"
    return Conversation(f"conversation-{index:02d}", tuple(messages), tuple(facts))


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
