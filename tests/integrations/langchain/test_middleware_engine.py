"""``GovernorMiddleware`` on the bundled engine: real generations, scripted tool calls.

Every model call is a real generation on ``LocalBackend`` (tiny-random) through
``GovernedChatModel``. The tiny random model cannot call tools, so a script stands in for
that part of a model, as the demo's swarm does: after each generation it attaches the
tool call the turn makes, for ``turns`` turns, then lets the reply answer. The tool
returns outputs of 2,000-4,400 tokens from ``policies.build_corpus``. So the middleware
reduces real tool outputs, parks the lease while each tool runs, and compacts, ends or
raises at the ceiling, with the engine counting every prompt it was sent.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatResult
from langchain_core.tools import tool

from backends import LocalBackend
from governor import AgentSpec, CeilingExceeded, Governor, GovernorConfig, GovernorEvent, Policies
from integrations.langchain import GovernedChatModel, GovernorMiddleware
from policies import DropOldest, ExtractiveSummarizer, build_corpus

REPLY_TOKENS = 8
TOOL_OUTPUT_TOKENS = 300
DOCUMENTS = [d for d in build_corpus(num_documents=20) if 6_000 <= len(d.text) <= 16_000][:5]


@tool
def fetch(url: str) -> str:
    """Fetch ``url``: a recorded tool output of 2,000-4,400 tokens."""
    return DOCUMENTS[int(url.rsplit("/", 1)[1])].text


class ScriptedModel(GovernedChatModel):
    """A real generation per call; the script adds the turn's ``fetch`` call, ``turns``
    times, then the generation answers alone."""

    turns: int = len(DOCUMENTS)
    num_calls: int = 0

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        result = super()._generate(messages, stop, run_manager, **kwargs)
        turn, self.num_calls = self.num_calls, self.num_calls + 1
        if turn < self.turns:
            message = result.generations[0].message
            call = {"name": "fetch", "args": {"url": f"corpus/{turn}"}, "id": f"call-{turn}"}
            result.generations[0].message = AIMessage(
                content=message.content,
                tool_calls=[call],
                usage_metadata=getattr(message, "usage_metadata", None),
                response_metadata=message.response_metadata,
            )
        return result


@pytest.fixture(scope="module")
def backend() -> Iterator[LocalBackend]:
    with LocalBackend(config={"num_blocks": 256}) as local:
        yield local


def run_agent(
    backend: LocalBackend, *, ceiling: int, on_ceiling: str
) -> tuple[Governor, list[GovernorEvent], Any]:
    spec = AgentSpec(
        name="researcher", ceiling_tokens=ceiling, tool_output_tokens=TOOL_OUTPUT_TOKENS
    )
    policies = Policies(
        tool_output=ExtractiveSummarizer(backend.counter), ceiling=DropOldest(keep_last_turns=2)
    )
    config = GovernorConfig(park_after_s=0, retain_s=30)
    governor = Governor(backend, agents=[spec], policies=policies, config=config)
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)
    model = ScriptedModel(governor, agent="researcher", max_tokens=REPLY_TOKENS)
    middleware = GovernorMiddleware(
        governor,
        agent="researcher",
        on_ceiling=on_ceiling,  # type: ignore[arg-type]
        max_tokens=REPLY_TOKENS,
    )
    agent = create_agent(model, [fetch], middleware=[middleware])
    return governor, events, agent


def of(events: list[GovernorEvent], kind: str) -> list[GovernorEvent]:
    return [e for e in events if e.kind == kind]


def assert_nothing_held(governor: Governor, backend: LocalBackend) -> None:
    m = backend.metrics()
    assert (m.num_blocks_in_use, m.num_requests_running) == (0, 0)
    assert governor.admission.counts()[:2] == (0, 0)


def test_tool_outputs_are_reduced_the_lease_parked_and_the_context_compacted(
    backend: LocalBackend,
) -> None:
    governor, events, agent = run_agent(backend, ceiling=1_200, on_ceiling="compact")
    result = agent.invoke({"messages": [HumanMessage("Why is the nightly build red?")]})
    counter = governor.counter
    turns = len(DOCUMENTS)
    # Every call was a generation on the engine, and its prompt and reply kept within
    # the ceiling by the compactions, as the engine counted the prompt.
    finished = of(events, "call.finished")
    assert len(finished) == result["kvgov_model_calls"] == turns + 1
    assert all(e.attributes["prompt_tokens"] + REPLY_TOKENS <= 1_200 for e in finished)
    compacted = of(events, "compacted")
    assert len(compacted) == result["kvgov_compactions"]
    assert result["kvgov_compactions"] >= 1  # five outputs of 300 do not fit 1,200
    assert result["kvgov_tokens_compacted"] == sum(e.record.tokens_saved for e in compacted)
    # Each tool output was cut to the agent's budget before it entered the state.
    summarized = of(events, "summarized")
    assert [e.attributes["tool"] for e in summarized] == ["fetch"] * turns
    assert result["kvgov_tool_tokens_saved"] == sum(e.record.tokens_saved for e in summarized)
    outputs = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    assert outputs and all(counter.count(m.content) <= TOOL_OUTPUT_TOKENS for m in outputs)
    # The lease was parked after each call (park_after_s=0), its KV held while each tool
    # ran, and resumed for the next call.
    parked = of(events, "parked")
    assert [e.attributes["reason"] for e in parked] == ["turn"] * (turns + 1)
    assert len(of(events, "retained")) == len(of(events, "resumed")) == turns
    kinds = [e.kind for e in events if e.kind in ("parked", "tool.started", "resumed")]
    assert kinds == ["parked", "tool.started", "resumed"] * turns + ["parked"]
    assert not result["messages"][-1].tool_calls  # the run answered
    assert len(of(events, "released")) == 1
    assert_nothing_held(governor, backend)


def test_on_ceiling_end_stops_the_run_before_a_call_that_would_not_fit(
    backend: LocalBackend,
) -> None:
    governor, events, agent = run_agent(backend, ceiling=700, on_ceiling="end")
    result = agent.invoke({"messages": [HumanMessage("Why is the nightly build red?")]})
    last = result["messages"][-1]
    assert last.content.startswith("Stopped: agent 'researcher' would hold ")
    assert last.content.endswith("over its ceiling of 700.")
    finished = of(events, "call.finished")
    assert len(finished) == result["kvgov_model_calls"] < len(DOCUMENTS) + 1
    assert all(e.attributes["prompt_tokens"] + REPLY_TOKENS <= 700 for e in finished)
    assert_nothing_held(governor, backend)


def test_on_ceiling_raise_raises_and_returns_the_lease(backend: LocalBackend) -> None:
    governor, events, agent = run_agent(backend, ceiling=700, on_ceiling="raise")
    with pytest.raises(CeilingExceeded) as caught:
        agent.invoke({"messages": [HumanMessage("Why is the nightly build red?")]})
    assert caught.value.ceiling == 700 and caught.value.tokens > 700
    assert [e.attributes["error"] for e in of(events, "released")] == ["CeilingExceeded"]
    assert_nothing_held(governor, backend)
