"""``integrations.langchain.GovernorMiddleware`` in LangChain's real ``create_agent`` runtime:
tool outputs cut to the agent's share, and the ceiling (compaction, summaries, the agent's
prefix, ``on_ceiling``). The lease's release however a run ends, and bad configuration, are
in ``test_langchain_release.py``.

The chat model is a fake (``ToolCallingModel``, in ``langchain_agents.py``): no model small
enough to run offline calls tools, so it answers from the conversation instead. For each
user message it asks for ``rounds`` rounds of ``width`` parallel ``search`` calls, then
answers; it reports ``usage_metadata`` and records every prompt it was sent. ``search``
returns about 20,000 characters. The governor runs on ``FakeBackend``; the middleware still
counts, compacts and enforces against the governor's lease.
"""

from __future__ import annotations

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from governor import (
    AgentSpec,
    CeilingExceeded,
    Governor,
    GovernorConfig,
    GovernorEvent,
    LeaseState,
    Policies,
)
from governor.testing import FakeBackend
from integrations.langchain import GovernorMiddleware
from policies import DropOldest, SummarizeOldest
from tests.integrations.langchain_agents import (
    CODER,
    COUNTER,
    ToolCallingModel,
    assert_calls_with_results,
    assert_no_leaks,
    invoke,
    make_governor,
    search,
    search_output,
    thread,
)


# -- tool outputs -------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_tool_results_enter_the_state_within_tool_output_tokens(mode: str) -> None:
    governor, backend = make_governor()
    agent = create_agent(
        model=ToolCallingModel(),
        tools=[search],
        middleware=[GovernorMiddleware(governor, agent="coder")],
    )
    result = invoke(agent, "build", {}, mode)
    results = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    assert len(results) == 4
    saved = 0
    for message in results:
        assert isinstance(message.content, str)
        assert COUNTER.count(message.content) <= CODER.tool_output_tokens  # type: ignore[operator]
        assert message.name == "search" and message.status == "success"
        query = message.tool_call_id.replace("-", " ")
        saved += COUNTER.count(search_output(query)) - COUNTER.count(message.content)
    assert result["kvgov_tool_tokens_saved"] == saved > 0
    assert_calls_with_results(result["messages"])
    assert_no_leaks(governor, backend)


def test_tool_output_tokens_can_be_set_on_the_middleware() -> None:
    governor, backend = make_governor(coder=AgentSpec(name="coder", ceiling_tokens=2_000))
    middleware = GovernorMiddleware(governor, agent="coder", tool_output_tokens=50)
    agent = create_agent(model=ToolCallingModel(rounds=1), tools=[search], middleware=[middleware])
    result = agent.invoke({"messages": [HumanMessage("build")]})
    results = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    assert results and all(COUNTER.count(str(m.content)) <= 50 for m in results)
    assert_no_leaks(governor, backend)


def test_the_lease_is_parked_while_a_tool_runs() -> None:
    governor, backend = make_governor(config=GovernorConfig(park_after_s=0))
    seen: list[tuple[int, LeaseState]] = []
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)

    @tool
    def probe(query: str) -> str:
        """Report how many leases are active while a tool runs."""
        (lease,) = {e.lease_id for e in events if e.kind == "admitted"}
        seen.append((governor.admission.counts()[0], _state(events, lease)))
        return "ok"

    class ProbingModel(ToolCallingModel):
        def _reply(self, messages: list[BaseMessage]) -> AIMessage:
            reply = super()._reply(messages)
            for call in reply.tool_calls:
                call["name"] = "probe"
            return reply

    middleware = GovernorMiddleware(governor, agent="coder")
    agent = create_agent(
        model=ProbingModel(rounds=1, width=1), tools=[probe], middleware=[middleware]
    )
    agent.invoke({"messages": [HumanMessage("look")]})
    assert seen == [(0, LeaseState.PARKED)]
    # With park_after_s=0 an idle lease is parked at once: between model calls already
    # (reason "turn"), so it is parked when its tool starts, and stays so while it runs.
    assert [e.attributes["reason"] for e in events if e.kind == "parked"] == ["turn", "turn"]
    assert [e.kind for e in events if e.kind in ("tool.started", "tool.finished")] == [
        "tool.started",
        "tool.finished",
    ]
    assert_no_leaks(governor, backend)


def _state(events: list[GovernorEvent], lease_id: str) -> LeaseState:
    kinds = [e.kind for e in events if e.lease_id == lease_id and e.kind in ("parked", "resumed")]
    return LeaseState.PARKED if kinds and kinds[-1] == "parked" else LeaseState.ACTIVE


# -- the ceiling --------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_compaction_keeps_every_tool_call_with_its_results(mode: str) -> None:
    """Six user turns on one thread, two rounds of two tool calls each: the context
    passes the ceiling from the second turn on and is compacted; each turn starts from
    the compacted state the last one left in the checkpoint."""
    governor, backend = make_governor()
    model = ToolCallingModel()
    agent = create_agent(
        model=model,
        tools=[search],
        middleware=[GovernorMiddleware(governor, agent="coder")],
        checkpointer=InMemorySaver(),
    )
    room = CODER.ceiling_tokens - governor.config.reply_reserve_tokens
    previous: list[BaseMessage] = []
    for n in range(6):
        first = len(model.prompts)
        result = invoke(agent, f"task{n}", thread("long"), mode)
        messages = result["messages"]
        assert_calls_with_results(messages)
        # The thread resumed from the state the last turn left, compacted or not.
        assert [m.id for m in model.prompts[first][:-1]] == [m.id for m in previous]
        previous = messages
    assert all(COUNTER.count_messages(prompt) <= room for prompt in model.prompts)
    assert result["kvgov_compactions"] == 4  # from the third turn on
    assert result["kvgov_tokens_compacted"] > 0
    assert result["kvgov_model_calls"] == len(model.prompts) == 18
    assert result["kvgov_peak_tokens"] == max(COUNTER.count_messages(p) for p in model.prompts)
    assert result["kvgov_input_tokens"] == sum(COUNTER.count_messages(p) for p in model.prompts)
    assert result["kvgov_output_tokens"] == 5 * 18
    # DropOldest(keep_last_turns=2) keeps the first user message and the last two turns,
    # each with all its calls and results; the turns between went whole.
    assert [m.content for m in messages if isinstance(m, HumanMessage)] == [
        "task0",
        "task4",
        "task5",
    ]
    assert sum(isinstance(m, ToolMessage) for m in messages) == 8
    saved = agent.get_state(thread("long")).values["messages"]
    assert [m.id for m in saved] == [m.id for m in messages]
    assert_no_leaks(governor, backend)


def test_a_new_agent_on_the_same_checkpoint_starts_compacted() -> None:
    governor, backend = make_governor()
    saver = InMemorySaver()
    middleware = GovernorMiddleware(governor, agent="coder")
    first = create_agent(ToolCallingModel(), [search], middleware=[middleware], checkpointer=saver)
    for n in range(3):
        result = first.invoke({"messages": [HumanMessage(f"task{n}")]}, thread("t"))
    assert result["kvgov_compactions"] >= 1
    model = ToolCallingModel()
    second = create_agent(
        model,
        [search],
        middleware=[GovernorMiddleware(governor, agent="coder")],
        checkpointer=saver,
    )
    again = second.invoke({"messages": [HumanMessage("task3")]}, thread("t"))
    assert [m.id for m in model.prompts[0][:-1]] == [m.id for m in result["messages"]]
    assert again["kvgov_model_calls"] == result["kvgov_model_calls"] + 3  # summed per thread
    assert_calls_with_results(again["messages"])
    assert_no_leaks(governor, backend)


def test_a_summary_takes_the_place_of_the_turns_it_folds() -> None:
    """``SummarizeOldest`` writes a message of its own: it enters the state where the
    folded turns were, and the next turn starts from it."""
    backend = FakeBackend(num_blocks=1_024)
    policies = Policies(ceiling=SummarizeOldest(summary_tokens=64))
    governor = Governor(backend, agents=[CODER], policies=policies)
    model = ToolCallingModel()
    agent = create_agent(
        model,
        [search],
        middleware=[GovernorMiddleware(governor, agent="coder")],
        checkpointer=InMemorySaver(),
    )
    for n in range(4):
        result = invoke(agent, f"task{n}", thread("s"), "invoke")
        assert_calls_with_results(result["messages"])
    summaries = [m for m in result["messages"] if str(m.content).startswith("[Summary of")]
    assert len(summaries) == 1 and isinstance(summaries[0], HumanMessage)
    assert summaries[0].id is not None and summaries[0] is not result["messages"][0]
    assert result["kvgov_compactions"] >= 2
    assert_no_leaks(governor, backend)


def test_the_agents_prefix_is_counted_but_stays_out_of_the_state() -> None:
    backend = FakeBackend(num_blocks=1_024)
    spec = AgentSpec(name="coder", ceiling_tokens=2_000, tool_output_tokens=200, prefix="house")
    policies = Policies(ceiling=DropOldest(keep_last_turns=2))
    governor = Governor(backend, agents=[spec], policies=policies)
    house = "You are a careful coder. " * 20
    governor.register_prefix("house", house)
    model = ToolCallingModel()
    agent = create_agent(
        model,
        [search],
        middleware=[GovernorMiddleware(governor, agent="coder")],
        checkpointer=InMemorySaver(),
    )
    for n in range(4):
        result = invoke(agent, f"task{n}", thread("p"), "invoke")
    assert result["kvgov_compactions"] >= 1
    assert not any(house in str(m.content) for m in result["messages"])
    with_prefix = [[SystemMessage(house), *prompt] for prompt in model.prompts]
    assert result["kvgov_peak_tokens"] == max(COUNTER.count_messages(p) for p in with_prefix)
    governor.unregister_prefix("house")
    assert_no_leaks(governor, backend)


def test_on_ceiling_raise_raises_ceiling_exceeded() -> None:
    governor, backend = make_governor()
    middleware = GovernorMiddleware(governor, agent="coder", ceiling_tokens=800, on_ceiling="raise")
    agent = create_agent(model=ToolCallingModel(), tools=[search], middleware=[middleware])
    with pytest.raises(CeilingExceeded) as raised:
        agent.invoke({"messages": [HumanMessage("build")]})
    assert raised.value.agent == "coder" and raised.value.ceiling == 800
    assert raised.value.tokens > 800
    assert_no_leaks(governor, backend)


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_on_ceiling_end_ends_the_run_with_a_message(mode: str) -> None:
    governor, backend = make_governor()
    model = ToolCallingModel(rounds=5)
    middleware = GovernorMiddleware(governor, agent="coder", ceiling_tokens=1_200, on_ceiling="end")
    agent = create_agent(model=model, tools=[search], middleware=[middleware])
    result = invoke(agent, "build", {}, mode)
    last = result["messages"][-1]
    assert isinstance(last, AIMessage) and not last.tool_calls
    assert "ceiling of 1,200" in str(last.content)
    assert result["kvgov_model_calls"] == len(model.prompts) < 6
    assert_calls_with_results(result["messages"])
    assert_no_leaks(governor, backend)


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_turn_that_ends_at_the_ceiling_is_not_admitted_again(mode: str) -> None:
    """The lease parks during each tool call; the turn that would pass the ceiling ends
    the run without resuming it (it would wait for admission room it never uses)."""
    governor, backend = make_governor(config=GovernorConfig(park_after_s=0.0))
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)
    model = ToolCallingModel(rounds=5)
    middleware = GovernorMiddleware(governor, agent="coder", ceiling_tokens=1_200, on_ceiling="end")
    agent = create_agent(model=model, tools=[search], middleware=[middleware])
    result = invoke(agent, "build", {}, mode)
    assert "ceiling of 1,200" in str(result["messages"][-1].content)
    kinds = [e.kind for e in events if e.kind in ("admitted", "parked", "resumed")]
    assert kinds.count("admitted") == 1 and kinds[-1] == "parked"  # until released
    # Every model call but the first resumed the parked lease; the ending turn did not.
    assert kinds.count("resumed") == len(model.prompts) - 1
    assert_no_leaks(governor, backend)


def test_compact_with_the_default_ceiling_policy_raises() -> None:
    backend = FakeBackend(num_blocks=1_024)
    governor = Governor(backend, agents=[CODER])  # RaiseAtCeiling
    middleware = GovernorMiddleware(governor, agent="coder", ceiling_tokens=800)
    agent = create_agent(model=ToolCallingModel(), tools=[search], middleware=[middleware])
    with pytest.raises(CeilingExceeded):
        agent.invoke({"messages": [HumanMessage("build")]})
    assert_no_leaks(governor, backend)
