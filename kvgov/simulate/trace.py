"""A recorded run as a workload for the hardware twin (``kvgov plan --simulate --trace``):
what each agent of a ``kvgov report`` trace did, in the order and at the times it did it.

``read_trace(path)`` reads the spans ``integrations.otel`` wrote (``JsonLinesSpanExporter``)
and keeps, per lease (an agent here is one lease: one ``invoke_agent`` span):

- its model calls in order, each with the prompt tokens it sent and the tokens it
  generated (``gen_ai.usage.*`` of its ``chat`` spans, or of its ``kvgov.call`` events);
  a call that failed recorded no usage and is left out (``num_calls_left_out``);
- what it did before each call and after its last (a ``Phase``): the tools it ran
  (``execute_tool`` spans: how long they took, the intervals merged), the sub-agents it
  fanned out (child leases, each with its delay after the phase began) and whether its
  next call waited for them (it started after the last of them ended, as recorded), and
  where it ran no tool and waited for no child, the recorded gap itself;
- when it starts: a child when its parent's phase fans it out; a root lease at its
  offset from the trace's first request, or, within one run (a graph's ``invoke``), after
  every lease of that run that had ended before it was requested, by the recorded delay
  after the last of them (a graph's next node waits for the nodes before it);
- the shared prefix of its kind (``gen_ai.agent.name``): the pinned blocks the trace
  recorded (``kvgov.lease.prefix_blocks``), else the largest prefix-cache hit of a first
  call of that kind (those first tokens were sent before: taken as the kind's system
  prompt), else none.

Admission waits, parking, offloads and preemptions are the recording's governance, not
the workload: the twin's own engine and governor decide them again. ``cycled(n)``
repeats the trace's runs (a root run with every lease in it; a root lease's tree where
no run was recorded) to ``n`` agents, each copy at the recorded offsets.

Errors, each with what to do::

    ValueError
    ├── SpanFileError (integrations.jsonl)   a line that is not a span
    ├── ReportError (integrations.report)    no kvgov agent span in the file
    └── ScenarioError (kvgov.simulate.errors)
        └── TraceError   a file that cannot be read, a token count that is not one, no
                         model call with its token counts, or an agent count that is
                         not whole runs of the trace
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from integrations.jsonl import SpanRecord, read_spans
from integrations.otel import names as n
from integrations.report import ReportError
from kvgov.simulate.errors import ScenarioError

__all__ = [
    "Phase",
    "TraceError",
    "TraceWorkload",
    "TracedAgent",
    "TracedCall",
    "read_trace",
]

_NS = 1e-9


class TraceError(ScenarioError):
    """A recorded trace that cannot be replayed; the message says what to record or pass."""


@dataclass(frozen=True, slots=True)
class TracedCall:
    prompt_tokens: int  # the context the call sent
    output_tokens: int  # what it generated
    cached_tokens: int  # of its prompt, found in the prefix cache as recorded
    start_s: float  # seconds from the trace's first request
    end_s: float


@dataclass(frozen=True, slots=True)
class Phase:
    """What an agent did before one of its calls (or after its last): tools, then the
    children it fanned out, then the wait for them where its next call waited."""

    tool: str | None  # the first tool it ran; None: no tool span in the phase
    num_tools: int  # tool spans in the phase, replayed as one wait of ``tool_s``
    tool_s: float  # the tools' recorded time, overlapping runs counted once
    idle_s: float  # the recorded gap, where it ran no tool and waited for no child
    children: tuple[tuple[str, float], ...]  # (child, its delay after the phase began)
    waits: bool  # its next call started after every child of this phase had ended
    post_wait_s: float  # from the last child's end to its next call, as recorded


@dataclass(frozen=True, slots=True)
class TracedAgent:
    name: str  # "worker-3": its kind and lease id (and "2:" for a cycled copy)
    kind: str  # gen_ai.agent.name: its AgentSpec, and its shared prefix's group
    parent: str | None  # the lease it is a child of
    calls: tuple[TracedCall, ...]
    phases: tuple[Phase, ...]  # one before each call, and one after the last
    after: tuple[str, ...]  # a root's: the leases of its run it starts after
    delay_s: float  # a root's: after those (or after the trace's start when none)
    start_s: float  # recorded: its request
    end_s: float  # recorded: its release
    unit: int  # the run (or root lease's tree) it belongs to: what cycling copies


@dataclass(frozen=True, slots=True)
class TraceWorkload:
    source: str
    agents: tuple[TracedAgent, ...]  # in the order they were requested
    prefix_tokens: tuple[tuple[str, int], ...]  # (kind, its shared prefix's tokens)
    prefix_recorded: bool  # the prefixes are pinned blocks the trace recorded
    duration_s: float  # from its first request to its last release
    num_summarized: int  # tool outputs the recording's governor reduced
    num_compacted: int  # histories it compacted at a ceiling
    num_calls_left_out: int  # failed calls: no token counts to replay
    num_agents_left_out: int  # leases with no call and no child (never admitted, ...)
    num_copies: int = 1  # of the recorded runs, when cycled to an agent count

    @property
    def num_agents(self) -> int:
        return len(self.agents)

    @property
    def num_calls(self) -> int:
        return sum(len(a.calls) for a in self.agents)

    @property
    def num_tools(self) -> int:
        return sum(p.num_tools for a in self.agents for p in a.phases)

    def cycled(self, num_agents: int) -> TraceWorkload:
        """The recorded runs repeated, in order, to ``num_agents`` agents; every copy starts
        at the recorded offsets, so copies run side by side."""
        if isinstance(num_agents, bool) or not isinstance(num_agents, int) or num_agents < 1:
            raise TraceError(f"--agents must be an int >= 1, got {num_agents!r}")
        units: dict[int, list[TracedAgent]] = {}
        for agent in self.agents:
            units.setdefault(agent.unit, []).append(agent)
        order = list(units.values())
        agents: list[TracedAgent] = []
        counts: list[int] = []  # the agent counts that end on a whole run
        while len(agents) < num_agents:
            unit = order[len(counts) % len(order)]
            agents += [_copied(a, len(counts) // len(order), len(counts)) for a in unit]
            counts.append(len(agents))
        if len(agents) != num_agents:
            below = [c for c in counts if c < num_agents][-1:]
            options = " or ".join(str(c) for c in [*below, len(agents)])
            sizes = ", ".join(str(len(u)) for u in order)
            raise TraceError(
                f"{self.source} holds runs of {sizes} agents; --agents replays whole runs "
                f"(cycled in order), so pick a count such as {options}, or leave it out to "
                "replay the trace as recorded"
            )
        agents.sort(key=lambda a: (a.start_s, a.unit))
        num_copies = -(-len(counts) // len(order))
        return replace(self, agents=tuple(agents), num_copies=num_copies)

    def describe(self) -> str:
        kinds: dict[str, int] = {}
        for agent in self.agents:
            kinds[agent.kind] = kinds.get(agent.kind, 0) + 1
        mix = ", ".join(f"{count} {kind}" for kind, count in kinds.items())
        shared = ", ".join(f"{kind} {tokens:,}" for kind, tokens in self.prefix_tokens)
        how = "pinned blocks as recorded" if self.prefix_recorded else "first calls' cache hits"
        reduced = (
            f"kvgov's reduced tool outputs ({self.num_summarized} summarized and "
            f"{self.num_compacted} histories compacted in the recording)"
            if self.num_summarized or self.num_compacted
            else "tool outputs as they came (none reduced)"
        )
        left = [
            f"{count} {what} left out"
            for count, what in (
                (self.num_calls_left_out, "failed calls (no token counts)"),
                (self.num_agents_left_out, "leases with no call"),
            )
            if count
        ]
        return (
            f"the recorded trace {self.source}"
            + (f" cycled to {self.num_agents} agents" if self.num_copies > 1 else "")
            + f": {self.num_agents} agents ({mix}), {self.num_calls} model calls, "
            f"{self.num_tools} tool calls, recorded over {self.duration_s:.1f} s; every "
            f"scheme replays its contexts, with {reduced}; shared prefixes: "
            + (f"{shared} tokens ({how})" if shared else "none recorded")
            + ("; " + ", ".join(left) if left else "")
        )


def read_trace(path: str | os.PathLike[str]) -> TraceWorkload:
    """The workload a ``kvgov report`` trace recorded; see the module docstring."""
    source = os.fspath(path)
    try:
        spans = read_spans(path)
    except OSError as exc:
        raise TraceError(
            f"cannot read {source}: {exc.strerror or exc}; pass a trace that `kvgov demo` "
            "or a JsonLinesSpanExporter wrote"
        ) from None
    except UnicodeDecodeError:
        raise TraceError(f"{source} is not a text file of JSON lines: pass a span file") from None
    try:
        return _workload(source, spans)
    except _NotACount as exc:
        raise TraceError(
            f"{source} holds a kvgov span whose {exc} is not a count: pass a file that a "
            "JsonLinesSpanExporter wrote"
        ) from None


def _workload(source: str, spans: Sequence[SpanRecord]) -> TraceWorkload:
    leases = [s for s in spans if _op(s) == "invoke_agent" and n.LEASE_ID in s.attributes]
    if not leases:
        raise ReportError(
            f"{source} holds no kvgov agent span: record the run with "
            "integrations.otel.instrument(governor) and a JsonLinesSpanExporter"
        )
    leases.sort(key=lambda s: (s.start_ns, s.span_id))
    under: dict[str, list[SpanRecord]] = {}
    for span in spans:
        if span.parent_span_id is not None:
            under.setdefault(span.parent_span_id, []).append(span)
    t0 = leases[0].start_ns
    calls = {s.span_id: _calls(s, under.get(s.span_id, []), t0) for s in leases}
    # A failed call recorded no usage: nothing to replay it with.
    left_out = sum(
        _op(c) == "chat" and n.INPUT_TOKENS not in c.attributes
        for s in leases
        for c in under.get(s.span_id, [])
    ) + sum(
        e.name == n.EVENT_CALL and n.INPUT_TOKENS not in e.attributes
        for s in leases
        for e in s.events
    )
    if not any(calls.values()):
        raise TraceError(
            f"{source} records {len(leases)} agent leases but no model call with its token "
            "counts: record the run with instrument(governor), whose chat spans (or "
            "kvgov.call events) carry each call's gen_ai.usage tokens"
        )
    by_id = {s.span_id: s for s in leases}
    children: dict[str, list[SpanRecord]] = {}
    for span in leases:
        parent = _parent_lease(span, by_id)
        if parent is not None:
            children.setdefault(parent.span_id, []).append(span)
    # A lease with no call and no child did no work to replay (never admitted, ...).
    kept = [s for s in leases if calls[s.span_id] or children.get(s.span_id)]
    names = _names(kept)
    roots = _root_runs(spans)
    units = _units(kept, by_id, roots)
    agents = []
    for span in kept:
        parent = _parent_lease(span, by_id)
        agents.append(
            TracedAgent(
                name=names[span.span_id],
                kind=_kind(span),
                parent=None if parent is None else names.get(parent.span_id),
                calls=tuple(calls[span.span_id]),
                phases=_phases(span, calls[span.span_id], under, children, names, t0),
                after=() if parent is not None else _after(span, kept, names, roots),
                delay_s=_delay(span, kept, roots, t0) if parent is None else 0.0,
                start_s=(span.start_ns - t0) * _NS,
                end_s=(span.end_ns - t0) * _NS,
                unit=units[span.span_id],
            )
        )
    prefix, recorded = _prefixes(kept, calls, spans)
    events = [e for s in spans for e in s.events]
    return TraceWorkload(
        source=source,
        agents=tuple(agents),
        prefix_tokens=tuple(sorted(prefix.items())),
        prefix_recorded=recorded,
        duration_s=(max(s.end_ns for s in leases) - t0) * _NS,
        num_summarized=sum(e.name == n.EVENT_SUMMARIZED for e in events),
        num_compacted=sum(e.name == n.EVENT_COMPACTED for e in events),
        num_calls_left_out=left_out,
        num_agents_left_out=len(leases) - len(kept),
    )


# -- per lease ---------------------------------------------------------------------------
def _calls(lease: SpanRecord, under: list[SpanRecord], t0: int) -> list[TracedCall]:
    """Its model calls with their usage, from its chat spans or its kvgov.call events."""
    found = [
        (s.start_ns, s.end_ns, s.attributes)
        for s in under
        if _op(s) == "chat" and n.INPUT_TOKENS in s.attributes
    ]
    for event in lease.events:
        a = event.attributes
        if event.name == n.EVENT_CALL and n.INPUT_TOKENS in a:
            elapsed_s = a.get(n.ELAPSED_S, 0.0)
            if not isinstance(elapsed_s, (int, float)) or not 0 <= elapsed_s < 1e9:
                raise _NotACount(n.ELAPSED_S)
            elapsed = int(elapsed_s / _NS)
            found.append((event.time_ns - elapsed, event.time_ns, a))
    return [
        TracedCall(
            prompt_tokens=_count(a, n.INPUT_TOKENS),
            output_tokens=_count(a, n.OUTPUT_TOKENS),
            cached_tokens=_count(a, n.CACHED_TOKENS),
            start_s=(start - t0) * _NS,
            end_s=(end - t0) * _NS,
        )
        for start, end, a in sorted(found, key=lambda f: (f[0], f[1]))
    ]


class _NotACount(ValueError):
    """An attribute that should hold a count holds something else; its name is the message."""


def _count(attributes: Mapping[str, object], name: str, default: int = 0) -> int:
    value = attributes.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _NotACount(name)
    return value


def _phases(
    lease: SpanRecord,
    calls: Sequence[TracedCall],
    under: Mapping[str, list[SpanRecord]],
    children: Mapping[str, list[SpanRecord]],
    names: Mapping[str, str],
    t0: int,
) -> tuple[Phase, ...]:
    """One phase before each call and one after the last; a tool or child belongs to the
    phase its start falls in (after the calls that had ended by then)."""
    admitted = [e.time_ns for e in lease.events if e.name in (n.EVENT_ADMITTED, n.EVENT_RESUMED)]
    began = (min(admitted, default=lease.start_ns) - t0) * _NS
    starts = [began, *(c.end_s for c in calls)]
    ends = [*(c.start_s for c in calls), (lease.end_ns - t0) * _NS]
    tools = [
        ((s.start_ns - t0) * _NS, (s.end_ns - t0) * _NS, str(s.attributes.get(n.TOOL_NAME, "tool")))
        for s in under.get(lease.span_id, [])
        if _op(s) == "execute_tool"
    ]
    kids = [
        ((c.start_ns - t0) * _NS, (c.end_ns - t0) * _NS, names[c.span_id])
        for c in children.get(lease.span_id, [])
        if c.span_id in names
    ]
    phases = []
    for i, (start, end) in enumerate(zip(starts, ends, strict=True)):
        mine = [t for t in sorted(tools) if _phase_of(t[0], calls) == i]
        fanned = [k for k in sorted(kids) if _phase_of(k[0], calls) == i]
        last = i == len(calls)
        waits = bool(fanned) and not last and all(k[1] <= end for k in fanned)
        tool_s = _union(t[:2] for t in mine)
        phases.append(
            Phase(
                tool=mine[0][2] if mine else None,
                num_tools=len(mine),
                tool_s=tool_s,
                idle_s=0.0 if mine or waits or last else max(0.0, end - start),
                children=tuple((name, max(0.0, at - start)) for at, _, name in fanned),
                waits=waits,
                post_wait_s=max(0.0, end - max(k[1] for k in fanned)) if waits else 0.0,
            )
        )
    return tuple(phases)


def _phase_of(at: float, calls: Sequence[TracedCall]) -> int:
    return sum(c.end_s <= at for c in calls)


def _union(intervals: Iterable[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def _parent_lease(span: SpanRecord, by_id: Mapping[str, SpanRecord]) -> SpanRecord | None:
    """Its parent lease's span, where it was a child lease (``kvgov.lease.parent_id``)."""
    if n.PARENT_LEASE_ID not in span.attributes or span.parent_span_id is None:
        return None
    return by_id.get(span.parent_span_id)


def _kind(span: SpanRecord) -> str:
    return str(span.attributes.get(n.AGENT_NAME, "agent"))


def _names(leases: Sequence[SpanRecord]) -> dict[str, str]:
    names: dict[str, str] = {}
    taken: set[str] = set()
    for span in leases:
        name = base = f"{_kind(span)}-{span.attributes[n.LEASE_ID]}"
        number = 1
        while name in taken:  # two governors' leases in one file
            number += 1
            name = f"{base}.{number}"
        taken.add(name)
        names[span.span_id] = name
    return names


# -- across leases ----------------------------------------------------------------------
def _root_runs(spans: Sequence[SpanRecord]) -> dict[str, str]:
    """Each run id -> the id of the outermost run it was started in."""
    parents = {
        str(s.attributes[n.RUN_ID]): s.attributes.get(n.RUN_PARENT_ID)
        for s in spans
        if _op(s) == "invoke_workflow" and n.RUN_ID in s.attributes
    }
    roots = {}
    for run in parents:
        root, seen = run, {run}
        while parents.get(root) is not None and str(parents[root]) not in seen:
            root = str(parents[root])
            seen.add(root)
        roots[run] = root
    return roots


def _run_of(span: SpanRecord, roots: Mapping[str, str]) -> str | None:
    run = span.attributes.get(n.RUN_ID)
    return None if run is None else roots.get(str(run), str(run))


def _units(
    leases: Sequence[SpanRecord], by_id: Mapping[str, SpanRecord], roots: Mapping[str, str]
) -> dict[str, int]:
    """Each lease's unit: its root run, or its root lease's tree where it recorded none."""
    units: dict[str, int] = {}
    keys: dict[object, int] = {}
    for span in leases:  # in request order: a parent before its children
        parent = _parent_lease(span, by_id)
        if parent is not None and parent.span_id in units:
            units[span.span_id] = units[parent.span_id]
            continue
        run = _run_of(span, roots)
        key: object = ("run", run) if run is not None else ("lease", span.span_id)
        units[span.span_id] = keys.setdefault(key, len(keys))
    return units


def _predecessors(
    root: SpanRecord, leases: Sequence[SpanRecord], roots: Mapping[str, str]
) -> list[SpanRecord]:
    run = _run_of(root, roots)
    if run is None:
        return []
    return [
        s
        for s in leases
        if s is not root and _run_of(s, roots) == run and s.end_ns <= root.start_ns
    ]


def _after(
    root: SpanRecord,
    leases: Sequence[SpanRecord],
    names: Mapping[str, str],
    roots: Mapping[str, str],
) -> tuple[str, ...]:
    return tuple(names[s.span_id] for s in _predecessors(root, leases, roots))


def _delay(
    root: SpanRecord, leases: Sequence[SpanRecord], roots: Mapping[str, str], t0: int
) -> float:
    before = _predecessors(root, leases, roots)
    since = max((s.end_ns for s in before), default=t0)
    return (root.start_ns - since) * _NS


def _prefixes(
    leases: Sequence[SpanRecord],
    calls: Mapping[str, Sequence[TracedCall]],
    spans: Sequence[SpanRecord],
) -> tuple[dict[str, int], bool]:
    """Each kind's shared prefix in tokens, and whether pinned blocks were recorded."""
    block_size = next(
        (
            _count(s.attributes, n.BLOCK_SIZE)
            for s in spans
            if _op(s) == "invoke_workflow" and n.BLOCK_SIZE in s.attributes
        ),
        16,
    )
    pinned: dict[str, int] = {}
    hits: dict[str, int] = {}
    for span in leases:
        kind = _kind(span)
        blocks = _count(span.attributes, n.PREFIX_BLOCKS)
        if blocks:
            pinned[kind] = max(pinned.get(kind, 0), blocks * block_size)
        first = calls[span.span_id][:1]
        if first and first[0].cached_tokens:
            hits[kind] = max(hits.get(kind, 0), first[0].cached_tokens)
    if pinned:
        return pinned, True
    return hits, False


def _copied(agent: TracedAgent, copy: int, unit: int) -> TracedAgent:
    if copy == 0:
        return replace(agent, unit=unit)

    def renamed(name: str) -> str:
        return f"{copy + 1}:{name}"

    return replace(
        agent,
        name=renamed(agent.name),
        parent=None if agent.parent is None else renamed(agent.parent),
        phases=tuple(
            replace(p, children=tuple((renamed(c), d) for c, d in p.children)) for p in agent.phases
        ),
        after=tuple(renamed(a) for a in agent.after),
        unit=unit,
    )


def _op(span: SpanRecord) -> object:
    return span.attributes.get(n.OPERATION)
