"""A fake chat model, a tool and checks shared by the tests of
``integrations.langchain.GovernorMiddleware`` (``test_langchain.py``,
``test_langchain_release.py``).

The chat model is a fake (``ToolCallingModel``): no model small enough to run offline
calls tools, so it answers from the conversation instead. For each user message it asks
for ``rounds`` rounds of ``width`` parallel ``search`` calls, then answers; it reports
``usage_metadata`` and records every prompt it was sent. ``search`` returns about
20,000 characters. ``make_governor`` runs the governor on ``FakeBackend``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from pydantic import Field

from governor import AgentSpec, Governor, GovernorConfig, Policies, TokenCounter
from governor.testing import FakeBackend
from policies import DropOldest

CODER = AgentSpec(name="coder", ceiling_tokens=2_000, tool_output_tokens=200)
COUNTER = TokenCounter()


class ToolCallingModel(BaseChatModel):
    """Per user message: ``rounds`` rounds of ``width`` parallel ``search`` calls, then an
    answer. ``prompts`` holds every prompt it was sent."""

    rounds: int = 2
    width: int = 2
    prompts: list[list[BaseMessage]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "tool-calling-fake"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ToolCallingModel:
        return self

    def _reply(self, messages: list[BaseMessage]) -> AIMessage:
        self.prompts.append(list(messages))
        asked = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
        done = sum(1 for m in messages[asked:] if isinstance(m, AIMessage) and m.tool_calls)
        task = str(messages[asked].content)
        usage = {"input_tokens": COUNTER.count_messages(messages), "output_tokens": 5}
        usage["total_tokens"] = usage["input_tokens"] + 5
        if done < self.rounds:
            calls = [
                {
                    "name": "search",
                    "args": {"query": f"{task} {done}.{k}"},
                    "id": f"{task}-{done}.{k}",
                }
                for k in range(self.width)
            ]
            return AIMessage(content="", tool_calls=calls, usage_metadata=usage)
        return AIMessage(content=f"answer to {task}", usage_metadata=usage)

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self._reply(messages))])

    async def _agenerate(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> ChatResult:
        await asyncio.sleep(0)
        return ChatResult(generations=[ChatGeneration(message=self._reply(messages))])


def search_output(query: str) -> str:
    return "".join(f"{query}: line {i} matched build step {i * 7} status ok\n" for i in range(400))


@tool
def search(query: str) -> str:
    """Search the logs for ``query``: about 20,000 characters of matching lines."""
    return search_output(query)


def make_governor(
    *, config: GovernorConfig | None = None, **agents: AgentSpec
) -> tuple[Governor, FakeBackend]:
    backend = FakeBackend(num_blocks=1_024)
    specs = agents.values() or [CODER]
    policies = Policies(ceiling=DropOldest(keep_last_turns=2))
    return Governor(backend, agents=specs, config=config, policies=policies), backend


def assert_no_leaks(governor: Governor, backend: FakeBackend) -> None:
    assert governor.admission.counts()[:2] == (0, 0)
    assert backend.metrics().num_blocks_in_use == 0


def assert_calls_with_results(messages: list[BaseMessage]) -> None:
    """Every call is followed by all its results, and every result follows its call."""
    for i, message in enumerate(messages):
        if isinstance(message, AIMessage) and message.tool_calls:
            ids = sorted(call["id"] for call in message.tool_calls)
            after = messages[i + 1 : i + 1 + len(ids)]
            assert all(isinstance(m, ToolMessage) for m in after), messages
            assert sorted(m.tool_call_id for m in after) == ids  # type: ignore[attr-defined]
        if isinstance(message, ToolMessage):
            call = next(m for m in reversed(messages[:i]) if isinstance(m, AIMessage))
            assert message.tool_call_id in {c["id"] for c in call.tool_calls}


def invoke(agent: Any, text: str, config: dict[str, Any], mode: str) -> dict[str, Any]:
    inputs = {"messages": [HumanMessage(text)]}
    if mode == "ainvoke":
        return asyncio.run(agent.ainvoke(inputs, config))
    return agent.invoke(inputs, config)


def thread(name: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": name}}
