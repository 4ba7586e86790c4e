"""What ``SummarizeOldest``'s running summary holds of an agent loop's tool results: each
folded call with its result's gist, beside what was said, in the room the summary keeps.
Real ``ExtractiveSummarizer`` and exact token counts throughout."""

from __future__ import annotations

import json
import re

from governor import TokenCounter
from policies import ExtractiveSummarizer, SummarizeOldest

COUNTER = TokenCounter()
SYSTEM = {"role": "system", "content": "You are a careful on-call agent."}
TASK = {"role": "user", "content": "Find why the billing workers fail and report it."}
NARRATION = (
    "The last result narrows it down, so next I read the logs to confirm where it breaks. "
    "Nothing in that output contradicts the current hypothesis, and I keep the error lines. "
) * 4


def error_line(n: int) -> str:
    return f"ERROR billing.worker: batch {7000 + n} failed: KeyError: 'customer_{n:03d}'"


def round_of(n: int, *, narration: str = NARRATION) -> list[dict]:
    """One round of an agent loop: the model narrates and calls a tool, whose log holds
    one error line among many alike."""
    call = {
        "id": f"call_{n}",
        "type": "function",
        "function": {"name": "read_logs", "arguments": json.dumps({"service": f"billing-{n}"})},
    }
    log = [f"2026-12-07T10:{i:02d}:00Z INFO billing.worker: batch {i} ok" for i in range(60)]
    log.insert(37, f"2026-12-07T10:37:30Z {error_line(n)}")
    return [
        {"role": "assistant", "content": narration, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"call_{n}", "content": "\n".join(log)},
    ]


def loop(rounds: range) -> list[dict]:
    return [message for n in rounds for message in round_of(n)]


def summary_of(messages: list[dict]) -> str:
    (note,) = [m["content"] for m in messages if m["content"].startswith("[Summary of ")]
    return note.split("\n", 1)[1]


POLICY = SummarizeOldest(ExtractiveSummarizer(COUNTER), summary_tokens=600)


def compact(messages: list[dict], ceiling: int) -> list[dict]:
    kept, _ = POLICY.compact(messages, ceiling_tokens=ceiling, reserve_tokens=0, counter=COUNTER)
    assert COUNTER.count_messages(kept) <= ceiling
    return kept


def test_a_narrating_agent_keeps_every_folded_results_error_line() -> None:
    messages = [SYSTEM, TASK, *loop(range(12))]
    kept = compact(messages, 4_000)
    body = summary_of(kept)
    assert COUNTER.count(body) <= 600
    folded = [n for n in range(12) if error_line(n) not in "".join(m["content"] for m in kept[3:])]
    assert len(folded) >= 8
    # Each folded call, with its result's most telling line: what its tool found.
    for n in folded:
        assert f'read_logs({{"service": "billing-{n}"}}) -> ' in body
        assert error_line(n) in body
    # The model's narration takes its share, not the whole summary.
    assert body.count("assistant: ") < len(folded)


def test_folded_again_the_earlier_gists_stay() -> None:
    messages = [SYSTEM, TASK, *loop(range(12))]
    first = compact(messages, 4_000)
    again = compact([*first, *loop(range(12, 16))], 4_000)
    body = summary_of(again)
    assert COUNTER.count(body) <= 600
    for n in range(8):  # folded the first time, kept through the second (a shorter gist)
        assert error_line(n)[:-1] in body
    assert re.search(r"^\[Summary of (\d+) earlier messages\]", again[2]["content"])


def test_the_summary_keeps_its_room() -> None:
    # The latest turns no longer squeeze the summary to a few tokens: it keeps its
    # summary_tokens, and fewer turns stay whole.
    messages = [SYSTEM, TASK, *loop(range(12))]
    body = summary_of(compact(messages, 4_000))
    assert COUNTER.count(body) >= 400


def test_what_the_user_said_stays_whole_over_the_models_narration() -> None:
    decision = {"role": "user", "content": "Decision: do not restart billing-3 before noon."}
    messages = [SYSTEM, TASK, *loop(range(3)), decision, *loop(range(3, 12))]
    body = summary_of(compact(messages, 4_000))
    assert f"user: {decision['content']}" in body
