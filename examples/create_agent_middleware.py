"""A LangChain ``create_agent`` agent run within a governor lease, through ``GovernorMiddleware``.

What it shows: one line of middleware gives a ``create_agent`` agent a lease with a token
ceiling. Tool results (about 20,000 characters each here, a pytest log and a service log)
are summarized to the agent's ``tool_output_tokens`` before they enter the state, and when
the conversation would pass the ceiling it is compacted (``on_ceiling="compact"``, by the
governor's ``SummarizeOldest`` policy), in the state too, so the checkpointed thread
stays small. The middleware's counters live in the graph state (``kvgov_*``).

The agent needs a model that calls tools, which the bundled tiny random model cannot do,
so a scripted fake chat model (LangChain's ``GenericFakeChatModel``) stands in and the
governor runs on ``FakeBackend`` (exact block accounting, no model).

    python examples/create_agent_middleware.py          # 4 questions on one thread
    python examples/create_agent_middleware.py --fast   # 2 questions
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Iterator
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from governor import AgentSpec, FakeBackend, Governor, Policies
from integrations import GovernorMiddleware
from policies import ExtractiveSummarizer, SummarizeOldest

AREAS = ["api", "auth", "billing", "cart", "orders", "search", "users", "export"]
CASES = ["ok", "empty", "invalid", "paging", "retry", "timeout", "unicode", "large"]


@tool
def run_tests(path: str) -> str:
    """Run the test suite under ``path`` and return pytest's output."""
    rng = random.Random(path)
    lines = []
    for _ in range(380):
        test = f"test_{rng.choice(AREAS)}.py::test_{rng.choice(AREAS)}_{rng.choice(CASES)}"
        lines.append(f"{path}/{test} PASSED [{rng.randint(1, 900)}ms]")
    lines[200] = f"{path}/test_auth.py::test_login FAILED\nE   KeyError: 'user'"
    return "\n".join(lines)


@tool
def read_logs(service: str) -> str:
    """Return the last two hours of ``service``'s log."""
    rng = random.Random(service)
    lines = []
    for i in range(340):
        request = f"{rng.choice(['GET', 'POST'])} /{rng.choice(AREAS)}/{rng.randint(1, 9999)}"
        status = f"{rng.choice([200, 201, 304])} in {rng.randint(2, 90)}ms"
        lines.append(f"12:{i // 6:02d}:{i % 6}0 INFO {service} {request} {status}")
    lines[250] = f"12:41:40 ERROR {service} session store timeout after 5000ms"
    return "\n".join(lines)


def script(questions: int) -> Iterator[AIMessage]:
    """What the stand-in model says: for each question, two tool calls, then an answer."""
    for q in range(questions):
        calls = [("run_tests", {"path": f"tests/unit{q}"}), ("read_logs", {"service": "auth"})]
        for r, (name, args) in enumerate(calls):
            yield AIMessage("", tool_calls=[{"name": name, "args": args, "id": f"call-{q}-{r}"}])
        yield AIMessage(f"Answer {q}: test_login fails with KeyError 'user'; see the auth log.")


class ScriptedModel(GenericFakeChatModel):
    """``GenericFakeChatModel`` replays its messages; ``create_agent`` also binds tools."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:
        return self


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="2 questions instead of 4")
    args = parser.parse_args()
    questions = 2 if args.fast else 4
    print("A scripted fake chat model stands in: the tiny random model cannot call tools.")

    backend = FakeBackend(num_blocks=512)
    coder = AgentSpec(name="coder", ceiling_tokens=1_536)
    policies = Policies(
        tool_output=ExtractiveSummarizer(backend.counter), ceiling=SummarizeOldest()
    )
    governor = Governor(backend, agents=[coder], policies=policies)
    middleware = GovernorMiddleware(
        governor, agent="coder", tool_output_tokens=320, on_ceiling="compact"
    )
    agent = create_agent(
        model=ScriptedModel(messages=script(questions)),
        tools=[run_tests, read_logs],
        middleware=[middleware],
        checkpointer=InMemorySaver(),
    )
    thread: RunnableConfig = {"configurable": {"thread_id": "fix-login"}}
    print(f"each tool returns about {len(run_tests.invoke({'path': 'tests'})):,} characters")
    for q in range(questions):
        question = HumanMessage(f"Question {q}: why does login fail?")
        state = agent.invoke({"messages": [question]}, thread)
        size = f"{len(state['messages'])} messages in the state"
        print(f"after question {q}: {size}, compactions so far: {state['kvgov_compactions']}")

    print("\nthe thread's messages now (tokens each):")
    for message in state["messages"]:
        text = str(message.content)
        if isinstance(message, AIMessage) and message.tool_calls:
            label = "calls " + ", ".join(call["name"] for call in message.tool_calls)
        elif isinstance(message, ToolMessage):
            label = f"{message.name}'s result, summarized"
        else:
            label = text.partition("\n")[0][:60]
        print(f"  {message.type:<6} {governor.counter.count(text):>4,}  {label}")
    print("\nmiddleware counters in the state:")
    for key in sorted(k for k in state if k.startswith("kvgov_")):
        print(f"  {key:<24} {state[key]:>7,}")


if __name__ == "__main__":
    main()
