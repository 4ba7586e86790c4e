"""``JsonLinesSpanExporter`` and ``read_spans`` round trips, and ``kvgov report`` on a
recorded run: its figures equal those computed from the run's own results and events."""

from __future__ import annotations

import asyncio
import io
import json
import math
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from governor import (
    AgentSpec,
    GenerationResult,
    Governor,
    GovernorConfig,
    GovernorEvent,
    Policies,
    blocks_per_seq,
    max_concurrent,
)
from governor.testing import FakeBackend
from integrations.jsonl import EventRecord, JsonLinesSpanExporter, SpanFileError, read_spans
from integrations.otel import instrument
from integrations.report import ReportError, RunReport, report_main
from policies import DropOldest

CODER = AgentSpec(name="coder", ceiling_tokens=1_200, tool_output_tokens=64)  # 3 fit at once
SEARCHER = AgentSpec(name="searcher", ceiling_tokens=800)  # appends tool output whole
LOG = "tests/test_api.py::test_login FAILED: AssertionError: expected 200, got 500\n"


def _nearest_rank(values: Sequence[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[math.ceil(q * len(ordered)) - 1]


class Recorded:
    """One run recorded to JSON lines, with what the agents got back."""

    def __init__(self, path: Path, *, model_spans: bool = True) -> None:
        self.path = path
        self.backend = FakeBackend()
        self.governor = Governor(
            self.backend,
            config=GovernorConfig(park_after_s=0),
            agents=[CODER, SEARCHER],
            policies=Policies(ceiling=DropOldest(keep_last_turns=1)),
        )
        self.events: list[GovernorEvent] = []
        self.governor.subscribe(self.events.append)
        self.results: dict[str, list[list[GenerationResult]]] = {"coder": [], "searcher": []}
        self.reductions: list[Any] = []
        self._lock = threading.Lock()
        exporter = JsonLinesSpanExporter(path)
        provider = TracerProvider(shutdown_on_exit=False)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        with instrument(self.governor, tracer_provider=provider, model_spans=model_spans):
            self._run()
        provider.shutdown()

    def _run(self) -> None:
        g = self.governor
        all_in = threading.Barrier(3, timeout=10)

        def coder(i: int) -> None:
            with g.lease("coder") as lease:
                task = [{"role": "user", "content": f"Fix test {i}."}]
                first = g.complete(lease, task, max_tokens=4 + 3 * i)
                all_in.wait()  # three coders active at once: the peak
                with g.tool_call(lease, "pytest") as call:
                    reduced = call.reduce(LOG * (20 + i))
                history = [*task, {"role": "assistant", "content": first.text}]
                reply = {"role": "user", "content": reduced.text}
                second = g.complete(lease, [*history, reply], max_tokens=6)
            with self._lock:
                self.results["coder"].append([first, second])
                self.reductions.append(reduced)

        with g.run("triage"):
            threads = [threading.Thread(target=coder, args=(i,)) for i in range(3)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=10)
            for i in range(4):  # one at a time, after the coders
                with g.lease("searcher") as lease:
                    task = [{"role": "user", "content": "Find the failing test."}]
                    first = g.complete(lease, task, max_tokens=3 + i)
                    with g.tool_call(lease, "grep") as call:
                        output = call.reduce(LOG * (5 + 10 * i)).text  # no budget: whole
                    history = [*task, {"role": "assistant", "content": first.text}]
                    history += [{"role": "user", "content": output}] * (1 + i // 3)
                    second = g.complete(lease, history, max_tokens=5)  # the last compacts
                    self.results["searcher"].append([first, second])

    def deepest(self, agent: str) -> list[int]:
        return [
            max(r.prompt_tokens + r.completion_tokens for r in lease)
            for lease in self.results[agent]
        ]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    return Recorded(tmp_path_factory.mktemp("run") / "run.jsonl")


def test_the_report_figures_are_the_runs(recorded: Recorded) -> None:
    report = RunReport.from_jsonl(recorded.path)
    events = recorded.events
    assert report.workflows == ("triage",)
    assert report.num_leases == 7
    assert (report.peak_leases, report.peak_active_leases) == (3, 3)
    for figures in report.agents:
        deepest = recorded.deepest(figures.agent)
        c = figures.context_tokens
        assert (c.count, c.p50, c.p95, c.max) == (
            len(deepest),
            _nearest_rank(deepest, 0.5),
            _nearest_rank(deepest, 0.95),
            max(deepest),
        )
        assert figures.num_leases == len(deepest)
        assert figures.num_calls == 2 * len(deepest)
        want = math.ceil(max(c.p95 * 1.25, c.max))
        assert figures.recommended_ceiling == blocks_per_seq(want, 16) * 16
        assert figures.recommended_ceiling >= c.max
    coder, searcher = report.agents
    assert (coder.agent, coder.ceiling_tokens, coder.tool_output_tokens) == ("coder", 1_200, 64)
    assert (searcher.agent, searcher.ceiling_tokens, searcher.tool_output_tokens) == (
        "searcher",
        800,
        None,
    )
    waits = [e.attributes["wait_s"] for e in events if e.kind in ("admitted", "resumed")]
    w = report.admission_wait_s
    assert (w.count, w.max) == (len(waits), max(waits))
    assert w.p95 == _nearest_rank(waits, 0.95)  # type: ignore[arg-type]
    compactions = [e.record for e in events if e.kind == "compacted"]
    assert len(compactions) >= 1
    assert (report.compactions, report.compaction_tokens_saved) == (
        len(compactions),
        sum(c.tokens_saved for c in compactions),
    )
    assert (searcher.compactions, coder.compactions) == (len(compactions), 0)
    saved = sum(r.tokens_saved for r in recorded.reductions)
    assert saved > 0 and all(r.changed for r in recorded.reductions)
    assert (report.summarizations, report.summarize_tokens_saved) == (3, saved)
    assert (coder.summarizations, coder.summarize_tokens_saved) == (3, saved)
    assert (report.offloads, report.preemptions) == (0, 0)
    capacity = recorded.backend.capacity()
    budget = report.budget
    assert budget is not None
    assert (budget.num_blocks, budget.block_size, budget.bytes_per_block) == (
        capacity.num_blocks,
        capacity.block_size,
        capacity.bytes_per_block,
    )
    available = capacity.num_available_blocks
    assert report.max_concurrent_now == max_concurrent(available, 1_200, 16, 0.9)
    largest = max(a.recommended_ceiling for a in report.agents)
    assert report.max_concurrent_recommended == max_concurrent(available, largest, 16, 0.9)


def test_levers_first_one_first(recorded: Recorded) -> None:
    report = RunReport.from_jsonl(recorded.path)
    first, *rest = report.levers
    # The searcher's context is mostly grep output appended whole.
    assert (first.setting, first.agent) == ("tool_output_tokens", "searcher")
    assert "AgentSpec(name='searcher', tool_output_tokens=" in first.action
    lowered = [lever for lever in rest if lever.action.startswith("lower coder's")]
    coder = report.agents[0]
    assert lowered and f"to {coder.recommended_ceiling:,}" in lowered[0].action


def test_the_report_is_the_same_without_chat_spans(recorded: Recorded, tmp_path: Path) -> None:
    """With model_spans=False the calls are read from kvgov.call events instead."""
    again = Recorded(tmp_path / "events.jsonl", model_spans=False)
    assert not any(s.name.startswith("chat") for s in read_spans(again.path))
    report = RunReport.from_jsonl(again.path)
    for figures in report.agents:
        deepest = again.deepest(figures.agent)
        assert figures.context_tokens.max == max(deepest)
        assert figures.context_tokens.p50 == _nearest_rank(deepest, 0.5)
        assert figures.num_calls == 2 * len(deepest)
    assert report.agents[1].tool_share == pytest.approx(
        RunReport.from_jsonl(recorded.path).agents[1].tool_share, abs=0.05
    )


def test_report_main_prints_the_report(recorded: Recorded, capsys: pytest.CaptureFixture) -> None:
    assert report_main(recorded.path) == 0
    out = capsys.readouterr().out
    report = RunReport.from_jsonl(recorded.path)
    for figure in ("coder", "searcher", "peak concurrent leases", "max_concurrent"):
        assert figure in out
    assert f"{report.agents[1].context_tokens.max:,.0f}" in out
    assert "tool_output_tokens=" in out


def test_several_processes_files_are_one_run(recorded: Recorded, tmp_path: Path) -> None:
    """``kvgov report a.jsonl b.jsonl``: the traces of one run's processes read as one."""
    other = Recorded(tmp_path / "other.jsonl")
    one, two = RunReport.from_jsonl(recorded.path), RunReport.from_jsonl(other.path)
    both = RunReport.from_jsonl(recorded.path, other.path)
    assert both.num_leases == one.num_leases + two.num_leases
    for merged, first, second in zip(both.agents, one.agents, two.agents, strict=True):
        assert merged.agent == first.agent == second.agent
        assert merged.num_leases == first.num_leases + second.num_leases
        assert merged.num_calls == first.num_calls + second.num_calls
        assert merged.context_tokens.max == max(first.context_tokens.max, second.context_tokens.max)
    # the runs did not overlap in time: the peak is either's, not their sum
    assert both.peak_active_leases == max(one.peak_active_leases, two.peak_active_leases)
    assert str(recorded.path) in both.source and str(other.path) in both.source
    assert report_main(recorded.path, other.path) == 0
    assert report_main(recorded.path, tmp_path / "missing.jsonl") == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ("{not json\n", "line 1: not JSON"),
        ('{"name": "x"}\n', "line 1: not a span (missing 'trace_id')"),
        ("[1, 2]\n", "line 1: not a span"),
        ("", "no kvgov agent span"),
        (b"\xff\xfe\n", "utf-8"),
    ],
    ids=["missing", "not-json", "missing-key", "not-an-object", "empty", "not-utf8"],
)
def test_bad_input_is_one_line_and_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture, content: str | bytes | None, message: str
) -> None:
    path = tmp_path / "run.jsonl"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    assert report_main(path) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("kvgov report: ")
    assert message in captured.err
    assert report_main(tmp_path) == 2  # a folder
    assert "cannot read" in capsys.readouterr().err


def test_spans_round_trip_through_json_lines(tmp_path: Path) -> None:
    memory = InMemorySpanExporter()
    lines = io.StringIO()
    file_exporter = JsonLinesSpanExporter(lines)
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    provider.add_span_processor(SimpleSpanProcessor(file_exporter))
    governor = Governor(FakeBackend(), agents=[CODER])
    with (
        instrument(governor, tracer_provider=provider),
        governor.run("round trip"),
        governor.lease("coder") as lease,
    ):
        governor.complete(lease, [{"role": "user", "content": "hi"}], max_tokens=3)
    provider.shutdown()
    assert not lines.closed  # a file object is its owner's to close
    path = tmp_path / "spans.jsonl"
    path.write_text(lines.getvalue())
    read = read_spans(path)
    written = memory.get_finished_spans()
    assert len(read) == len(written) == 3
    for record, span in zip(read, written, strict=True):
        assert record.name == span.name and record.kind == span.kind.name
        assert record.trace_id == f"{span.context.trace_id:032x}"
        assert record.span_id == f"{span.context.span_id:016x}"
        parent = None if span.parent is None else f"{span.parent.span_id:016x}"
        assert record.parent_span_id == parent
        assert (record.start_ns, record.end_ns) == (span.start_time, span.end_time)
        expected = {k: list(v) if isinstance(v, tuple) else v for k, v in span.attributes.items()}
        assert record.attributes == expected
        events = [EventRecord(e.name, e.timestamp, dict(e.attributes or {})) for e in span.events]
        assert list(record.events) == events
        assert record.status == span.status.status_code.name == "UNSET"


def test_the_exporter_owns_a_path_and_appends_on_request(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    path.write_text("old\n")
    exporter = JsonLinesSpanExporter(path)  # truncates
    assert path.read_text() == ""
    assert exporter.force_flush()
    exporter.shutdown()
    exporter.shutdown()  # idempotent
    assert exporter.export([]) is SpanExportResult.FAILURE
    path.write_text('{"kept": true}\n')
    appending = JsonLinesSpanExporter(path, append=True)
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(appending))
    with provider.get_tracer("t").start_as_current_span("one", attributes={"k": (1, 2)}):
        pass
    provider.shutdown()
    first, second = path.read_text().splitlines()
    assert json.loads(first) == {"kept": True}
    assert json.loads(second)["attributes"] == {"k": [1, 2]}
    with pytest.raises(SpanFileError) as raised:
        read_spans(path)
    assert (raised.value.line, raised.value.path) == (1, str(path))


def test_a_file_of_other_spans_is_not_a_run(tmp_path: Path) -> None:
    path = tmp_path / "other.jsonl"
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(path)))
    with provider.get_tracer("t").start_as_current_span("unrelated"):
        pass
    provider.shutdown()
    with pytest.raises(ReportError, match="no kvgov agent span"):
        RunReport.from_jsonl(path)


def test_the_report_counts_the_leases_that_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "flaky.jsonl"
    governor = Governor(FakeBackend(), agents=[CODER, SEARCHER])
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(path)))

    async def cancelled() -> None:
        async def work() -> None:
            async with governor.lease("searcher"):
                await asyncio.sleep(10)

        task = asyncio.ensure_future(work())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with instrument(governor, tracer_provider=provider), governor.run("flaky"):
        with governor.lease("coder") as lease:
            governor.complete(lease, [{"role": "user", "content": "Fix it."}], max_tokens=4)
        for error in (RuntimeError, KeyError, RuntimeError):
            with pytest.raises(error), governor.lease("searcher"):
                raise error("the agent's work failed")
        asyncio.run(cancelled())
        with pytest.raises(ValueError), governor.run("subgraph"):  # its caller copes
            raise ValueError("a nested run failed")
    provider.shutdown()

    report = RunReport.from_jsonl(path)
    failures = {a.agent: a.failures for a in report.agents}
    assert failures == {
        "coder": (),
        "searcher": (("RuntimeError", 2), ("KeyError", 1), ("cancelled", 1)),
    }
    assert report.run_failures == (("ValueError", 1),)
    assert report_main(path) == 0
    out = capsys.readouterr().out
    assert "4 (RuntimeError 2, KeyError 1, cancelled 1)" in out
    assert "1 (ValueError 1)" in out


def test_max_concurrent_counts_an_agents_shared_prefix_once(tmp_path: Path) -> None:
    """Agents that start with a registered prefix: admission charges each lease only its
    blocks beyond the prefix's pinned ones (counted once, in the pins), and so does the
    report's max_concurrent. It used to charge whole ceilings, and advised fewer agents
    than admission runs."""
    backend = FakeBackend()
    coder = AgentSpec(name="coder", ceiling_tokens=1_200, prefix="team")
    governor = Governor(backend, config=GovernorConfig(park_after_s=0), agents=[coder])
    governor.register_prefix("team", "You are a careful build engineer; be terse. " * 40)
    path = tmp_path / "run.jsonl"
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(path)))
    task = [{"role": "user", "content": "Fix test 1."}]
    with (
        instrument(governor, tracer_provider=provider),
        governor.run("triage"),
        governor.lease("coder") as lease,
    ):
        governor.complete(lease, task, max_tokens=4)
    provider.shutdown()
    report = RunReport.from_jsonl(path)
    (figures,) = report.agents
    prefix = lease.prefix_blocks
    assert prefix > 0 and figures.prefix_blocks == prefix
    now = report.max_concurrent_now
    assert now == governor.admission.max_concurrent(1_200, prefix)
    available = backend.capacity().num_available_blocks
    assert now is not None and now > max_concurrent(available, 1_200, 16, 0.9)
    recommended = figures.recommended_ceiling
    assert report.max_concurrent_recommended == max_concurrent(
        available, recommended, 16, 0.9, prefix
    )
