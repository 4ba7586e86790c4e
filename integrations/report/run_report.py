"""``kvgov report RUN.jsonl``: a recorded run read back, and what to change for the next.

A run recorded with ``integrations.otel.instrument`` and ``JsonLinesSpanExporter`` is
read back span by span (``RunReport.from_jsonl``), and every figure is computed from
the spans alone:

- per agent, the context its leases reached: p50, p95 and maximum over its leases of
  each lease's deepest context (``kvgov.seq.tokens`` of its chat spans or its
  ``kvgov.call`` events; of its agent span when it made no governed model call), the
  distribution a ceiling must hold;
- peak concurrent leases (admitted until released) and peak active leases (admitted
  or resumed until parked or released), from the agent spans' admission events;
- admission waits (count, p50, p95, max), compactions and summarizations with the
  tokens they saved, offloads, drops, restores and engine preemptions;
- per agent, the leases whose span ended in error, by ``error.type`` (a failure's class,
  ``cancelled``, ``never admitted``), and the runs (a graph's, a subgraph's) that raised,
  whether their caller caught it or not;
- per agent, the share of its deepest contexts that tool results brought: what the
  context grew by between two model calls with an ``execute_tool`` span between them
  (none without tool spans);
- recommendations (``integrations.report._advice``): a ceiling per agent and the
  ``max_concurrent`` it allows for the KV budget the run spans recorded, and the
  levers to pull, first one first.

Percentiles are nearest-rank (the smallest observed value with at least that share of
the values at or below it), so every figure is one the run really reached.

Errors: ``from_jsonl`` lets ``OSError`` and ``SpanFileError`` through, and raises
``ReportError`` (a ``ValueError``) when the file holds no kvgov agent span;
``integrations.report.main.report_main`` turns each into a one-line message and exit
code 2.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from integrations.jsonl import SpanRecord, read_spans
from integrations.otel import names as n
from integrations.report._advice import Budget, Lever, advise, recommended_ceiling
from integrations.report.figures import AgentFigures, Spread

__all__ = ["ReportError", "RunReport"]


class ReportError(ValueError):
    """The file holds no run to report on."""


@dataclass(frozen=True, slots=True)
class RunReport:
    source: str
    workflows: tuple[str, ...]
    agents: tuple[AgentFigures, ...]
    num_leases: int
    peak_leases: int
    peak_active_leases: int
    admission_wait_s: Spread
    compactions: int
    compaction_tokens_saved: int
    summarizations: int
    summarize_tokens_saved: int
    offloads: int
    offloaded_blocks: int
    drops: int
    restores: int
    preemptions: int
    budget: Budget | None
    # (error.type, runs) of the runs (invoke_workflow spans: a graph, a subgraph) that
    # raised, caught by their caller or not, most common first
    run_failures: tuple[tuple[str, int], ...]
    max_concurrent_now: int | None  # at the largest ceiling, in the recorded budget
    max_concurrent_recommended: int | None  # at the largest recommended ceiling
    levers: tuple[Lever, ...]

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike[str], *more: str | os.PathLike[str]) -> RunReport:
        """The run recorded in ``path``; with ``more``, one run recorded by several
        processes (each its own file, e.g. governors sharing a ``RedisStore``), read as
        one: their spans together, peaks counted across them on the spans' own times."""
        paths = (path, *more)
        spans = [span for each in paths for span in read_spans(each)]
        return cls.from_spans(spans, source=", ".join(os.fspath(p) for p in paths))

    @classmethod
    def from_spans(cls, spans: Sequence[SpanRecord], *, source: str = "") -> RunReport:
        agent_spans = [s for s in spans if _op(s) == "invoke_agent" and n.LEASE_ID in s.attributes]
        if not agent_spans:
            raise ReportError(
                f"{source or 'the spans'} hold no kvgov agent span; record a run with "
                "integrations.otel.instrument() and a JsonLinesSpanExporter"
            )
        children: dict[str, list[SpanRecord]] = {}
        for span in spans:
            if span.parent_span_id is not None:
                children.setdefault(span.parent_span_id, []).append(span)
        runs = [s for s in spans if _op(s) == "invoke_workflow"]
        budget = next((b for b in map(Budget.of, runs) if b is not None), None)
        events = [event for span in spans for event in span.events]
        by_agent: dict[str, list[SpanRecord]] = {}
        for span in agent_spans:
            by_agent.setdefault(str(span.attributes.get(n.AGENT_NAME, "agent")), []).append(span)
        agents = tuple(
            _agent(name, leases, children, budget) for name, leases in sorted(by_agent.items())
        )
        report = cls(
            source=source,
            workflows=tuple(str(s.attributes.get(n.WORKFLOW_NAME, s.name)) for s in runs),
            agents=agents,
            num_leases=len(agent_spans),
            peak_leases=_peak(_held(s) for s in agent_spans),
            peak_active_leases=_peak(i for s in agent_spans for i in _active(s)),
            admission_wait_s=Spread.of(_waits(agent_spans)),
            compactions=sum(a.compactions for a in agents),
            compaction_tokens_saved=sum(a.compaction_tokens_saved for a in agents),
            summarizations=_count(events, n.EVENT_SUMMARIZED),
            summarize_tokens_saved=_total(events, n.EVENT_SUMMARIZED, n.TOKENS_SAVED),
            offloads=_count(events, n.EVENT_OFFLOADED),
            offloaded_blocks=_total(events, n.EVENT_OFFLOADED, n.BLOCKS),
            drops=_count(events, n.EVENT_DROPPED),
            restores=_count(events, n.EVENT_RESTORED),
            preemptions=_total(events, n.EVENT_PREEMPTED, n.PREEMPTIONS),
            budget=budget,
            run_failures=_failures(runs),
            max_concurrent_now=_at(budget, max(agents, key=lambda a: a.ceiling_tokens)),
            max_concurrent_recommended=_at(
                budget, max(agents, key=lambda a: a.recommended_ceiling), recommended=True
            ),
            levers=(),
        )
        return replace(report, levers=advise(report))


# -- per agent ---------------------------------------------------------------------------
def _agent(
    name: str,
    leases: list[SpanRecord],
    children: dict[str, list[SpanRecord]],
    budget: Budget | None,
) -> AgentFigures:
    deepest: list[int] = []
    tool_results: list[int] = []
    num_calls = 0
    for lease in leases:
        calls = _calls(lease, children.get(lease.span_id, []))
        num_calls += len(calls)
        seq = [c[3] for c in calls]
        deepest.append(max(seq) if seq else int(lease.attributes.get(n.SEQ_TOKENS, 0)))
        tool_results += _tool_growth(calls, children.get(lease.span_id, []))
    context = Spread.of(deepest)
    block_size = 16 if budget is None else budget.block_size
    events = [e for lease in leases for e in lease.events]
    budgets = [
        budget
        for lease in leases
        if (budget := lease.attributes.get(n.TOOL_OUTPUT_TOKENS)) is not None
    ]
    return AgentFigures(
        agent=name,
        num_leases=len(leases),
        num_calls=num_calls,
        context_tokens=context,
        ceiling_tokens=max(int(lease.attributes.get(n.CEILING, 0)) for lease in leases),
        prefix_blocks=min(int(lease.attributes.get(n.PREFIX_BLOCKS, 0)) for lease in leases),
        admission_wait_s=Spread.of(_waits(leases)),
        compactions=_count(events, n.EVENT_COMPACTED),
        compaction_tokens_saved=_total(events, n.EVENT_COMPACTED, n.TOKENS_SAVED),
        summarizations=sum(int(lease.attributes.get(n.SUMMARIZATIONS, 0)) for lease in leases),
        summarize_tokens_saved=sum(
            int(lease.attributes.get(n.SUMMARIZE_SAVED, 0)) for lease in leases
        ),
        tool_output_tokens=max(budgets) if budgets else None,
        tool_result_tokens=Spread.of(tool_results),
        tool_share=sum(tool_results) / sum(deepest) if sum(deepest) else 0.0,
        recommended_ceiling=recommended_ceiling(context, block_size),
        failures=_failures(leases),
    )


def _failures(spans: Iterable[SpanRecord]) -> tuple[tuple[str, int], ...]:
    failed = Counter(
        str(span.attributes.get(n.ERROR_TYPE) or span.status_description or "error")
        for span in spans
        if span.status == "ERROR"
    )
    return tuple(sorted(failed.items(), key=lambda item: (-item[1], item[0])))


_Call = tuple[int, int, int, int]  # (time_ns, input tokens, output tokens, tokens in context)


def _calls(lease: SpanRecord, children: list[SpanRecord]) -> list[_Call]:
    """The lease's governed model calls, from its chat spans or its kvgov.call events."""
    calls = [
        (s.end_ns, s.attributes)
        for s in children
        if _op(s) == "chat" and n.SEQ_TOKENS in s.attributes
    ]
    calls += [(e.time_ns, e.attributes) for e in lease.events if e.name == n.EVENT_CALL]
    return sorted(
        (t, int(a.get(n.INPUT_TOKENS, 0)), int(a.get(n.OUTPUT_TOKENS, 0)), int(a[n.SEQ_TOKENS]))
        for t, a in calls
        if n.SEQ_TOKENS in a
    )


def _tool_growth(calls: list[_Call], children: list[SpanRecord]) -> list[int]:
    """What the context grew by between two calls with a tool call between them."""
    tools = [(s.start_ns, s.end_ns) for s in children if _op(s) == "execute_tool"]
    return [
        max(0, in1 - (in0 + out0))
        for (t0, in0, out0, _), (t1, in1, _, _) in itertools.pairwise(calls)
        if any(t0 <= start and end <= t1 for start, end in tools)
    ]


# -- over the run ----------------------------------------------------------------------------
def _admissions(span: SpanRecord) -> list[int]:
    return [e.time_ns for e in span.events if e.name in (n.EVENT_ADMITTED, n.EVENT_RESUMED)]


def _held(span: SpanRecord) -> tuple[int, int] | None:
    admitted = _admissions(span)
    return (min(admitted), span.end_ns) if admitted else None


def _active(span: SpanRecord) -> list[tuple[int, int]]:
    """Intervals from each admission or resume to the parking or release that ends it."""
    intervals, start = [], None
    for event in sorted(span.events, key=lambda e: e.time_ns):
        if event.name in (n.EVENT_ADMITTED, n.EVENT_RESUMED) and start is None:
            start = event.time_ns
        elif event.name == n.EVENT_PARKED and start is not None:
            intervals.append((start, event.time_ns))
            start = None
    if start is not None:
        intervals.append((start, span.end_ns))
    return intervals


def _peak(intervals: Iterable[tuple[int, int] | None]) -> int:
    """The most intervals open at once; one that ends as another starts does not overlap."""
    edges = sorted(
        edge for i in intervals if i is not None for edge in ((i[0], 1), (i[1], -1))
    )  # at equal times -1 sorts first
    peak = level = 0
    for _, step in edges:
        level += step
        peak = max(peak, level)
    return peak


def _waits(spans: Iterable[SpanRecord]) -> list[float]:
    return [
        float(e.attributes.get(n.WAIT_S, 0.0))
        for span in spans
        for e in span.events
        if e.name in (n.EVENT_ADMITTED, n.EVENT_RESUMED)
    ]


def _count(events: Iterable[Any], name: str) -> int:
    return sum(1 for e in events if e.name == name)


def _total(events: Iterable[Any], name: str, attribute: str) -> int:
    return sum(int(e.attributes.get(attribute, 0)) for e in events if e.name == name)


def _at(budget: Budget | None, agent: AgentFigures, *, recommended: bool = False) -> int | None:
    """``max_concurrent`` at the agent's ceiling (or recommended one), its prefix once."""
    if budget is None:
        return None
    ceiling = agent.recommended_ceiling if recommended else agent.ceiling_tokens
    return budget.max_concurrent(ceiling, agent.prefix_blocks)


def _op(span: SpanRecord) -> object:
    return span.attributes.get(n.OPERATION)
