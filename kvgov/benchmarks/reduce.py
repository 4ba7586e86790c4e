"""``kvgov bench reduce``: the facts a tool output keeps when it is reduced to a token budget.

Every case of ``policies.benchmarks.tool_outputs`` (13 kinds of tool output, 1,500-20,000
tokens, 1 to 3 planted facts each; ``per_kind`` 2 for every evaluation seed, or 1 for 3
seeds with ``--quick``; never the tuning seed) is reduced to each budget in ``BUDGETS``
by each method, interleaved case by case, as a ``ToolOutputPolicy`` is called:
``reduce(text, budget_tokens=..., tool_name=..., arguments=...)``, plus ``question=``
(the agent's turn before the call) where the policy's ``reduce`` takes it.

- ``head``: ``HeadTailTruncation(counter, head_share=1.0)``, the first tokens only (what a
  tool wrapper's maximum length does);
- ``head_tail``: ``HeadTailTruncation(counter)``, the governor's default;
- ``extractive``: ``ExtractiveSummarizer(counter)``, the reducer being judged;
- ``extractive_lines``: ``ExtractiveSummarizer(counter, readers=())``, its line-only
  variant (left out, with a note, where the summarizer takes no ``readers``).

A fact is kept when every one of its needles is in the reduced text; a reduction over its
budget by ``TokenCounter().count`` (cl100k) raises ``OverBudgetError``. Figures:
``facts_kept_pct_{method}_{budget}``, ``facts_kept_pct_{method}_{kind}_400``,
``facts_per_1k_tokens_{method}_{budget}`` (facts kept per 1,000 tokens of reduced
output), ``facts_kept_extractive_over_head_tail`` at 400 tokens (ratio of counts, the
per-seed ratios in its note) and ``reduce_ms_per_10k_tokens`` (extractive's CPU time in
``reduce`` per 10,000 input tokens, median over the cases, each reduced once on a counter
that has counted nothing of it). No model
reads the reduced outputs: whether an answer could be read from them was not judged.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from inspect import signature
from typing import Any

from governor import HeadTailTruncation, TokenCounter, ToolOutputPolicy
from kvgov.benchmarks.figure import figure
from policies import ExtractiveSummarizer
from policies.benchmarks.tool_outputs import (
    EVALUATION_SEEDS,
    KINDS,
    TUNING_SEED,
    Case,
    build_cases,
)

__all__ = [
    "BUDGETS",
    "METHODS",
    "Outcome",
    "OverBudgetError",
    "evaluate",
    "methods",
    "run",
    "score",
]

BUDGETS = (200, 400, 800)
METHODS = ("head", "head_tail", "extractive", "extractive_lines")
KIND_BUDGET = 400
_QUICK_SEEDS = EVALUATION_SEEDS[:3]
# The targets at KIND_BUDGET: facts kept over all kinds, in the worst kind, and the
# ratio to head-and-tail truncation's count.
_TARGET_PCT, _TARGET_KIND_PCT, _TARGET_RATIO = 80.0, 60.0, 3.0
_BENCH = "reduce"


class OverBudgetError(RuntimeError):
    """A method returned more tokens than its budget: the policy broke its contract."""

    def __init__(self, *, method: str, kind: str, format: str, budget: int, tokens: int) -> None:
        self.method, self.kind, self.format = method, kind, format
        self.budget, self.tokens = budget, tokens
        super().__init__(
            f"{method} reduced a {kind} ({format}) output to {tokens} tokens, over its budget "
            f"of {budget}; a ToolOutputPolicy must never return more than budget_tokens"
        )


@dataclass(frozen=True, slots=True)
class Outcome:
    """One case reduced to one budget by one method."""

    method: str
    seed: int
    kind: str
    budget: int
    kept: tuple[bool, ...]  # per fact of the case, in order
    tokens_in: int
    tokens_out: int
    elapsed_s: float  # in reduce only

    @property
    def facts_kept(self) -> int:
        return sum(self.kept)

    @property
    def facts(self) -> int:
        return len(self.kept)


def run(*, quick: bool = False) -> Iterator[Mapping[str, object]]:
    seeds = _QUICK_SEEDS if quick else EVALUATION_SEEDS
    assert TUNING_SEED not in seeds  # tune on one seed, report on others
    per_kind = 1 if quick else 2
    counter = TokenCounter()
    cases = [(seed, case) for seed in seeds for case in build_cases(seed, per_kind=per_kind)]
    policies, skipped = methods(counter)
    outcomes = evaluate(cases, policies, counter, BUDGETS)
    ran = (
        f"seeds {', '.join(map(str, seeds))} (tuning seed {TUNING_SEED} never), {len(cases)} "
        f"cases ({per_kind} per kind, {len(KINDS)} kinds), "
        f"{sum(len(c.facts) for _, c in cases)} facts, budgets "
        f"{'/'.join(map(str, BUDGETS))} tokens; no model reads the outputs"
    )
    table: dict[tuple[str, int], list[Outcome]] = {}
    for o in outcomes:
        table.setdefault((o.method, o.budget), []).append(o)
    for budget in BUDGETS:
        for method in policies:
            yield _kept_row(method, budget, table[method, budget], ran)
    for method in policies:
        for kind in KINDS:
            rows = [o for o in table[method, KIND_BUDGET] if o.kind == kind]
            yield figure(
                _BENCH,
                f"facts_kept_pct_{method}_{kind}_{KIND_BUDGET}",
                _share(rows),
                "%",
                note=f"{_count(rows)} at {KIND_BUDGET} tokens, {len(rows)} {kind} cases",
            )
    if "extractive" in policies:
        shares = {
            kind: _share([o for o in table["extractive", KIND_BUDGET] if o.kind == kind])
            for kind in KINDS
        }
        worst = min(KINDS, key=lambda kind: shares[kind])
        yield figure(
            _BENCH,
            f"facts_kept_pct_extractive_worst_kind_{KIND_BUDGET}",
            shares[worst],
            "%",
            target=_TARGET_KIND_PCT,
            note=f"{worst}, the kind extractive keeps least of at {KIND_BUDGET} tokens",
        )
    for budget in BUDGETS:
        for method in policies:
            rows = table[method, budget]
            tokens = sum(o.tokens_out for o in rows)
            yield figure(
                _BENCH,
                f"facts_per_1k_tokens_{method}_{budget}",
                1_000 * sum(o.facts_kept for o in rows) / tokens if tokens else 0.0,
                "facts",
                note=f"{sum(o.facts_kept for o in rows)} facts kept in {tokens:,} tokens of "
                f"reduced output at {budget} tokens",
            )
    if "extractive" in policies and "head_tail" in policies:
        yield _ratio(table, seeds, ran, skipped)
    if "extractive" in policies:
        yield _timing(cases)


# -- the methods ---------------------------------------------------------------------------
def methods(counter: TokenCounter) -> tuple[dict[str, ToolOutputPolicy], tuple[str, ...]]:
    """Each method's policy on ``counter``, and a note for each method left out."""
    policies: dict[str, ToolOutputPolicy] = {
        "head": HeadTailTruncation(counter, head_share=1.0),
        "head_tail": HeadTailTruncation(counter),
        "extractive": ExtractiveSummarizer(counter),
    }
    skipped: list[str] = []
    try:
        policies["extractive_lines"] = ExtractiveSummarizer(counter, readers=())
    except TypeError:
        skipped.append("extractive_lines left out: ExtractiveSummarizer takes no readers=")
    return policies, tuple(skipped)


def evaluate(
    cases: Sequence[tuple[int, Case]],
    policies: Mapping[str, ToolOutputPolicy],
    counter: TokenCounter,
    budgets: Iterable[int],
) -> list[Outcome]:
    """Every (seed, case) reduced to every budget by every policy, interleaved per case."""
    budgets = tuple(budgets)
    takes_question = {name: _takes_question(p) for name, p in policies.items()}
    outcomes = []
    for seed, case in cases:
        tokens_in = counter.count(case.text)  # also warms the tokenizer before any timing
        for budget in budgets:
            for name, policy in policies.items():
                extra: dict[str, Any] = {"question": case.question} if takes_question[name] else {}
                start = time.perf_counter()
                reduced = policy.reduce(
                    case.text,
                    budget_tokens=budget,
                    tool_name=case.tool_name,
                    arguments=case.arguments,
                    **extra,
                )
                elapsed = time.perf_counter() - start
                tokens_out = counter.count(reduced.text)
                if tokens_out > budget:
                    raise OverBudgetError(
                        method=name,
                        kind=case.kind,
                        format=case.format,
                        budget=budget,
                        tokens=tokens_out,
                    )
                outcomes.append(
                    Outcome(
                        method=name,
                        seed=seed,
                        kind=case.kind,
                        budget=budget,
                        kept=score(case, reduced.text),
                        tokens_in=tokens_in,
                        tokens_out=tokens_out,
                        elapsed_s=elapsed,
                    )
                )
    return outcomes


def score(case: Case, text: str) -> tuple[bool, ...]:
    """Per fact of ``case``: is every one of its needles in ``text``, verbatim?"""
    return tuple(all(needle in text for needle in fact.needles) for fact in case.facts)


def _takes_question(policy: ToolOutputPolicy) -> bool:
    parameters = signature(policy.reduce).parameters
    return "question" in parameters or any(p.kind == p.VAR_KEYWORD for p in parameters.values())


# -- figures -------------------------------------------------------------------------------
def _share(outcomes: Sequence[Outcome]) -> float:
    facts = sum(o.facts for o in outcomes)
    return 100 * sum(o.facts_kept for o in outcomes) / facts if facts else 0.0


def _count(outcomes: Sequence[Outcome]) -> str:
    return f"{sum(o.facts_kept for o in outcomes)} of {sum(o.facts for o in outcomes)} facts"


def _kept_row(
    method: str, budget: int, outcomes: Sequence[Outcome], ran: str
) -> Mapping[str, object]:
    tokens = [o.tokens_out for o in outcomes]
    return figure(
        _BENCH,
        f"facts_kept_pct_{method}_{budget}",
        _share(outcomes),
        "%",
        target=_TARGET_PCT if (method, budget) == ("extractive", KIND_BUDGET) else None,
        note=f"{_count(outcomes)}; tokens out mean {sum(tokens) / len(tokens):,.0f}, max "
        f"{max(tokens):,} (budget {budget:,}); {ran}",
    )


def _ratio(
    table: Mapping[tuple[str, int], Sequence[Outcome]],
    seeds: Sequence[int],
    ran: str,
    skipped: Sequence[str],
) -> Mapping[str, object]:
    ours, theirs = table["extractive", KIND_BUDGET], table["head_tail", KIND_BUDGET]
    kept = sum(o.facts_kept for o in ours)
    reference = sum(o.facts_kept for o in theirs)
    per_seed = []
    for seed in seeds:
        a = sum(o.facts_kept for o in ours if o.seed == seed)
        b = sum(o.facts_kept for o in theirs if o.seed == seed)
        per_seed.append(a / b if b else float("inf"))
    spread = ", ".join(f"{r:.2f}" for r in per_seed)
    note = (
        f"extractive kept {kept}, head_tail {reference} facts at {KIND_BUDGET} tokens, the same "
        f"cases side by side; per seed {spread}; {ran}"
    )
    if skipped:
        note += "; " + "; ".join(skipped)
    return figure(
        _BENCH,
        "facts_kept_extractive_over_head_tail",
        kept / reference if reference else float("inf"),
        "x",
        target=_TARGET_RATIO,
        note=note,
    )


def _timing(cases: Sequence[tuple[int, Case]]) -> Mapping[str, object]:
    """Extractive's CPU time per 10,000 input tokens (the host's other processes do not
    count; the reduction runs on one thread) as a governor runs it: one summarizer on
    one counter for the whole run (a governor keeps one; its caches hold the pieces of
    words it has counted before), warmed on the tuning seed's outputs, never timed; each
    case reduced once at ``KIND_BUDGET``, the first time the counter sees its text."""
    counter = TokenCounter()
    summarizer = ExtractiveSummarizer(counter)
    for case in build_cases(TUNING_SEED):
        summarizer.reduce(
            case.text,
            budget_tokens=KIND_BUDGET,
            tool_name=case.tool_name,
            arguments=case.arguments,
            question=case.question,
        )
    per_10k = []
    for _, case in cases:
        start = time.process_time()
        reduced = summarizer.reduce(
            case.text,
            budget_tokens=KIND_BUDGET,
            tool_name=case.tool_name,
            arguments=case.arguments,
            question=case.question,
        )
        elapsed = time.process_time() - start
        per_10k.append(1_000 * elapsed * 10_000 / reduced.tokens_before)
    quartiles = statistics.quantiles(per_10k, n=4) if len(per_10k) > 1 else [per_10k[0]] * 3
    return figure(
        _BENCH,
        "reduce_ms_per_10k_tokens",
        statistics.median(per_10k),
        "ms",
        target=20.0,
        direction="lower",
        note=f"extractive's CPU time in reduce per 10,000 input tokens, median of {len(per_10k)} "
        f"cases, each reduced once at {KIND_BUDGET} tokens by one summarizer and counter for "
        f"the run (warmed on the tuning seed's outputs; no text counted before), quartiles "
        f"{quartiles[0]:.1f}-{quartiles[2]:.1f} ms, slowest {max(per_10k):.1f} ms; one process, "
        "on this host's CPU",
    )
