"""``GovernorMiddleware`` configured by keyword, the LangChain middleware convention, in
LangChain's real ``create_agent`` runtime.

The chat model is the fake of ``langgraph_graphs.py`` (no model small enough to run
offline calls tools): it asks for ``rounds`` calls of ``search`` (about 20,000 characters
each), then answers. The governor runs on ``FakeBackend``.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage, ToolMessage

from governor import AgentSpec, CeilingExceeded, ConfigError, Governor, GovernorEvent
from governor.testing import FakeBackend
from integrations.langchain import GovernedChatModel, GovernorMiddleware
from tests.integrations.langgraph_graphs import ToolCallingModel, search


def make_governor(*agents: AgentSpec) -> tuple[Governor, list[GovernorEvent]]:
    governor = Governor(FakeBackend(num_blocks=1_024), agents=list(agents))
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)
    return governor, events


def run(middleware: GovernorMiddleware, rounds: int = 1) -> dict[str, Any]:
    agent = create_agent(ToolCallingModel(rounds=rounds), [search], middleware=[middleware])
    return agent.invoke({"messages": [HumanMessage("find it")]})


def assert_no_leaks(governor: Governor) -> None:
    assert governor.admission.counts()[:2] == (0, 0)
    assert governor.backend.metrics().num_blocks_in_use == 0


def test_an_unknown_name_with_settings_is_created_and_registered() -> None:
    governor, events = make_governor()
    middleware = GovernorMiddleware(governor, agent="researcher", ceiling_tokens=4096)

    expected = AgentSpec(name="researcher", ceiling_tokens=4096)
    assert middleware.spec == expected
    assert governor.agent("researcher") == expected  # later users of the name find it
    assert GovernorMiddleware(governor, agent="researcher").spec == expected
    GovernedChatModel(governor=governor, model=ToolCallingModel(), agent="researcher")

    result = run(middleware, rounds=0)  # one search would not fit 4,096 tokens
    assert str(result["messages"][-1].content) == "answer after 0 searches"
    admitted = [e for e in events if e.kind == "admitted"]
    assert [(e.agent, e.attributes["ceiling_tokens"]) for e in admitted] == [("researcher", 4096)]
    assert_no_leaks(governor)


def test_the_created_agents_ceiling_is_enforced() -> None:
    """The lease runs at the ceiling given: a 20,000-character tool result passes it."""
    governor, _ = make_governor()
    middleware = GovernorMiddleware(
        governor, agent="researcher", ceiling_tokens=800, on_ceiling="raise"
    )
    with pytest.raises(CeilingExceeded) as raised:
        run(middleware)
    assert (raised.value.agent, raised.value.ceiling) == ("researcher", 800)
    assert_no_leaks(governor)


def test_tool_output_tokens_alone_creates_the_agent_at_the_default_ceiling() -> None:
    governor, _ = make_governor()
    middleware = GovernorMiddleware(governor, agent="reader", tool_output_tokens=100)
    default = governor.config.default_ceiling_tokens
    assert governor.agent("reader") == AgentSpec(
        name="reader", ceiling_tokens=default, tool_output_tokens=100
    )
    result = run(middleware, rounds=2)
    results = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    assert len(results) == 2
    assert all(governor.counter.count(str(m.content)) <= 100 for m in results)
    assert_no_leaks(governor)


def test_an_unknown_name_without_settings_says_how_to_create_it() -> None:
    governor, _ = make_governor(AgentSpec(name="coder", ceiling_tokens=2_000))
    with pytest.raises(ConfigError) as raised:
        GovernorMiddleware(governor, agent="codr")
    assert raised.value.setting == "agent"
    assert "known: 'coder'" in str(raised.value)
    assert "GovernorMiddleware(governor, agent='codr', ceiling_tokens=...)" in str(raised.value)
    assert "codr" not in governor.agents


def test_settings_that_conflict_with_the_registered_agent_are_refused() -> None:
    coder = AgentSpec(name="coder", ceiling_tokens=2_000, tool_output_tokens=200)
    governor, _ = make_governor(coder)
    with pytest.raises(ConfigError) as raised:
        GovernorMiddleware(governor, agent="coder", ceiling_tokens=150)
    assert raised.value.setting == "tool_output_tokens"
    assert "does not fit agent 'coder' (ceiling_tokens=2000, tool_output_tokens=200)" in str(
        raised.value
    )
    with pytest.raises(ConfigError, match="must be below its ceiling"):
        GovernorMiddleware(governor, agent="writer", ceiling_tokens=100, tool_output_tokens=100)
    assert "writer" not in governor.agents  # nothing registered from refused settings
    # Settings that fit override the registered spec for this middleware only.
    assert GovernorMiddleware(governor, agent="coder", ceiling_tokens=800).spec == AgentSpec(
        name="coder", ceiling_tokens=800, tool_output_tokens=200
    )
    assert governor.agent("coder") is coder
