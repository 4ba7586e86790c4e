"""The agent's last request reaches the tool-output policy, through both integrations.

The middleware (``GovernorMiddleware`` on ``create_agent``) and ``govern`` (a governed
graph's tools node) each pass the latest user or assistant text before a tool call as
``question``; a policy written to the protocol before ``question`` existed is still
called, without it. The chat model is the fake of ``langgraph_graphs`` (no model small
enough to run offline calls tools).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage

from governor import AgentSpec, Governor, HeadTailTruncation, Policies, ToolOutputReduction
from governor.testing import FakeBackend
from integrations.langchain import GovernorMiddleware
from integrations.langgraph import govern
from tests.integrations.langgraph_graphs import ToolCallingModel, search

ASSISTANT = AgentSpec(name="assistant", ceiling_tokens=4_000, tool_output_tokens=200)
TASK = "why did build step 42 fail?"


class Recording:
    """Head-and-tail truncation that records the ``question`` of every call."""

    def __init__(self) -> None:
        self.inner = HeadTailTruncation()
        self.questions: list[str | None] = []

    def reduce(
        self,
        text: str,
        *,
        budget_tokens: int,
        tool_name: str | None = None,
        arguments: Mapping[str, Any] | None = None,
        question: str | None = None,
    ) -> ToolOutputReduction:
        self.questions.append(question)
        return self.inner.reduce(text, budget_tokens=budget_tokens)


class OldProtocol(Recording):
    """A policy from before ``question``: its ``reduce`` does not take it."""

    def reduce(  # type: ignore[override]
        self,
        text: str,
        *,
        budget_tokens: int,
        tool_name: str | None = None,
        arguments: Mapping[str, Any] | None = None,
    ) -> ToolOutputReduction:
        self.questions.append("called")
        return self.inner.reduce(text, budget_tokens=budget_tokens)


def run(policy: Recording, how: str) -> None:
    governor = Governor(
        FakeBackend(num_blocks=4_096), agents=[ASSISTANT], policies=Policies(tool_output=policy)
    )
    model = ToolCallingModel(rounds=2)
    if how == "middleware":
        middleware = GovernorMiddleware(governor, agent="assistant")
        agent: Any = create_agent(model, [search], middleware=[middleware])
    else:
        agent = govern(create_agent(model, tools=[search]), governor, {"model": ASSISTANT})
    agent.invoke({"messages": [HumanMessage(TASK)]})


@pytest.mark.parametrize("how", ["middleware", "govern"])
def test_the_last_request_is_the_question(how: str) -> None:
    policy = Recording()
    run(policy, how)
    # The model's tool-calling replies have no text: the user's request is the latest.
    assert policy.questions == [TASK, TASK]


@pytest.mark.parametrize("how", ["middleware", "govern"])
def test_a_policy_without_question_is_called_without_it(how: str) -> None:
    policy = OldProtocol()
    run(policy, how)
    assert policy.questions == ["called", "called"]
