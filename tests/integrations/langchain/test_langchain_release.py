"""``integrations.langchain.GovernorMiddleware`` returns the lease however a run ends: one
lease per run with its usage recorded, and released when a tool or the model fails, when
the run is interrupted for a human (and resumes), cancelled, or failed by another
middleware, before ``invoke`` raises. Bad configuration is refused up front.

The chat model and ``search`` are the fakes of ``langchain_agents.py``; the governor runs
on ``FakeBackend``.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, AgentState
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.runtime import Runtime
from langgraph.types import Command, interrupt

from governor import ConfigError, GovernorEvent
from integrations.langchain import GovernorMiddleware
from tests.integrations.langchain_agents import (
    COUNTER,
    ToolCallingModel,
    assert_no_leaks,
    invoke,
    make_governor,
    search,
)


# -- the lease ----------------------------------------------------------------------------
def test_one_lease_per_run_with_its_usage_recorded() -> None:
    governor, backend = make_governor()
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)
    model = ToolCallingModel()
    agent = create_agent(model, [search], middleware=[GovernorMiddleware(governor, agent="coder")])
    for _ in range(2):
        agent.invoke({"messages": [HumanMessage("build")]})
    released = [e for e in events if e.kind == "released"]
    assert len(released) == len({e.lease_id for e in events if e.kind == "requested"}) == 2
    assert [e.attributes["num_calls"] for e in released] == [3, 3]
    last = COUNTER.count_messages(model.prompts[-1]) + 5
    assert released[-1].attributes["tokens_in_context"] == last
    # Each call is recorded with the governor (Governor.record_call): its usage as reported.
    finished = [e for e in events if e.kind == "call.finished"]
    prompts = [COUNTER.count_messages(prompt) for prompt in model.prompts]
    assert [e.attributes["prompt_tokens"] for e in finished] == prompts
    assert all(e.attributes["completion_tokens"] == 5 for e in finished)
    assert_no_leaks(governor, backend)


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_failing_tool_releases_the_lease(mode: str) -> None:
    governor, backend = make_governor()

    @tool
    def search(query: str) -> str:  # the name the fake model calls
        """Fail."""
        raise RuntimeError("disk on fire")

    agent = create_agent(
        ToolCallingModel(), [search], middleware=[GovernorMiddleware(governor, agent="coder")]
    )
    with pytest.raises(RuntimeError, match="disk on fire"):
        invoke(agent, "build", {}, mode)
    assert_no_leaks(governor, backend)


def test_a_failing_model_releases_the_lease() -> None:
    governor, backend = make_governor()

    class Broken(ToolCallingModel):
        def _reply(self, messages: list[BaseMessage]) -> AIMessage:
            if len(self.prompts) == 1:
                raise ConnectionError("model went away")
            return super()._reply(messages)

    agent = create_agent(
        Broken(), [search], middleware=[GovernorMiddleware(governor, agent="coder")]
    )
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)
    with pytest.raises(ConnectionError):
        agent.invoke({"messages": [HumanMessage("build")]})
    assert_no_leaks(governor, backend)
    released = [e.attributes["error"] for e in events if e.kind == "released"]
    assert released == ["ConnectionError"]  # what ended the agent's run, for its span


def test_an_interrupted_run_releases_the_lease_without_failing_and_resumes() -> None:
    governor, backend = make_governor()

    @tool
    def search(query: str) -> str:  # the name the fake model calls
        """Ask a human first."""
        return f"{query}: {interrupt('run the search?')}"

    agent = create_agent(
        ToolCallingModel(rounds=1, width=1),
        [search],
        middleware=[GovernorMiddleware(governor, agent="coder")],
        checkpointer=InMemorySaver(),
    )
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)
    config: dict[str, Any] = {"configurable": {"thread_id": "asks"}}

    paused = agent.invoke({"messages": [HumanMessage("build")]}, config)
    assert paused["__interrupt__"]
    assert_no_leaks(governor, backend)  # nothing held while the human decides
    result = agent.invoke(Command(resume="yes"), config)

    assert result["messages"][-1].content == "answer to build"
    assert result["messages"][-2].content == "build 0.0: yes"  # the tool's, after the human
    assert_no_leaks(governor, backend)
    assert {e.attributes["error"] for e in events if e.kind == "released"} == {None}


def test_a_cancelled_run_releases_the_lease() -> None:
    governor, backend = make_governor()
    started = asyncio.Event()

    @tool
    async def search(query: str) -> str:  # the name the fake model calls
        """Never return."""
        started.set()
        await asyncio.Event().wait()
        return ""

    agent = create_agent(
        ToolCallingModel(), [search], middleware=[GovernorMiddleware(governor, agent="coder")]
    )
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)

    async def main() -> None:
        task = asyncio.create_task(agent.ainvoke({"messages": [HumanMessage("build")]}))
        await started.wait()
        assert [e.kind for e in events if e.kind in ("admitted", "released")] == ["admitted"]
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert_no_leaks(governor, backend)


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_an_error_elsewhere_releases_the_lease_before_invoke_raises(mode: str) -> None:
    """An error raised outside the middleware's hooks (another middleware's): the lease is
    returned by the time ``invoke`` raises, with the garbage collector off."""
    governor, backend = make_governor()
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)

    class Failing(AgentMiddleware[AgentState[Any], Any, Any]):
        def after_model(self, state: AgentState[Any], runtime: Runtime[Any]) -> None:
            raise LookupError("another middleware failed")

    middleware = [GovernorMiddleware(governor, agent="coder"), Failing()]
    agent = create_agent(ToolCallingModel(), [search], middleware=middleware)
    gc.collect()
    gc.disable()  # the run's state sits in reference cycles: only the collector frees it
    try:
        with pytest.raises(LookupError, match="another middleware failed"):
            invoke(agent, "build", {}, mode)
        assert_no_leaks(governor, backend)
        released = [e for e in events if e.kind == "released"]
        assert [e.attributes["error"] for e in released] == ["LookupError"]
    finally:
        gc.enable()


# -- configuration ------------------------------------------------------------------------
def test_bad_configuration_is_refused() -> None:
    governor, _ = make_governor()
    with pytest.raises(ConfigError, match="on_ceiling"):
        GovernorMiddleware(governor, agent="coder", on_ceiling="drop")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="planner"):
        GovernorMiddleware(governor, agent="planner")
    with pytest.raises(ConfigError, match="tool_output_tokens"):
        GovernorMiddleware(governor, agent="coder", tool_output_tokens=5_000)
    with pytest.raises(ConfigError, match="max_tokens"):
        GovernorMiddleware(governor, agent="coder", max_tokens=0)
    with pytest.raises(ConfigError, match="Governor"):
        GovernorMiddleware(object())  # type: ignore[arg-type]
    spec = GovernorMiddleware(governor).spec
    assert spec.name == "agent" and spec.ceiling_tokens == governor.config.default_ceiling_tokens
