"""``Governor(policies=Policies(...))``: the four decisions, their defaults, and the events
each decision publishes."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governor import (
    AgentSpec,
    CeilingExceeded,
    ConfigError,
    Governor,
    GovernorConfig,
    GovernorEvent,
    HeadTailTruncation,
    Lease,
    LeaseState,
    Policies,
    PressureOrder,
    PriorityWithAging,
    RaiseAtCeiling,
    TokenCounter,
)
from governor.testing import FakeBackend
from policies import DropOldest, ExtractiveSummarizer

COUNTER = TokenCounter()
CODER = AgentSpec(name="coder", ceiling_tokens=400, tool_output_tokens=60)
LOG = "".join(f"tests/test_{i}.py::test_case PASSED [{i}%]\n" for i in range(200))
LOG += "tests/test_api.py::test_login FAILED\nE   AssertionError: 401 != 200\n"


def _events(governor: Governor) -> list[GovernorEvent]:
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)
    return events


def test_defaults_are_the_governors_own() -> None:
    governor = Governor(FakeBackend(), agents=[CODER])
    assert isinstance(governor.tool_output_policy, HeadTailTruncation)
    assert isinstance(governor.admission.policy, PriorityWithAging)
    assert isinstance(governor.idle.pressure, PressureOrder)
    assert governor.policies == Policies()


def test_a_policy_without_its_method_is_refused_at_construction() -> None:
    with pytest.raises(ConfigError, match=r"policies.ceiling must be a CeilingPolicy .*compact"):
        Policies(ceiling=ExtractiveSummarizer())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="tool_output must be a ToolOutputPolicy"):
        Policies(tool_output=DropOldest())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"governor.Policies\("):
        Governor(FakeBackend(), policies={"ceiling": DropOldest()})  # type: ignore[arg-type]


def test_tool_output_is_reduced_by_the_policy_and_recorded() -> None:
    policies = Policies(tool_output=ExtractiveSummarizer(COUNTER))
    governor = Governor(FakeBackend(), agents=[CODER], policies=policies)
    events = _events(governor)
    with governor.lease("coder") as lease:
        with governor.tool_call(lease, "pytest", {"path": "tests/test_api.py"}) as call:
            pass
        reduced = call.reduce(LOG)
    assert reduced.tokens_after <= 60 < reduced.tokens_before
    assert COUNTER.count(reduced.text) == reduced.tokens_after
    assert "AssertionError: 401 != 200" in reduced.text
    assert lease.tokens_summarized == reduced.tokens_saved
    summarized = [e for e in events if e.kind == "summarized"]
    assert len(summarized) == 1 and summarized[0].record is reduced
    assert summarized[0].attributes == {"tool": "pytest"}


def test_the_default_tool_output_policy_keeps_head_and_tail_within_budget() -> None:
    governor = Governor(FakeBackend(), agents=[CODER])
    with governor.lease("coder") as lease:
        reduced = governor.reduce_tool_output(lease, LOG, tool="pytest")
    assert reduced.method == "head_tail" and reduced.tokens_after <= 60
    assert reduced.text.startswith("tests/test_0.py")
    assert reduced.text.endswith("AssertionError: 401 != 200\n")
    assert "lines (" in reduced.text and "removed" in reduced.text


def test_an_agent_without_a_tool_budget_keeps_its_outputs() -> None:
    agent = AgentSpec(name="plain", ceiling_tokens=400)
    governor = Governor(FakeBackend(), agents=[agent])
    with governor.lease("plain") as lease:
        kept = governor.reduce_tool_output(lease, LOG)
    assert kept.text == LOG and kept.method == "none"


def _history(turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You fix bugs."}]
    messages.append({"role": "user", "content": "Fix the login test."})
    for i in range(turns):
        messages.append({"role": "assistant", "content": f"Step {i}: " + "looking " * 20})
        messages.append({"role": "user", "content": f"Result {i}: " + "output " * 20})
    return messages


def test_the_default_ceiling_policy_raises_before_the_call() -> None:
    backend = FakeBackend()
    governor = Governor(backend, agents=[CODER])
    with governor.lease("coder") as lease, pytest.raises(CeilingExceeded, match="'coder'"):
        governor.complete(lease, _history(12), max_tokens=20)
    assert backend.calls == []


def test_a_compacting_policy_runs_in_the_call_and_is_recorded() -> None:
    backend = FakeBackend()
    policies = Policies(ceiling=DropOldest(keep_last_turns=2))
    governor = Governor(backend, agents=[CODER], policies=policies)
    events = _events(governor)
    history = _history(12)
    with governor.lease("coder") as lease:
        result = governor.complete(lease, history, max_tokens=20)
        compacted, event = governor.compact(lease, history, max_tokens=20)
    sent = backend.calls[0].messages
    assert sent == compacted
    assert result.prompt_tokens == event.tokens_after == COUNTER.count_messages(sent)
    assert event.tokens_after + 20 <= 400 < event.tokens_before + 20
    assert sent[:2] == history[:2]  # the system prompt and the task stay
    assert lease.num_compactions == 2 and lease.tokens_compacted == 2 * event.tokens_saved
    compactions = [e for e in events if e.kind == "compacted"]
    assert [e.record.method for e in compactions] == ["drop_oldest", "drop_oldest"]


def test_without_max_tokens_a_quarter_of_the_ceiling_at_most_is_reserved() -> None:
    governor = Governor(FakeBackend(), agents=[CODER], config=GovernorConfig())
    with governor.lease("coder") as lease:
        _, event = governor.compact(lease, _history(3))
        assert governor.reply_reserve(lease) == 100  # min(256, 400 // 4)
        assert event.method == "none"
        with pytest.raises(ConfigError, match="max_tokens"):
            governor.compact(lease, _history(3), max_tokens=0)


def test_raise_at_ceiling_names_the_numbers() -> None:
    messages = _history(12)
    tokens = COUNTER.count_messages(messages)
    with pytest.raises(CeilingExceeded) as caught:
        RaiseAtCeiling(agent="planner").compact(
            messages, ceiling_tokens=400, reserve_tokens=10, counter=COUNTER
        )
    assert "planner" in str(caught.value) and f"{tokens + 10:,}" in str(caught.value)


def _lease(number: int, *, priority: int, parked: bool, tokens: int) -> Lease:
    lease = Lease(
        lease_id=str(number),
        agent=CODER,
        ceiling_tokens=400,
        priority=priority,
        block_size=16,
        arrival=number,
        requested_at=0.0,
    )
    lease.state = LeaseState.PARKED if parked else LeaseState.ACTIVE
    lease.num_retained_tokens = tokens
    return lease


def test_pressure_order_is_priority_parked_most_blocks_newest() -> None:
    leases = [
        _lease(0, priority=1, parked=True, tokens=320),  # high priority: last
        _lease(1, priority=0, parked=False, tokens=320),  # active: after the parked
        _lease(2, priority=0, parked=True, tokens=160),
        _lease(3, priority=0, parked=True, tokens=320),  # most blocks of the parked
        _lease(4, priority=0, parked=True, tokens=160),  # newer than 2
    ]
    chosen = PressureOrder().choose(leases, num_blocks_needed=10_000)
    assert [c.lease.lease_id for c in chosen] == ["3", "4", "2", "1", "0"]
    assert chosen[0].num_blocks == 20
    assert chosen[0].reason == "priority 0, parked, 20 blocks, request #3"
    assert "idle" in chosen[3].reason
    enough = PressureOrder().choose(leases, num_blocks_needed=25)
    assert [c.lease.lease_id for c in enough] == ["3", "4"]  # 20 + 10 blocks >= 25


def test_a_subscriber_that_raises_is_reported_and_does_not_break_the_call() -> None:
    governor = Governor(FakeBackend(), agents=[CODER])

    def broken(event: GovernorEvent) -> None:
        raise ValueError("exporter down")

    unsubscribe = governor.subscribe(broken)
    with pytest.warns(RuntimeWarning, match="exporter down"), governor.lease("coder"):
        pass
    unsubscribe()
    unsubscribe()  # idempotent
    with governor.lease("coder"):
        pass
    with pytest.raises(ConfigError, match="callable"):
        governor.subscribe("print")  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None)
@given(
    text=st.text(st.characters(codec="utf-8"), max_size=600)
    | st.lists(st.text(max_size=40), max_size=60).map("\n".join),
    budget=st.integers(1, 80),
)
def test_head_tail_truncation_never_exceeds_the_budget(text: str, budget: int) -> None:
    reduced = HeadTailTruncation(COUNTER).reduce(text, budget_tokens=budget)
    assert COUNTER.count(reduced.text) == reduced.tokens_after <= budget
    if COUNTER.count(text) <= budget:
        assert reduced.text == text and reduced.method == "none"


@pytest.mark.parametrize("share", [-0.1, 1.5, math.nan, True])
def test_head_tail_truncation_checks_its_share(share: float) -> None:
    with pytest.raises(ConfigError, match="head_share"):
        HeadTailTruncation(COUNTER, head_share=share)
    with pytest.raises(ConfigError, match="budget_tokens"):
        HeadTailTruncation(COUNTER).reduce("x", budget_tokens=0)
