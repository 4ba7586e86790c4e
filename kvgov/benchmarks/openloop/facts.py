"""Facts planted in the open-loop workload's tool outputs, and how many an agent still
has at its last call: ``kvgov bench context``'s measure, on the swarm's agents.

``plant`` inserts a tool output's facts as ``context_workload.plant_facts`` does for the
context benchmark's documents (an error line and a path in a log, a file in a listing,
an identifier in a page's sentence, an 8-digit number in a JSON response). An open-loop
output is a window cut from a document, so a JSON response is seldom whole: its number
goes in as a field of its own line there. ``kept`` counts a fact kept when its exact
text is in what the agent sends at its last call (``context.measure``'s rule), so it
reads the prompt each agent actually sent, not what its history once held.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from governor import TokenCounter
from kvgov.benchmarks.context_workload import Conversation, Fact, plant_facts
from kvgov.benchmarks.swarm.workload import AgentScript
from policies.benchmarks.corpus import Category, Document

__all__ = ["FactsKept", "kept", "plant"]


def plant(
    text: str, category: str, rng: random.Random, *, package: str
) -> tuple[str, tuple[Fact, ...]]:
    """``text`` (a tool output of corpus ``category``) with its facts inserted at drawn
    places, and those facts; ``package`` names the code the facts point into."""
    kind = Category(category)
    document = Document(f"openloop-{kind.value}", kind, "", {}, text, ())
    if kind is Category.JSON_API:
        try:
            planted, facts = plant_facts(rng, document, package)
        except ValueError:  # a window of a response, not a whole one
            number = str(rng.randint(10**7, 10**8 - 1))
            lines = text.split("\n")
            lines.insert(rng.randint(0, len(lines)), f'"balance_cents": {number},')
            planted, facts = "\n".join(lines), [Fact("json_number", number)]
    else:
        planted, facts = plant_facts(rng, document, package)
    return planted, tuple(facts)


@dataclass(frozen=True, slots=True)
class FactsKept:
    num_kept: int
    num_planted: int

    @property
    def pct(self) -> float:
        return 100.0 * self.num_kept / self.num_planted if self.num_planted else 0.0

    def __add__(self, other: FactsKept) -> FactsKept:
        return FactsKept(self.num_kept + other.num_kept, self.num_planted + other.num_planted)


def kept(
    scripts: Sequence[AgentScript],
    facts: Mapping[str, Sequence[Fact]],
    counter: TokenCounter,
) -> FactsKept:
    """The facts planted in each agent's tool outputs (``facts``: agent -> its facts)
    that are in the messages of its last call, summed over ``scripts``."""
    from kvgov.benchmarks.context import measure

    total = FactsKept(0, 0)
    for script in scripts:
        planted = tuple(facts.get(script.name, ()))
        if not planted:
            continue
        last = list(script.turns[-1].messages)
        outcome = measure(Conversation(script.name, (), planted), last, counter)
        total += FactsKept(outcome.facts_kept, outcome.facts)
    return total
