"""The open-loop workload: Poisson team arrivals of weighted tenants, agents whose contexts
grow to a ceiling, heavy-tailed tools, and the exact prompt ids every policy sends."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import statistics
from collections import Counter
from typing import Any

import pytest

from engine.presets import PRESETS
from engine.tokenizer import Tokenizer, load_tokenizer
from governor import TokenCounter
from kvgov.benchmarks.openloop.chat_ids import LineIds
from kvgov.benchmarks.openloop.workload import (
    CPU,
    MIXES,
    TENANTS,
    TWIN,
    OpenLoopWorkload,
    OpenLoopWorkloadError,
    Tenant,
    Tool,
    arrivals,
    build,
    counter_for,
    describe,
    prompts,
)
from policies import build_corpus

SMALL = OpenLoopWorkload(
    rate_per_min=4.0,
    duration_s=60.0,
    tenants=(
        Tenant(name="swe", weight=2.0, workers_per_team=2, turns=(8, 10), mix="swe"),
        Tenant(name="bfcl", weight=1.0, workers_per_team=1, turns=(4, 6), mix="bfcl"),
    ),
    reply_tokens=(20, 60),
    tool_output_tokens=300,
    ceiling_tokens=2_000,
    system_tokens=200,
    seed=3,
)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return load_tokenizer(PRESETS["tiny-random"].tokenizer)


@pytest.fixture(scope="module")
def counter(tokenizer: Tokenizer) -> TokenCounter:
    """Counts exactly as the engine's tokenizer, with no cache of this module's."""
    return TokenCounter(tokenizer=tokenizer)


@pytest.fixture(scope="module")
def small(tokenizer: Tokenizer) -> tuple[Any, ...]:
    return build(SMALL, counter_for(tokenizer))


def _count(counter: TokenCounter, turn: Any) -> int:
    return counter.count_messages(list(turn.messages))


def test_the_same_seed_builds_equal_scripts_and_another_seed_other_arrivals(
    tokenizer: Tokenizer, small: tuple[Any, ...]
) -> None:
    assert build(SMALL, counter_for(tokenizer)) == small
    other = dataclasses.replace(SMALL, seed=4)
    assert arrivals(other) != arrivals(SMALL)
    assert [s.arrival_s for s in small if s.planner] == [at for at, _ in arrivals(SMALL)]


def test_the_fast_counter_builds_what_the_tokenizer_itself_builds(
    tokenizer: Tokenizer, counter: TokenCounter, small: tuple[Any, ...]
) -> None:
    assert build(SMALL, counter) == small


def test_teams_arrive_as_a_poisson_process() -> None:
    workload = dataclasses.replace(SMALL, rate_per_min=6.0, duration_s=100_000.0)
    times = [at for at, _ in arrivals(workload)]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert len(times) > 9_000
    assert all(0.0 <= at < workload.duration_s for at in times)
    assert statistics.mean(gaps) == pytest.approx(60.0 / 6.0, rel=0.03)
    # Exponential gaps: their spread is their mean (a fixed gap's is 0).
    assert statistics.stdev(gaps) / statistics.mean(gaps) == pytest.approx(1.0, abs=0.05)


def test_a_window_with_no_arrival_still_gets_one_team() -> None:
    workload = dataclasses.replace(SMALL, rate_per_min=0.001, duration_s=1.0)
    teams = arrivals(workload)
    assert len(teams) == 1 and teams[0][0] == 0.0


def test_tenants_share_the_teams_by_their_weights() -> None:
    workload = dataclasses.replace(TWIN, rate_per_min=6.0, duration_s=60_000.0)
    counts = Counter(tenant.name for _, tenant in arrivals(workload))
    total = sum(t.weight for t in TENANTS)
    for tenant in TENANTS:
        assert counts[tenant.name] / sum(counts.values()) == pytest.approx(
            tenant.weight / total, abs=0.02
        )


def test_teams_are_named_numbered_and_ordered_planner_first(small: tuple[Any, ...]) -> None:
    names = [s.name for s in small]
    assert len(set(names)) == len(names)
    teams = sorted({s.team for s in small})
    assert len(teams) >= 3 and {s.tenant for s in small} == {"swe", "bfcl"}
    tenants = {t.name: t for t in SMALL.tenants}
    for team in teams:
        members = [s for s in small if s.team == team]
        planner, *workers = members
        tenant = tenants[planner.tenant]
        assert planner.planner and not any(w.planner for w in workers)
        assert planner.name == f"{tenant.name}-t{team}-planner"
        assert [w.name for w in workers] == [
            f"{tenant.name}-t{team}-w{j}" for j in range(tenant.workers_per_team)
        ]
        assert {w.tenant for w in workers} == {tenant.name}
        assert all(w.system == planner.system for w in workers)
        for w in workers:  # tool calls drawn in the tenant's range, then the report
            assert tenant.turns[0] + 1 <= len(w.turns) <= tenant.turns[1] + 1
            assert w.turns[-1].tool is None and all(t.tool for t in w.turns[:-1])


def test_every_call_draws_its_reply_tokens_in_range(small: tuple[Any, ...]) -> None:
    replies = [t.reply_tokens for s in small for t in s.turns]
    low, high = SMALL.reply_tokens
    assert all(r is not None and low <= r <= high for r in replies)
    assert len(set(replies)) > 10  # drawn per call, not one per agent


def test_tool_latencies_are_clipped_lognormals_and_expected_is_their_mean() -> None:
    rng = random.Random(0)
    wild = Tool(
        name="slow",
        median_s=1.0,
        sigma=4.0,
        min_tokens=1,
        max_tokens=2,
        category="test_log",
        weight=1.0,
    )
    draws = [wild.draw_s(rng) for _ in range(4_000)]
    assert min(draws) == 0.001 and max(draws) == 30.0
    for tool in (wild, *MIXES["swe"], *MIXES["bfcl"]):
        sample = [tool.draw_s(rng) for _ in range(40_000)]
        assert statistics.mean(sample) == pytest.approx(tool.mean_s, rel=0.03), tool.name


# The middle 80% of each tool's latency (seconds) and its output sizes (tokens), as its
# mix's comment cites them.
_BANDS = {
    "open_file": (0.005, 0.15, 400, 2_500),
    "search": (0.03, 0.6, 100, 1_500),
    "edit": (0.005, 0.1, 1, 300),
    "run_tests": (2.0, 30.0, 300, 4_000),
    "run_repro": (0.4, 6.0, 100, 2_000),
    "api_get": (0.04, 1.0, 100, 600),
    "api_post": (0.04, 1.0, 100, 600),
    "web_search": (0.3, 3.0, 200, 1_500),
    "fetch_page": (0.4, 6.0, 500, 3_000),
}


def test_each_tool_s_latency_and_output_lie_in_the_band_it_models() -> None:
    rng = random.Random(1)
    tools = [t for mix in MIXES.values() for t in mix]
    assert {t.name for t in tools} == _BANDS.keys()
    for tool in tools:
        low_s, high_s, low_tokens, high_tokens = _BANDS[tool.name]
        draws = sorted(tool.draw_s(rng) for _ in range(2_000))
        assert low_s <= draws[200] and draws[1_800] <= high_s, tool.name
        assert low_tokens <= tool.min_tokens <= tool.max_tokens <= high_tokens, tool.name


def test_the_swe_mix_spans_milliseconds_to_tens_of_seconds(tokenizer: Tokenizer) -> None:
    swe_only = dataclasses.replace(SMALL, tenants=SMALL.tenants[:1], duration_s=30.0)
    scripts = build(swe_only, counter_for(tokenizer))
    means = {t.name: t.mean_s for t in MIXES["swe"]}
    turns = [t for s in scripts if not s.planner for t in s.turns if t.tool]
    latencies = [t.tool_s for t in turns]
    assert all(0.001 <= s <= 30.0 for s in latencies)
    assert any(s > 2.0 for s in latencies) and any(s < 0.1 for s in latencies)
    assert all(t.expected_s == means[t.tool] for t in turns)
    assert {t.tool for t in turns} == set(means)


def test_contexts_grow_every_turn_and_stay_under_the_ceiling(
    small: tuple[Any, ...], counter: TokenCounter
) -> None:
    ceiling = SMALL.ceiling_tokens
    assert ceiling is not None
    peaks = []
    for script in (s for s in small if not s.planner):
        sizes = [_count(counter, t) for t in script.turns]
        assert all(n + t.reply_tokens <= ceiling for n, t in zip(sizes, script.turns, strict=True))
        first = next((i for i in range(1, len(sizes)) if sizes[i] <= sizes[i - 1]), len(sizes))
        assert first >= 3  # grows until the ceiling first compacts it
        peaks.append(max(n + t.reply_tokens for n, t in zip(sizes, script.turns, strict=True)))
    assert max(peaks) > 0.9 * ceiling  # the ceiling was reached, not just stayed under


def _summaries(scripts: tuple[Any, ...], counter: TokenCounter) -> list[int]:
    """The tokens of every running summary any call sends."""
    return [
        counter.count(str(m["content"]))
        for script in scripts
        for turn in script.turns
        for m in turn.messages
        if str(m["content"]).startswith("[Summary of ")
    ]


def test_the_running_summary_takes_up_to_its_share_of_the_ceiling(
    small: tuple[Any, ...], tokenizer: Tokenizer, counter: TokenCounter
) -> None:
    ceiling = SMALL.ceiling_tokens
    assert ceiling is not None and SMALL.summary_share == 0.25
    half = build(dataclasses.replace(SMALL, summary_share=0.5), counter_for(tokenizer))
    quarter, halves = _summaries(small, counter), _summaries(half, counter)
    assert quarter and halves
    assert max(quarter) <= ceiling // 4 + 16  # the header line beside the summary's body
    assert max(halves) <= ceiling // 2 + 16
    assert max(halves) > ceiling // 4 + 16  # the larger share was used
    assert "a summary of up to 0.5 of it" in describe(dataclasses.replace(SMALL, summary_share=0.5))
    assert "up to" not in describe(SMALL)


def _compacted(scripts: tuple[Any, ...]) -> list[tuple[Any, int]]:
    """Each worker's calls whose history is not the call before's with more appended
    (compacted before it), with their index."""
    return [
        (script, i)
        for script in scripts
        if not script.planner
        for i in range(1, len(script.turns))
        if script.turns[i].messages[: len(script.turns[i - 1].messages)]
        != script.turns[i - 1].messages
    ]


def test_compacting_under_the_ceiling_leaves_the_next_calls_to_append(
    small: tuple[Any, ...], tokenizer: Tokenizer, counter: TokenCounter
) -> None:
    ceiling = SMALL.ceiling_tokens
    assert ceiling is not None and SMALL.compact_to == 1
    under = build(dataclasses.replace(SMALL, compact_to=0.6), counter_for(tokenizer))
    brim, low = _compacted(small), _compacted(under)
    assert 0 < len(low) < len(brim), (len(low), len(brim))
    for script, i in low:  # each compaction went to 0.6 of the room (ceiling less reply)
        turn = script.turns[i]
        assert _count(counter, turn) <= 0.6 * (ceiling - turn.reply_tokens), (script.name, i)
    assert "down to 0.6 of it" in describe(dataclasses.replace(SMALL, compact_to=0.6))
    assert "down to" not in describe(SMALL)


def test_without_a_ceiling_contexts_grow_past_it(
    tokenizer: Tokenizer, counter: TokenCounter
) -> None:
    raw = dataclasses.replace(SMALL, ceiling_tokens=None, duration_s=20.0)
    for script in (s for s in build(raw, counter_for(tokenizer)) if not s.planner):
        sizes = [_count(counter, t) for t in script.turns]
        assert all(b > a for a, b in itertools.pairwise(sizes))
    assert max(sizes) > 2_000


def test_tool_outputs_are_corpus_text_of_the_drawn_size(
    tokenizer: Tokenizer, counter: TokenCounter, small: tuple[Any, ...]
) -> None:
    raw = dataclasses.replace(SMALL, ceiling_tokens=None, tool_output_tokens=None, duration_s=20.0)
    tools = {t.name: t for mix in MIXES.values() for t in mix}
    corpus_lines = {
        (d.category.value, line)
        for d in build_corpus(num_documents=40, seed=raw.seed)
        for line in d.text.split("\n")
    }
    for script in (s for s in build(raw, counter_for(tokenizer)) if not s.planner):
        last = script.turns[-1].messages  # every result, with no ceiling to fold them
        for i, turn in enumerate(script.turns[:-1]):
            result = last[2 + 2 * i + 1]["content"].removeprefix("Tool result:\n")
            tool = tools[turn.tool]
            assert tool.min_tokens - 2 <= counter.count(result) <= tool.max_tokens
            lines = result.split("\n")[:-1]  # the last may be cut mid-line
            assert all((tool.category, line) in corpus_lines for line in lines)
    results = [
        m["content"].removeprefix("Tool result:\n")
        for s in small
        for t in s.turns
        for m in t.messages
        if m["content"].startswith("Tool result:\n")
    ]
    assert len(results) > 20
    assert all(counter.count(r) <= SMALL.tool_output_tokens for r in results)


def test_a_team_s_system_prompt_is_about_system_tokens(
    small: tuple[Any, ...], counter: TokenCounter
) -> None:
    for planner in (s for s in small if s.planner):
        assert (
            0.9 * SMALL.system_tokens
            <= counter.count(planner.system["content"])
            <= SMALL.system_tokens + 5
        )


def test_the_planner_expects_its_fan_out_to_last_as_its_longest_worker(
    small: tuple[Any, ...],
) -> None:
    for planner in (s for s in small if s.planner):
        workers = [s for s in small if s.team == planner.team and not s.planner]
        fanout, merge = planner.turns
        assert fanout.tool == "fanout" and merge.tool is None
        totals = [sum(t.expected_s for t in w.turns) for w in workers]
        assert fanout.expected_s == max(totals) > 0.0


def test_prompts_are_the_chat_template_ids(tokenizer: Tokenizer, small: tuple[Any, ...]) -> None:
    ids = prompts(small, tokenizer)
    assert ids.keys() == {(s.name, i) for s in small for i in range(len(s.turns))}
    for s in small:
        for i, turn in enumerate(s.turns):
            assert ids[(s.name, i)] == tokenizer.encode_chat(list(turn.messages))


def test_a_prompt_s_lines_encoded_apart_are_its_ids(
    tokenizer: Tokenizer, small: tuple[Any, ...]
) -> None:
    """The fast path ``prompts`` and ``counter_for`` take for tiktoken: exact on every
    prompt, not only through their fallback."""
    lines = LineIds(tokenizer)
    tricky = {"role": "user", "content": "a.\n\n  b\t\n\nc:\n- d\n\u00e9t\u00e9 42\n"}
    for s in small:
        for turn in s.turns:
            messages = [*turn.messages, tricky]
            assert lines.encode_chat(messages) == tokenizer.encode_chat(messages)


class _MarkedTokenizer:
    """A tokenizer whose every encode starts with a marker id, as one that adds BOS does:
    a text's ids are not its lines' ids joined."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.inner, self.name = tokenizer, "marked"

    def encode(self, text: str) -> list[int]:
        return [7, *self.inner.encode(text)]

    def apply_chat_template(self, messages: Any, *, add_generation_prompt: bool) -> str:
        return self.inner.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)

    def encode_chat(self, messages: Any) -> list[int]:
        return self.encode(self.apply_chat_template(messages, add_generation_prompt=True))


def test_a_tokenizer_that_does_not_split_at_lines_is_encoded_whole(
    tokenizer: Tokenizer, small: tuple[Any, ...]
) -> None:
    marked: Any = _MarkedTokenizer(tokenizer)
    scripts = small[:3]
    ids = prompts(scripts, marked)
    for s in scripts:
        for i, turn in enumerate(s.turns):
            assert ids[(s.name, i)] == marked.encode_chat(list(turn.messages))
    messages = list(scripts[-1].turns[-1].messages)
    assert counter_for(marked).count_messages(messages) == len(marked.encode_chat(messages))


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"rate_per_min": 0.0}, "rate_per_min"),
        ({"rate_per_min": math.nan}, "rate_per_min"),
        ({"duration_s": -1.0}, "duration_s"),
        ({"tenants": ()}, "tenants"),
        ({"tenants": (TENANTS[0], TENANTS[0])}, "unique"),
        ({"reply_tokens": (0, 5)}, "reply_tokens"),
        ({"reply_tokens": (9, 3)}, "reply_tokens"),
        ({"tool_output_tokens": 0}, "tool_output_tokens"),
        ({"system_tokens": 0}, "system_tokens"),
        ({"ceiling_tokens": 1_000}, "raise it or lower system_tokens"),
        ({"seed": 1.5}, "seed"),
        ({"summary_share": 1.0}, "summary_share"),
        ({"summary_share": 0}, "summary_share"),
        ({"compact_to": 0}, "compact_to"),
        ({"compact_to": 1.2}, "compact_to"),
    ],
)
def test_bad_workload_fields_say_what_to_change(change: dict[str, Any], says: str) -> None:
    with pytest.raises(OpenLoopWorkloadError, match=says):
        dataclasses.replace(TWIN, **change)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"name": "Big-Team"}, "lower-case"),
        ({"weight": 0}, "weight"),
        ({"workers_per_team": 0}, "workers_per_team"),
        ({"turns": (5, 2)}, "turns"),
        ({"turns": (0, 2)}, "turns"),
        ({"mix": "chess"}, "'bfcl', 'research', 'swe'"),
    ],
)
def test_bad_tenant_fields_say_what_to_change(change: dict[str, Any], says: str) -> None:
    with pytest.raises(OpenLoopWorkloadError, match=says):
        dataclasses.replace(TENANTS[0], **change)
    assert issubclass(OpenLoopWorkloadError, ValueError)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"median_s": 0.0}, "median_s"),
        ({"sigma": math.inf}, "sigma"),
        ({"min_tokens": 0}, "min_tokens"),
        ({"max_tokens": 10}, "min_tokens <= max_tokens"),
        ({"category": "source_code"}, "names no corpus category"),
        ({"weight": -1.0}, "weight"),
    ],
)
def test_bad_tool_fields_say_what_to_change(change: dict[str, Any], says: str) -> None:
    with pytest.raises(OpenLoopWorkloadError, match=says):
        dataclasses.replace(MIXES["swe"][0], **change)


def test_describe_says_what_ran() -> None:
    line = describe(CPU)
    assert "\n" not in line
    for part in (
        "2/min (Poisson)",
        "swe 0.5 (planner + 2, 6-10 turns, swe tools)",
        "replies 8-24 tokens",
        "reduced to 512",
        "compacted at 5,000",
    ):
        assert part in line
    raw = describe(dataclasses.replace(CPU, ceiling_tokens=None, tool_output_tokens=None))
    assert "no ceiling" in raw and "raw tool outputs" in raw


def test_histories_read_as_tool_calls_and_written_back_unchanged(small: tuple[Any, ...]) -> None:
    from kvgov.benchmarks.openloop import chat_text

    worker = next(s for s in small if not s.planner)
    history = list(worker.turns[-1].messages)
    assert history[2]["content"].startswith("[Summary of ")  # compacted: a summary, then calls
    calls = chat_text.as_calls(history)
    assert chat_text.as_text(calls) == history
    made = [m for m in calls if m.get("tool_calls")]
    answered = [m for m in calls if m["role"] == "tool"]
    assert made and len(answered) == len(made)
    for call, result in zip(made, answered, strict=True):
        (asked,) = call["tool_calls"]
        assert result["tool_call_id"] == asked["id"]
        assert chat_text.CALLING not in call["content"]
