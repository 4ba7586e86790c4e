"""``kvgov plan --simulate --trace``: a recorded run replayed on the twin of a card
(``kvgov.simulate.trace`` reads it, ``kvgov.simulate._replay`` replays it).

The trace is recorded here, for real: the demo's LangGraph swarm (a planner node that
fans out to ReAct workers with tool calls, then a node that merges their reports) under a
governor on the bundled engine with the tiny model, traced by ``instrument`` into a
``JsonLinesSpanExporter`` file. The governor's own events during that run are the truth
the replay is held to, on every scheme: the same agents and calls, each call's prompt
and output tokens as the engine counted them, each tool's recorded time, and children
that start when their parent fanned them out (a fan-out cap of two makes the third
worker wait for a slot in the recording; the replay starts it at the fan-out all the
same, since its wait was the recording's governance, not its work).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from backends import LocalBackend
from engine.presets import PRESETS
from engine.tokenizer import load_tokenizer
from engine.twin import get_profile
from engine.twin.targets import target_model
from governor import AdmissionMode, AgentSpec, Governor, GovernorConfig, GovernorEvent, Policies
from integrations.jsonl import JsonLinesSpanExporter, SpanFileError
from integrations.otel import instrument
from integrations.report import ReportError
from kvgov.demo.swarm import SYSTEM_PROMPT, SwarmSpec, build_swarm
from kvgov.simulate import Scenario, Simulation, simulate
from kvgov.simulate._prompts import PromptBook
from kvgov.simulate.trace import TraceError, TraceWorkload, read_trace
from policies import ExtractiveSummarizer

CARD = get_profile("rx9070xt")
LLAMA = target_model("llama-8b-random", quantize="int4")
TOKENIZER = load_tokenizer(PRESETS["tiny-random"].tokenizer)


class Recorded:
    """A run traced to ``path``; ``events`` is what its governor published meanwhile, the
    truth a replay is held to (agents are named as the trace names them: kind-lease)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[GovernorEvent] = []

    def of(self, kind: str) -> list[GovernorEvent]:
        return [e for e in self.events if e.kind == kind]

    def names(self) -> dict[str | None, str]:
        return {e.lease_id: f"{e.agent}-{e.lease_id}" for e in self.of("requested")}

    def calls(self) -> dict[str, list[tuple[int, int]]]:
        """Each lease's calls (prompt tokens, output tokens), by agent."""
        names = self.names()
        calls: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for e in self.of("call.finished"):
            a = e.attributes
            calls[names[e.lease_id]].append((a["prompt_tokens"], a["completion_tokens"]))
        return dict(calls)

    def times(self, kind: str) -> dict[str, list[float]]:
        """When each lease's events of ``kind`` came, by agent."""
        names = self.names()
        times: dict[str, list[float]] = defaultdict(list)
        for e in self.of(kind):
            times[names[e.lease_id]].append(e.at)
        return dict(times)

    def tool_times(self) -> dict[str, list[float]]:
        """How long each lease's tools took, by agent."""
        started, ended = self.times("tool.started"), self.times("tool.finished")
        return {a: [e - s for s, e in zip(started[a], ended[a], strict=True)] for a in ended}


class SwarmRecording(Recorded):
    """The demo's governed LangGraph swarm on the real engine."""

    def __init__(self, path: Path, *, num_workers: int = 3, turns: int = 2) -> None:
        super().__init__(path)
        backend = LocalBackend(
            config={"model": "tiny-random", "device": "cpu", "kv_cache_bytes": 16 << 20}
        )
        try:
            planner = AgentSpec(name="planner", ceiling_tokens=1_024, max_fanout=2)
            worker = AgentSpec(
                name="worker", ceiling_tokens=2_048, tool_output_tokens=160, prefix="system"
            )
            governor = Governor(
                backend,
                config=GovernorConfig(mode=AdmissionMode.OVERCOMMIT, park_after_s=0.05),
                agents=[planner, worker],
                policies=Policies(tool_output=ExtractiveSummarizer(backend.counter)),
            )
            governor.register_prefix("system", [{"role": "system", "content": SYSTEM_PROMPT}])
            governor.subscribe(self.events.append)
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(path)))
            spec = SwarmSpec(
                num_workers=num_workers,
                turns=turns,
                reply_tokens=4,
                planner=planner,
                worker=worker,
                system_in_messages=False,
            )
            with instrument(governor, tracer_provider=provider):
                swarm = build_swarm(governor, spec)
                done = asyncio.run(swarm.graph.ainvoke(swarm.inputs()))
            provider.shutdown()
            assert done["failures"] == []
        finally:
            backend.close()


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> SwarmRecording:
    return SwarmRecording(tmp_path_factory.mktemp("trace") / "run.jsonl")


@pytest.fixture(scope="module")
def workload(recording: SwarmRecording) -> TraceWorkload:
    return read_trace(recording.path)


@pytest.fixture(scope="module")
def replayed(workload: TraceWorkload) -> Simulation:
    return simulate(Scenario(profile=CARD, target=LLAMA, trace=workload))


def test_every_recorded_agent_and_call_is_replayed_with_its_tokens(
    recording: SwarmRecording, workload: TraceWorkload, replayed: Simulation
) -> None:
    recorded = recording.calls()
    assert len(recorded) == 3 + 2  # the planner's two nodes (two leases), three workers
    assert {a.name for a in workload.agents} == set(recorded)
    assert workload.num_calls == sum(len(c) for c in recorded.values()) == 11
    for run in replayed.runs:
        assert run.failed == [], run.scheme
        assert len(run.jct_s) == len(recorded)
        # Each call's prompt and output, as the twin's engine counted them: the recorded
        # contexts, call by call, on every scheme.
        sent = {name: [(c[2], c[3]) for c in agent.calls] for name, agent in run.agents.items()}
        assert sent == recorded, run.scheme


def test_tools_take_their_recorded_time(recording: SwarmRecording, replayed: Simulation) -> None:
    recorded = recording.tool_times()
    assert sum(len(t) for t in recorded.values()) == 3 * 2  # each worker, each turn
    for run in replayed.runs:
        took = {n: [s for _, s in a.tools] for n, a in run.agents.items() if a.tools}
        assert took.keys() == recorded.keys()
        for name, times in recorded.items():
            # Event times are float seconds since the epoch: a microsecond is their precision.
            assert took[name] == pytest.approx(times, abs=1e-6), (run.scheme, name)


def test_children_start_when_their_parent_fans_out(
    recording: SwarmRecording, replayed: Simulation
) -> None:
    requested = {e.lease_id: e for e in recording.of("requested")}
    children = [e for e in requested.values() if e.attributes.get("parent_id") is not None]
    assert len(children) == 3
    ended = {e.lease_id: e.at for e in recording.of("call.finished")}  # each lease's last
    admitted = {e.lease_id: e.at for e in recording.of("admitted")}
    # The cap of two held the third worker back: admitted well after it was requested.
    assert max(admitted[e.lease_id] - e.at for e in children) > 0.05
    for run in replayed.runs:
        agents = run.agents
        for child in children:
            parent = requested[child.attributes["parent_id"]]
            fanned_out = agents[f"planner-{parent.lease_id}"].calls[0][1]
            delay = child.at - ended[parent.lease_id]  # the planner's one call, then this
            started = agents[f"worker-{child.lease_id}"].started_s
            assert started == pytest.approx(fanned_out + delay, abs=1e-6), run.scheme
        # The merge node's lease was requested after every worker had ended: it follows
        # them in the replay too, whenever they end there.
        merge = max(requested.values(), key=lambda e: e.at)
        assert merge.agent == "planner" and merge.attributes.get("parent_id") is None
        last = max(agents[f"worker-{c.lease_id}"].calls[-1][1] for c in children)
        assert agents[f"planner-{merge.lease_id}"].started_s >= last


def test_prompts_grow_as_recorded_and_share_only_the_recorded_prefix(
    workload: TraceWorkload,
) -> None:
    book = PromptBook.of(workload, TOKENIZER)
    assert workload.prefix_tokens == (("worker", 96),) and workload.prefix_recorded  # 6 blocks
    firsts = []
    for agent in workload.agents:
        prompts = [TOKENIZER.encode_chat(m) for m in book.messages[agent.name]]
        assert [len(p) for p in prompts] == [c.prompt_tokens for c in agent.calls]
        for before, after in itertools.pairwise(prompts):
            assert after[: len(before)] == before  # each call extends the one before
        firsts.append((agent.kind, prompts[0]))
    pinned = TOKENIZER.encode_chat([book.prefixes["worker"]], add_generation_prompt=False)
    assert len(pinned) == 96
    workers = [p for kind, p in firsts if kind == "worker"]
    planners = [p for kind, p in firsts if kind == "planner"]
    for i, prompt in enumerate(workers):
        assert prompt[:96] == pinned
        for other in workers[i + 1 :]:  # nothing shared past the prefix's blocks
            assert prompt[96:112] != other[96:112]
    assert all(p[:16] != workers[0][:16] for p in planners)  # the planner shares nothing


def test_the_note_says_what_was_replayed(workload: TraceWorkload, replayed: Simulation) -> None:
    note = {m.metric: m.note for m in replayed.measurements()}["simulated_wall_s"]
    assert str(workload.source) in note
    assert "5 agents (2 planner, 3 worker), 11 model calls, 6 tool calls" in note
    assert "kvgov's reduced tool outputs (6 summarized" in note  # recorded under kvgov


def test_runs_are_cycled_whole_to_an_agent_count(workload: TraceWorkload) -> None:
    doubled = workload.cycled(10)
    assert (doubled.num_agents, doubled.num_calls, doubled.num_copies) == (10, 22, 2)
    copy = {a.name: a for a in doubled.agents}["2:planner-4"]
    assert copy.after == ("2:worker-1", "2:worker-2", "2:worker-3")  # its own copy's
    with pytest.raises(TraceError, match="pick a count such as 5 or 10"):
        workload.cycled(7)


class WaitingRecording(Recorded):
    """A lead agent that fans out to two helpers and waits for them, written against the
    governor's API on the real engine; traced with ``model_spans=False`` (each call a
    ``kvgov.call`` event) and ``tool_spans=False`` (a helper's wait between its calls is a
    bare gap, as an uninstrumented tool's would be)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        backend = LocalBackend(
            config={"model": "tiny-random", "device": "cpu", "kv_cache_bytes": 4 << 20}
        )
        try:
            lead = AgentSpec(name="lead", ceiling_tokens=512, max_fanout=2)
            helper = AgentSpec(name="helper", ceiling_tokens=512)
            governor = Governor(backend, agents=[lead, helper])
            governor.subscribe(self.events.append)
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(path)))
            handle = instrument(
                governor, tracer_provider=provider, model_spans=False, tool_spans=False
            )
            with handle:
                asyncio.run(self._lead(governor))
            provider.shutdown()
        finally:
            backend.close()

    async def _lead(self, governor: Governor) -> None:
        async def helper(parent: Any, part: int) -> None:
            async with governor.child(parent, "helper") as lease:
                ask = [{"role": "user", "content": f"Read part {part} of the log."}]
                await governor.acomplete(lease, ask, max_tokens=3)
                await asyncio.sleep(0.02 * (part + 1))
                more = [*ask, {"role": "assistant", "content": "ok"}]
                more.append({"role": "user", "content": "The next lines. " * 20})
                await governor.acomplete(lease, more, max_tokens=3)

        async with governor.lease("lead") as lease:
            ask = [{"role": "user", "content": "Split the log in two."}]
            await governor.acomplete(lease, ask, max_tokens=3)
            await asyncio.gather(helper(lease, 0), helper(lease, 1))
            merge = [*ask, {"role": "assistant", "content": "done"}]
            merge.append({"role": "user", "content": "Merge what the helpers found."})
            await governor.acomplete(lease, merge, max_tokens=3)


def test_a_parent_that_waited_for_its_children_waits_in_the_replay(tmp_path: Path) -> None:
    recorded = WaitingRecording(tmp_path / "waits.jsonl")
    assert not any('"chat ' in line for line in recorded.path.read_text().splitlines())
    traced = read_trace(recorded.path)
    calls = {a.name: [(c.prompt_tokens, c.output_tokens) for c in a.calls] for a in traced.agents}
    assert calls == recorded.calls()  # read from the kvgov.call events
    lead = next(a for a in traced.agents if a.kind == "lead")
    helpers = [a for a in traced.agents if a.kind == "helper"]
    assert lead.phases[1].waits and {c for c, _ in lead.phases[1].children} == {
        h.name for h in helpers
    }
    # A helper's gap between its calls, with no tool span: replayed as recorded.
    started, finished = recorded.times("call.started"), recorded.times("call.finished")
    for helper in helpers:
        gap = started[helper.name][1] - finished[helper.name][0]
        assert helper.phases[1].tool is None
        assert helper.phases[1].idle_s == pytest.approx(gap, abs=1e-3)  # 20 and 40 ms
    run = simulate(Scenario(profile=CARD, target=LLAMA, trace=traced), ["paged"]).runs[0]
    replayed = run.agents
    for helper in helpers:
        first, second = replayed[helper.name].calls
        assert second[0] - first[1] == pytest.approx(helper.phases[1].idle_s, abs=1e-9)
    last_child = max(replayed[h.name].calls[-1][1] for h in helpers)
    assert replayed[lead.name].calls[1][0] == pytest.approx(
        last_child + lead.phases[1].post_wait_s, abs=1e-9
    )


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _write(path: Path, spans: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(s) + "\n" for s in spans))
    return path


def test_bad_traces_are_typed_errors_that_say_what_to_do(
    recording: SwarmRecording, tmp_path: Path
) -> None:
    spans = _lines(recording.path)
    with pytest.raises(TraceError, match=r"cannot read .*nope\.jsonl"):
        read_trace(tmp_path / "nope.jsonl")
    # Spans, but none of a kvgov lease: a run that was not traced by instrument().
    other = [s for s in spans if s["attributes"].get("gen_ai.operation.name") == "chat"]
    for span in other:
        span["attributes"] = {"gen_ai.operation.name": "chat"}
    with pytest.raises(ReportError, match="no kvgov agent span"):
        read_trace(_write(tmp_path / "other.jsonl", other))
    # Leases, but no model call with its tokens.
    leases = [s for s in spans if s["attributes"].get("gen_ai.operation.name") != "chat"]
    with pytest.raises(TraceError, match="no model call with its token counts"):
        read_trace(_write(tmp_path / "no-calls.jsonl", leases))
    broken = tmp_path / "broken.jsonl"
    broken.write_text(recording.path.read_text() + '{"name": "half a span\n')
    with pytest.raises(SpanFileError, match=rf"line {len(spans) + 1}: not JSON"):
        read_trace(broken)
    for span in spans:
        if span["attributes"].get("gen_ai.operation.name") == "chat":
            span["attributes"]["gen_ai.usage.input_tokens"] = "a few"
    with pytest.raises(TraceError, match=r"gen_ai\.usage\.input_tokens is not a count"):
        read_trace(_write(tmp_path / "words.jsonl", spans))
