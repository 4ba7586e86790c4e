"""The ceiling policies on built conversations, with exact token counts and properties."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from governor import CeilingExceeded, CeilingPolicy, CompactionEvent, ConfigError, TokenCounter
from policies import DropOldest, RaiseAtCeiling, SummarizeOldest
from policies._conversation import split

COUNTER = TokenCounter()
SYSTEM = {"role": "system", "content": "You are a careful coding agent."}
TASK = {"role": "user", "content": "Fix the failing test in tests/test_config.py."}


def tool_turn(n: int, results: int = 1, size: int = 40) -> list[dict]:
    calls = [
        {"id": f"call_{n}_{j}", "function": {"name": "run", "arguments": f'{{"cmd": "t{j}"}}'}}
        for j in range(results)
    ]
    out: list[dict] = [
        {"role": "user", "content": f"step {n}: go on"},
        {"role": "assistant", "content": "", "tool_calls": calls},
    ]
    out += [
        {"role": "tool", "tool_call_id": f"call_{n}_{j}", "content": f"line {n} {j}\n" * size}
        for j in range(results)
    ]
    out.append({"role": "assistant", "content": f"done with step {n}"})
    return out


def conversation(turns: int, results: int = 1, size: int = 40) -> list[dict]:
    out = [SYSTEM, TASK]
    for n in range(turns):
        out += tool_turn(n, results, size)
    return out


POLICIES = [RaiseAtCeiling(), DropOldest(), SummarizeOldest(summary_tokens=64)]


@pytest.mark.parametrize("policy", POLICIES, ids=repr)
def test_satisfies_the_protocol_and_leaves_a_fitting_conversation_alone(policy) -> None:
    assert isinstance(policy, CeilingPolicy)
    messages = conversation(3)
    tokens = COUNTER.count_messages(messages)
    kept, event = policy.compact(
        messages, ceiling_tokens=tokens + 100, reserve_tokens=100, counter=COUNTER
    )
    assert kept == messages and kept is not messages
    assert event == CompactionEvent("none", tokens, tokens, 14, 14, 0, 0, event.elapsed_s)
    assert not event.changed and event.tokens_saved == 0


@pytest.mark.parametrize("policy", POLICIES, ids=repr)
def test_limits_are_checked(policy) -> None:
    with pytest.raises(ConfigError, match="ceiling_tokens"):
        policy.compact([TASK], ceiling_tokens=0, reserve_tokens=0, counter=COUNTER)
    with pytest.raises(ConfigError, match="reserve_tokens"):
        policy.compact([TASK], ceiling_tokens=10, reserve_tokens=-1, counter=COUNTER)


def test_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="keep_last_turns"):
        DropOldest(0)
    with pytest.raises(ConfigError, match="summary_tokens"):
        SummarizeOldest(summary_tokens=0)


def test_raise_reports_the_agent_tokens_and_ceiling() -> None:
    messages = conversation(2)
    tokens = COUNTER.count_messages(messages)
    with pytest.raises(CeilingExceeded) as caught:
        RaiseAtCeiling(agent="planner").compact(
            messages, ceiling_tokens=tokens, reserve_tokens=50, counter=COUNTER
        )
    assert (caught.value.agent, caught.value.tokens, caught.value.ceiling) == (
        "planner",
        tokens + 50,
        tokens,
    )


def test_drop_oldest_keeps_the_head_and_the_last_turns_exactly() -> None:
    messages = conversation(10)
    last4 = [SYSTEM, TASK] + [m for n in range(6, 10) for m in tool_turn(n)]
    ceiling = COUNTER.count_messages(last4) + 200
    kept, event = DropOldest(4).compact(
        messages, ceiling_tokens=ceiling, reserve_tokens=200, counter=COUNTER
    )
    assert kept == last4
    assert event.method == "drop_oldest"
    assert event.tokens_before == COUNTER.count_messages(messages)
    assert event.tokens_after == COUNTER.count_messages(last4) == ceiling - 200
    assert (event.messages_before, event.messages_after) == (42, 18)
    assert (event.dropped, event.summarized) == (24, 0)
    assert event.tokens_saved == event.tokens_before - event.tokens_after > 0


def test_drop_oldest_keeps_fewer_turns_when_four_do_not_fit() -> None:
    messages = conversation(10)
    last2 = [SYSTEM, TASK] + [m for n in range(8, 10) for m in tool_turn(n)]
    ceiling = COUNTER.count_messages(last2) + 1  # three turns do not fit
    kept, event = DropOldest(4).compact(
        messages, ceiling_tokens=ceiling, reserve_tokens=1, counter=COUNTER
    )
    assert kept == last2 and event.tokens_after == ceiling - 1


def test_drop_oldest_falls_back_to_rounds_then_raises() -> None:
    messages = conversation(3)
    last_round = [SYSTEM, TASK, tool_turn(2)[-1]]  # the last turn's final answer alone
    ceiling = COUNTER.count_messages([SYSTEM, TASK, *tool_turn(2)]) - 1
    kept, _ = DropOldest().compact(
        messages, ceiling_tokens=ceiling, reserve_tokens=0, counter=COUNTER
    )
    assert kept == last_round  # the latest turn does not fit whole: its latest round does
    ceiling = COUNTER.count_messages(last_round) - 1
    with pytest.raises(CeilingExceeded) as caught:
        DropOldest(agent="w1").compact(
            messages, ceiling_tokens=ceiling, reserve_tokens=0, counter=COUNTER
        )
    assert caught.value.agent == "w1" and caught.value.tokens == ceiling + 1


def agent_loop(rounds: int) -> list[dict]:
    """One task, then model and tool rounds with no user message between them."""
    out = [SYSTEM, TASK]
    for n in range(rounds):
        call = {"id": f"c{n}", "function": {"name": "grep", "arguments": '{"q": "x"}'}}
        out.append({"role": "assistant", "content": f"round {n}", "tool_calls": [call]})
        out.append({"role": "tool", "tool_call_id": f"c{n}", "content": f"hit {n}\n" * 40})
    return out


@pytest.mark.parametrize("policy", [DropOldest(2), SummarizeOldest(summary_tokens=48)], ids=repr)
def test_an_agent_loop_under_one_task_is_compacted_by_rounds(policy) -> None:
    messages = agent_loop(8)
    ceiling = COUNTER.count_messages(messages) // 2
    kept, event = policy.compact(
        messages, ceiling_tokens=ceiling, reserve_tokens=50, counter=COUNTER
    )
    assert event.changed and event.tokens_after + 50 <= ceiling
    assert kept[:2] == [SYSTEM, TASK] and kept[-2:] == messages[-2:]
    calls = {c["id"] for m in kept for c in m.get("tool_calls") or ()}
    assert {m["tool_call_id"] for m in kept if m["role"] == "tool"} == calls


def test_summarize_oldest_replaces_the_oldest_turns_with_one_message() -> None:
    messages = conversation(10, size=60)
    tokens = COUNTER.count_messages(messages)
    ceiling = tokens // 2
    kept, event = SummarizeOldest(summary_tokens=64).compact(
        messages, ceiling_tokens=ceiling, reserve_tokens=100, counter=COUNTER
    )
    assert kept[:2] == [SYSTEM, TASK]
    note = kept[2]
    assert note["role"] == "user"
    assert note["content"].startswith(f"[Summary of {event.summarized} earlier messages]\n")
    assert COUNTER.count(note["content"].split("\n", 1)[1]) <= 64
    assert kept[3:] == messages[2 + event.summarized :]
    assert event.method == "summarize_oldest" and event.dropped == event.summarized
    assert event.tokens_before == tokens
    assert event.tokens_after == COUNTER.count_messages(kept) <= ceiling - 100
    assert event.messages_after == len(messages) - event.summarized + 1
    # The next compaction folds the running summary into the new one.
    more = kept + tool_turn(10, size=60) + tool_turn(11, size=60)
    again, second = SummarizeOldest(summary_tokens=64).compact(
        more, ceiling_tokens=ceiling, reserve_tokens=100, counter=COUNTER
    )
    notes = [m for m in again if m["content"].startswith("[Summary of ")]
    assert len(notes) == 1 and again[2] is not None and notes[0] is again[2]
    folded = second.summarized - 1 + event.summarized  # the old note stood for its count
    assert notes[0]["content"].startswith(f"[Summary of {folded} earlier messages]\n")
    assert again[3:] == more[2 + second.summarized :]


def test_compact_to_leaves_room_under_the_ceiling_so_the_next_calls_append() -> None:
    messages = conversation(12, size=60)
    ceiling = COUNTER.count_messages(messages) // 2
    brim = SummarizeOldest(summary_tokens=64)
    under = SummarizeOldest(summary_tokens=64, compact_to=0.6)
    full, _ = brim.compact(messages, ceiling_tokens=ceiling, reserve_tokens=100, counter=COUNTER)
    kept, event = under.compact(
        messages, ceiling_tokens=ceiling, reserve_tokens=100, counter=COUNTER
    )
    assert event.tokens_after <= int((ceiling - 100) * 0.6) < COUNTER.count_messages(full)
    assert kept[3:] == messages[2 + event.summarized :]  # the latest turns, whole
    # The summary keeps its part of what the compaction leaves: 0.6 of its 64 tokens.
    assert COUNTER.count(kept[2]["content"].split("\n", 1)[1]) <= int(64 * 0.6)
    # Calls appended after it fit without compacting again, where the brim's do not: the
    # prompt they extend is the one the engine computed last.
    grown = kept + tool_turn(12, size=60)
    again, second = under.compact(
        grown, ceiling_tokens=ceiling, reserve_tokens=100, counter=COUNTER
    )
    assert second.method == "none" and again == grown
    _, third = brim.compact(
        full + tool_turn(12, size=60), ceiling_tokens=ceiling, reserve_tokens=100, counter=COUNTER
    )
    assert third.method == "summarize_oldest"
    # Where the share cannot hold the head, a summary and the last turn, it goes to the brim.
    tight = SummarizeOldest(summary_tokens=64, compact_to=0.01)
    kept, event = tight.compact(
        messages, ceiling_tokens=ceiling, reserve_tokens=100, counter=COUNTER
    )
    assert event.method == "summarize_oldest" and event.tokens_after <= ceiling - 100
    assert kept == full
    with pytest.raises(ConfigError, match="compact_to must be a share of the ceiling"):
        SummarizeOldest(compact_to=0)
    with pytest.raises(ConfigError, match="compact_to"):
        SummarizeOldest(compact_to=1.5)


def test_summarize_oldest_uses_the_given_summarizer() -> None:
    class Tiny:
        def reduce(self, text, *, budget_tokens, tool_name=None, arguments=None):
            from governor import ToolOutputReduction

            return ToolOutputReduction("gist", COUNTER.count(text), 1, "tiny", 0.0)

    messages = conversation(6)
    kept, _ = SummarizeOldest(Tiny()).compact(
        messages,
        ceiling_tokens=COUNTER.count_messages(messages) // 2,
        reserve_tokens=0,
        counter=COUNTER,
    )
    # What the user said, verbatim, then the given summarizer's reduction of the calls and
    # their results at once (it gives no per-result gists); the model's short lines take
    # their share of what the tool output leaves.
    body = kept[2]["content"]
    assert body.endswith("\nuser: step 4: go on\ngist")
    assert all(f"user: step {n}: go on\n" in body for n in range(5))


def test_summarize_oldest_keeps_what_the_user_said_over_tool_output() -> None:
    decision = "Decision: keep pydantic pinned at 1.10.13 and do not upgrade it."
    errors = "".join(f"ERROR worker {n}: KeyError: 'customer_id' in batch {n}\n" for n in range(40))
    messages = [SYSTEM, TASK, {"role": "user", "content": decision}]
    for n in range(4):
        turn = tool_turn(n, size=1)
        turn[2]["content"] = errors  # error lines: what the extractive summarizer keeps first
        messages += turn
    ceiling = COUNTER.count_messages(messages) // 2
    policy = SummarizeOldest(summary_tokens=200)
    kept, _ = policy.compact(messages, ceiling_tokens=ceiling, reserve_tokens=0, counter=COUNTER)
    assert kept[2]["content"].startswith("[Summary of ")
    assert f"user: {decision}\n" in kept[2]["content"]
    assert COUNTER.count(kept[2]["content"].split("\n", 1)[1]) <= 200
    # Folded again with later turns, the running summary keeps it as said.
    more = kept + tool_turn(4, size=1) + tool_turn(5, size=1)
    more[-2]["content"] = more[-6]["content"] = errors
    again, _ = policy.compact(more, ceiling_tokens=ceiling, reserve_tokens=0, counter=COUNTER)
    notes = [m["content"] for m in again if m["content"].startswith("[Summary of ")]
    assert len(notes) == 1 and f"user: {decision}\n" in notes[0]


# --- properties -------------------------------------------------------------------------

WORDS = st.text(alphabet="abcdefgh xyz\n", min_size=0, max_size=120)


@st.composite
def conversations(draw) -> list[dict]:
    out: list[dict] = [
        {"role": "system", "content": draw(WORDS)},
        {"role": "user", "content": draw(WORDS)},
    ]
    for n in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["user", "assistant", "tools"]))
        if kind != "tools":
            out.append({"role": kind, "content": draw(WORDS)})
            continue
        ids = [f"c{n}_{j}" for j in range(draw(st.integers(1, 3)))]
        calls = [{"id": i, "function": {"name": "f", "arguments": draw(WORDS)}} for i in ids]
        out.append({"role": "assistant", "content": draw(WORDS), "tool_calls": calls})
        out += [{"role": "tool", "tool_call_id": i, "content": draw(WORDS)} for i in ids]
    for position, message in enumerate(out):
        message["seq"] = position  # not counted: tells equal messages apart
    return out


def check_wellformed(original: list[dict], kept: list[dict]) -> None:
    assert kept[:2] == original[:2]
    positions = [m["seq"] for m in kept if "seq" in m]  # order is preserved
    assert positions == sorted(positions)
    assert all(original[m["seq"]] == m for m in kept if "seq" in m)
    open_ids: set[str] = set()
    for i, message in enumerate(kept):
        if message["role"] == "tool":
            assert message["tool_call_id"] in open_ids
        elif message.get("tool_calls"):
            ids = [c["id"] for c in message["tool_calls"]]
            after = [m.get("tool_call_id") for m in kept[i + 1 : i + 1 + len(ids)]]
            assert after == ids  # every result is kept, right after its call
            open_ids = set(ids)
        else:
            open_ids = set()


def smallest_fit(messages: list[dict], policy: object) -> int:
    """The fewest tokens ``policy`` can compact ``messages`` to: the head and the last
    round (``DropOldest``), with the shortest summary note before them
    (``SummarizeOldest``: a one-token body, and a count at least as long as any it
    writes); the whole conversation for ``RaiseAtCeiling``."""
    if isinstance(policy, RaiseAtCeiling):
        return COUNTER.count_messages(messages)
    parts = split(messages, by_round=True)
    last = parts.turns[-1] if parts.turns else []
    kept = [messages[i] for i in parts.head]
    if isinstance(policy, SummarizeOldest) and len(parts.turns) > 1:
        note = f"[Summary of {len(messages)} earlier messages]\nx"
        kept.append({"role": "user", "content": note})
    return COUNTER.count_messages(kept + [messages[i] for i in last])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=conversations(),
    policy=st.sampled_from(POLICIES),
    fraction=st.floats(0.3, 1.1),
    reserve=st.integers(0, 40),
    room_for_the_last_round=st.booleans(),
)
def test_any_conversation_fits_or_raises(
    messages, policy, fraction, reserve, room_for_the_last_round
) -> None:
    tokens = COUNTER.count_messages(messages)
    smallest = smallest_fit(messages, policy)
    ceiling = max(1, int(tokens * fraction))
    if room_for_the_last_round:  # half the examples leave room for what must be kept
        ceiling = max(ceiling, smallest + reserve)
    try:
        kept, event = policy.compact(
            messages, ceiling_tokens=ceiling, reserve_tokens=reserve, counter=COUNTER
        )
    except CeilingExceeded as error:
        assert error.ceiling == ceiling and error.tokens > ceiling
        # A raise is right only when not even the head and the last round fit.
        assert smallest + reserve > ceiling, (smallest, reserve, ceiling)
        return
    assert COUNTER.count_messages(kept) + reserve <= ceiling
    if isinstance(policy, DropOldest):  # it keeps at least the last round: it cannot shrink more
        assert smallest + reserve <= ceiling
    assert event.tokens_before == tokens
    assert event.tokens_after == COUNTER.count_messages(kept)
    assert (event.messages_before, event.messages_after) == (len(messages), len(kept))
    check_wellformed(messages, kept)
    again, second = policy.compact(
        messages, ceiling_tokens=ceiling, reserve_tokens=reserve, counter=COUNTER
    )
    assert again == kept and second.tokens_after == event.tokens_after  # deterministic
