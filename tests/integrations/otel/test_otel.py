"""``integrations.otel.instrument`` with the real OpenTelemetry SDK: spans captured by
``InMemorySpanExporter`` and metrics by ``InMemoryMetricReader`` (``otel_telemetry.py``), on
``FakeBackend``: how the spans nest and what they carry, compaction and summaries as events,
failures as error statuses, the metrics, and telemetry that reads a busy engine off the
loop. How spans end (uninstrument, a lease never admitted, twenty agents at once) and
offload and restore on the bundled engine are in ``test_otel_lifecycle.py``."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from contextlib import aclosing
from typing import Any

import pytest
from opentelemetry.trace import SpanKind, StatusCode

from governor import BackendMetrics, Governor, GovernorEvent, Policies
from governor.testing import FakeBackend
from policies import DropOldest, LLMSummarizer
from tests.integrations.otel_telemetry import (
    CODER,
    TASK,
    Telemetry,
    _events,
    _governor,
    _one,
    _one_point,
    _parent,
)
from tests.loop_ticker import loop_ticker


def test_run_agent_call_and_tool_spans_nest_and_carry_the_events_figures(
    telemetry: Telemetry,
) -> None:
    governor, events = _governor(park_after_s=0)
    with (
        telemetry.instrument(governor),
        governor.run("triage") as run,
        governor.lease("coder", tenant="acme") as lease,
    ):
        first = governor.complete(lease, TASK, max_tokens=5)
        with governor.tool_call(lease, "pytest"):
            pass
        second = governor.complete(lease, TASK, max_tokens=7)
        with governor.child(lease, "worker") as child:
            third = governor.complete(child, TASK, max_tokens=3)
    run_span = _one(telemetry.finished("invoke_workflow"))
    coder = _one(telemetry.finished("invoke_agent coder"))
    worker = _one(telemetry.finished("invoke_agent worker"))
    chats = telemetry.finished("chat ")
    tool = _one(telemetry.finished("execute_tool"))
    assert run_span.name == "invoke_workflow triage" and _parent(run_span) is None
    assert _parent(coder) == run_span.context.span_id
    assert _parent(worker) == coder.context.span_id  # a child under its parent lease
    assert [c.name for c in chats] == ["chat fake-model"] * 3
    assert [_parent(c) for c in chats] == [coder.context.span_id] * 2 + [worker.context.span_id]
    assert _parent(tool) == coder.context.span_id
    assert {s.context.trace_id for s in telemetry.finished()} == {run_span.context.trace_id}
    assert (chats[0].kind, tool.kind, coder.kind) == (SpanKind.CLIENT,) + (SpanKind.INTERNAL,) * 2

    capacity = governor.backend.capacity()
    assert dict(run_span.attributes or {}) == {
        "gen_ai.operation.name": "invoke_workflow",
        "gen_ai.workflow.name": "triage",
        "gen_ai.provider.name": "fake",
        "gen_ai.request.model": "fake-model",
        "kvgov.run.id": run.run_id,
        "kvgov.kv.num_blocks": capacity.num_blocks,
        "kvgov.kv.num_available_blocks": capacity.num_available_blocks,
        "kvgov.kv.block_size": capacity.block_size,
        "kvgov.kv.bytes_per_block": capacity.bytes_per_block,
        "kvgov.admission.safety_factor": 0.9,
        "kvgov.admission.mode": "guaranteed",
    }
    finished = [e.attributes for e in events if e.kind == "call.finished"]
    for span, result, event in zip(chats, (first, second, third), finished, strict=True):
        a = span.attributes or {}
        assert a["gen_ai.operation.name"] == "chat"
        assert (a["gen_ai.provider.name"], a["gen_ai.request.model"]) == ("fake", "fake-model")
        assert a["gen_ai.usage.input_tokens"] == result.prompt_tokens
        assert a["gen_ai.usage.output_tokens"] == result.completion_tokens
        assert a["kvgov.seq.tokens"] == result.prompt_tokens + result.completion_tokens
        assert a["kvgov.kv.blocks_held"] == event["blocks_held"]
        assert a["kvgov.prefix.cached_tokens"] == result.cached_tokens
        assert a["gen_ai.response.finish_reasons"] == (result.finish_reason,)
        assert a["kvgov.lease.ceiling_tokens"] == 400
    assert chats[2].attributes["gen_ai.agent.name"] == "worker"  # type: ignore[index]
    assert tool.attributes == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "pytest",
        "gen_ai.agent.name": "coder",
        "kvgov.lease.id": lease.lease_id,
    }

    a = coder.attributes or {}
    waits = [e.attributes["wait_s"] for e in events if e.kind in ("admitted", "resumed")]
    waits = waits[:2]  # the coder's: admitted, resumed after the tool (the worker's comes last)
    assert a["gen_ai.operation.name"] == "invoke_agent" and a["gen_ai.agent.name"] == "coder"
    assert (a["kvgov.tenant"], a["kvgov.run.id"], a["kvgov.lease.id"]) == ("acme", run.run_id, "0")
    assert a["kvgov.lease.ceiling_tokens"] == 400 and a["kvgov.agent.tool_output_tokens"] == 40
    assert a["kvgov.admission.count"] == len(waits) == 2  # admitted, resumed after the tool
    assert a["kvgov.admission.wait_s"] == pytest.approx(sum(waits))
    assert a["kvgov.lease.parked"] == 2  # on the tool, then for its child
    assert a["kvgov.lease.num_calls"] == 2
    assert a["kvgov.seq.tokens"] == max(
        r.prompt_tokens + r.completion_tokens for r in (first, second)
    )
    kinds = [e.name for e in coder.events if e.name != "kvgov.retained"]
    assert kinds == ["kvgov.admitted", "kvgov.parked", "kvgov.resumed", "kvgov.parked"]
    assert _events(coder, "kvgov.parked") == [
        {"kvgov.reason": "tool"},
        {"kvgov.reason": "children"},
    ]
    assert worker.attributes["kvgov.lease.parent_id"] == lease.lease_id  # type: ignore[index]
    for span in (run_span, coder, worker, *chats, tool):
        assert span.status.status_code is StatusCode.UNSET


def test_compaction_and_summarization_are_events_with_tokens_before_and_after(
    telemetry: Telemetry,
) -> None:
    policies = Policies(ceiling=DropOldest(keep_last_turns=1))
    governor = Governor(FakeBackend(), agents=[CODER], policies=policies)
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "word " * 60}
        for i in range(6)
    ] + [{"role": "user", "content": "And now?"}]
    with (
        telemetry.instrument(governor),
        governor.lease("coder") as lease,
        governor.tool_call(lease, "grep") as call,
    ):
        reduction = call.reduce("tests/test_api.py::test_login FAILED\n" * 200)
        governor.complete(lease, turns, max_tokens=8)
    compaction = next(e.record for e in events if e.kind == "compacted")
    agent = _one(telemetry.finished("invoke_agent"))
    tool = _one(telemetry.finished("execute_tool"))
    assert _events(agent, "kvgov.compacted") == [
        {
            "kvgov.method": compaction.method,
            "kvgov.tokens_before": compaction.tokens_before,
            "kvgov.tokens_after": compaction.tokens_after,
            "kvgov.tokens_saved": compaction.tokens_saved,
            "kvgov.messages_before": 7,
            "kvgov.messages_after": compaction.messages_after,
            "kvgov.messages_dropped": compaction.dropped,
            "kvgov.messages_summarized": 0,
        }
    ]
    assert compaction.tokens_saved > 0
    assert _events(tool, "kvgov.summarized") == [
        {
            "kvgov.method": reduction.method,
            "kvgov.tokens_before": reduction.tokens_before,
            "kvgov.tokens_after": reduction.tokens_after,
            "kvgov.tokens_saved": reduction.tokens_saved,
            "gen_ai.tool.name": "grep",
        }
    ]
    a = agent.attributes or {}
    assert (a["kvgov.compactions"], a["kvgov.compaction.tokens_saved"]) == (
        1,
        compaction.tokens_saved,
    )
    assert (a["kvgov.summarizations"], a["kvgov.summarize.tokens_saved"]) == (
        1,
        reduction.tokens_saved,
    )


def test_a_summary_that_fell_back_says_why_on_its_event(
    telemetry: Telemetry, caplog: pytest.LogCaptureFixture
) -> None:
    def down(request: Any) -> str:
        raise ConnectionError("model server down")

    summarizer = LLMSummarizer(FakeBackend(responder=down))
    governor = Governor(FakeBackend(), agents=[CODER], policies=Policies(tool_output=summarizer))
    with (
        telemetry.instrument(governor),
        governor.lease("coder") as lease,
        governor.tool_call(lease, "grep") as call,
    ):
        reduction = call.reduce("tests/test_api.py::test_login FAILED\n" * 200)
    assert reduction.method == "diagnostics"  # the fallback read a test run's lines
    (event,) = _events(_one(telemetry.finished("execute_tool")), "kvgov.summarized")
    assert event["kvgov.method"] == "diagnostics"
    assert event["kvgov.detail"] == "llm error: ConnectionError: model server down"
    assert [r.name for r in caplog.records] == ["policies.llm_summarizer"]  # it was logged
    caplog.clear()  # the fixture holds every other warning to none


def test_failures_set_status_error(telemetry: Telemetry) -> None:
    governor, _ = _governor()

    async def main() -> None:
        async with governor.lease("coder") as lease:
            async with aclosing(governor.astream(lease, TASK, max_tokens=20)) as chunks:
                await anext(chunks)  # the consumer walks away: the call is cancelled
            with pytest.raises(KeyError):
                async with governor.tool_call(lease, "lookup"):
                    raise KeyError("missing")
        with pytest.raises(ValueError):
            async with governor.lease("worker"):
                raise ValueError("the agent's work failed")
        raise RuntimeError("the workflow failed")

    with telemetry.instrument(governor), pytest.raises(RuntimeError), governor.run("failing"):
        asyncio.run(main())
    chat = _one(telemetry.finished("chat"))
    tool = _one(telemetry.finished("execute_tool"))
    run = _one(telemetry.finished("invoke_workflow"))
    worker = _one(telemetry.finished("invoke_agent worker"))
    expected = {chat: "cancelled", tool: "KeyError", worker: "ValueError", run: "RuntimeError"}
    for span, error in expected.items():
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes["error.type"] == error  # type: ignore[index]
    # The coder's own work ended well: its call and tool failed, not the agent.
    coder = _one(telemetry.finished("invoke_agent coder"))
    assert coder.status.status_code is StatusCode.UNSET
    assert "error.type" not in (coder.attributes or {})


class PreemptingBackend(FakeBackend):
    """A fake whose engine reports ``preemptions`` preemptions so far."""

    preemptions = 0

    def metrics(self) -> BackendMetrics:
        return dataclasses.replace(super().metrics(), num_preemptions=self.preemptions)


def test_metrics(telemetry: Telemetry) -> None:
    backend = PreemptingBackend()
    backend.preemptions = 3  # before instrumenting: not counted
    governor, events = _governor(backend, park_after_s=0)
    with telemetry.instrument(governor), governor.lease("coder") as lease:
        first = governor.complete(lease, TASK, max_tokens=5)
        assert telemetry.metrics()["kvgov.lease.active"][0].value == 1
        with governor.tool_call(lease, "ls"):
            assert telemetry.metrics()["kvgov.lease.active"][0].value == 0  # parked
        backend.preemptions = 5
        second = governor.complete(lease, TASK, max_tokens=9)
    points = telemetry.metrics()
    usage = {p.attributes["gen_ai.token.type"]: p for p in points["gen_ai.client.token.usage"]}
    assert usage["input"].sum == first.prompt_tokens + second.prompt_tokens
    assert usage["output"].sum == first.completion_tokens + second.completion_tokens == 14
    assert usage["input"].count == 2
    assert dict(usage["output"].attributes) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "fake",
        "gen_ai.request.model": "fake-model",
        "gen_ai.token.type": "output",
    }
    seq = _one_point(points["kvgov.seq.tokens"])
    assert dict(seq.attributes) == {"gen_ai.agent.name": "coder"}
    assert seq.sum == sum(r.prompt_tokens + r.completion_tokens for r in (first, second))
    waits = [e.attributes["wait_s"] for e in events if e.kind in ("admitted", "resumed")]
    wait = _one_point(points["kvgov.admission.wait"])
    assert (wait.count, wait.sum) == (len(waits), pytest.approx(sum(waits)))
    assert _one_point(points["kvgov.lease.active"]).value == 0
    m = backend.metrics()
    assert _one_point(points["kvgov.kv.blocks_in_use"]).value == m.num_blocks_in_use
    assert _one_point(points["kvgov.kv.blocks_free"]).value == m.num_blocks_free
    assert _one_point(points["kvgov.engine.preemptions"]).value == 2
    agent = _one(telemetry.finished("invoke_agent"))
    assert _events(agent, "kvgov.preempted") == [{"kvgov.engine.preemptions": 2}]


class SlowBookkeepingBackend(PreemptingBackend):
    """A fake whose ``metrics()`` and ``capacity()`` take ``step_s``, as the bundled
    engine's do while it runs a step."""

    step_s = 0.2

    def metrics(self) -> BackendMetrics:
        time.sleep(self.step_s)
        return super().metrics()

    def capacity(self) -> Any:
        time.sleep(self.step_s)
        return super().capacity()


def test_async_agents_keep_running_while_telemetry_reads_a_busy_engine(
    telemetry: Telemetry,
) -> None:
    backend = SlowBookkeepingBackend(num_blocks=512)
    governor, events = _governor(backend)

    async def agent() -> None:
        async with governor.lease("worker") as lease:
            for _ in range(3):
                await governor.acomplete(lease, TASK, max_tokens=2)
        backend.preemptions = 4  # seen by a later reading

    async def main() -> float:
        async with loop_ticker() as gaps:
            with governor.run("swarm"):
                await asyncio.gather(*(agent() for _ in range(4)))
        return max(gaps)

    with telemetry.instrument(governor):  # off the loop: the baseline is read here
        longest = asyncio.run(main())
    # 12 calls, 4 releases and a run each asked for a reading; a read takes 0.2 s.
    assert longest < 0.1
    assert sum(e.kind == "call.finished" for e in events) == 12
    # The readings were taken off the loop, and the last lands by uninstrument.
    points = telemetry.metrics()
    assert _one_point(points["kvgov.engine.preemptions"]).value == 4
    assert _one_point(points["kvgov.kv.blocks_in_use"]).value == 0
    run = _one(telemetry.finished("invoke_workflow"))
    assert (run.attributes or {})["kvgov.kv.num_blocks"] == 512  # capacity, read at instrument


def test_model_spans_false_leaves_chat_spans_and_token_usage_to_others(
    telemetry: Telemetry,
) -> None:
    governor, _ = _governor()
    handle = telemetry.instrument(governor, model_spans=False, tool_spans=False)
    with handle, governor.lease("coder") as lease:
        result = governor.complete(lease, TASK, max_tokens=5)
        with governor.tool_call(lease, "ls"):
            pass
    assert [s.name for s in telemetry.finished()] == ["invoke_agent coder"]
    (call,) = _events(telemetry.finished()[0], "kvgov.call")
    assert call["kvgov.seq.tokens"] == result.prompt_tokens + result.completion_tokens
    assert call["gen_ai.usage.input_tokens"] == result.prompt_tokens
    metrics = telemetry.metrics()
    assert "gen_ai.client.token.usage" not in metrics and "kvgov.seq.tokens" in metrics
