"""SamplingParams validation and the batched Sampler: greedy, top-k, top-p, temperature
and per-request seeds."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from engine.errors import InvalidRequestError, SamplingParamsError
from engine.sampling import Sampler, SamplingParams, request_generator

GREEDY = SamplingParams(temperature=0)


def frequencies(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    return torch.bincount(tokens, minlength=vocab_size).float() / tokens.numel()


def test_defaults() -> None:
    params = SamplingParams()
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k) == (16, 1.0, 1.0, 0)
    assert params.seed is None and params.stop == () and params.stop_token_ids == ()
    assert not params.ignore_eos and not params.include_stop_str_in_output
    assert not params.is_greedy and GREEDY.is_greedy


def test_params_are_frozen_and_keyword_only() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        GREEDY.temperature = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        SamplingParams(16)  # type: ignore[misc]


def test_lists_are_frozen_into_tuples_and_a_lone_stop_string_is_one_string() -> None:
    params = SamplingParams(stop="###", stop_token_ids=[5, 7])  # type: ignore[arg-type]
    assert params.stop == ("###",)
    assert params.stop_token_ids == (5, 7)
    assert hash(params) == hash(SamplingParams(stop=("###",), stop_token_ids=(5, 7)))


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("max_tokens", 0, ">= 1"),
        ("max_tokens", 2.0, ">= 1"),
        ("max_tokens", True, ">= 1"),
        ("temperature", -0.1, ">= 0"),
        ("temperature", math.nan, ">= 0"),
        ("temperature", math.inf, ">= 0"),
        ("top_p", 0.0, "(0, 1]"),
        ("top_p", 1.5, "(0, 1]"),
        ("top_k", -1, "0 turns top-k off"),
        ("top_k", 2.5, ">= 0"),
        ("seed", -1, "[0, "),
        ("seed", 2**64, "[0, "),
        ("seed", "7", "[0, "),
        ("stop", ("",), "non-empty strings"),
        ("stop", (1,), "non-empty strings"),
        ("stop_token_ids", (-1,), "ints >= 0"),
        ("stop_token_ids", (True,), "ints >= 0"),
        ("ignore_eos", 1, "a bool"),
        ("include_stop_str_in_output", None, "a bool"),
    ],
)
def test_invalid_values_name_the_field_and_the_allowed_range(
    field: str, value: object, allowed: str
) -> None:
    with pytest.raises(SamplingParamsError) as caught:
        SamplingParams(**{field: value})  # type: ignore[arg-type]
    error = caught.value
    assert isinstance(error, InvalidRequestError)
    assert error.field == field
    assert f"SamplingParams.{field}" in str(error) and allowed in str(error)


def test_stop_token_set_adds_eos_unless_ignored() -> None:
    eos = frozenset({2, 3})
    assert SamplingParams(stop_token_ids=(9,)).stop_token_set(eos) == {2, 3, 9}
    assert SamplingParams(stop_token_ids=(9,), ignore_eos=True).stop_token_set(eos) == {9}


def test_request_generator_only_for_seeded_random_requests() -> None:
    assert request_generator(SamplingParams(), device="cpu") is None
    assert request_generator(SamplingParams(temperature=0, seed=1), device="cpu") is None
    first = request_generator(SamplingParams(seed=1), device="cpu")
    second = request_generator(SamplingParams(seed=1), device="cpu")
    assert first is not None and second is not None
    assert torch.equal(torch.rand(4, generator=first), torch.rand(4, generator=second))


def test_greedy_is_argmax_and_ties_go_to_the_lowest_id() -> None:
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    logits[0, [7, 3, 30]] = 100.0
    tokens = Sampler().sample(logits, [GREEDY] * 6)
    assert tokens.dtype == torch.long and tokens.shape == (6,)
    assert torch.equal(tokens, logits.argmax(dim=-1))
    assert tokens[0].item() == 3


def test_tiny_temperatures_count_as_greedy() -> None:
    logits = torch.randn(3, 20, generator=torch.Generator().manual_seed(1))
    params = [SamplingParams(temperature=1e-7)] * 3
    assert torch.equal(Sampler(seed=0).sample(logits, params), logits.argmax(dim=-1))


def test_top_k_1_equals_greedy_and_mixed_batches_keep_greedy_rows_exact() -> None:
    logits = torch.randn(8, 100, generator=torch.Generator().manual_seed(2))
    params = [SamplingParams(top_k=1, temperature=1.5), GREEDY] * 4
    assert torch.equal(Sampler(seed=0).sample(logits, params), logits.argmax(dim=-1))


def test_top_k_keeps_only_the_k_most_likely_tokens() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.5, 2.5]]).repeat(4000, 1)
    tokens = Sampler(seed=0).sample(logits, [SamplingParams(top_k=2)] * 4000)
    assert set(tokens.tolist()) == {1, 4}


@pytest.mark.parametrize(
    ("top_p", "kept"),
    # Clear of the exact partial sums (0.5, 0.8, 0.95), where float rounding decides.
    [(0.49, {0}), (0.51, {0, 1}), (0.79, {0, 1}), (0.81, {0, 1, 2}), (0.96, {0, 1, 2, 3})],
)
def test_top_p_keeps_the_smallest_set_whose_mass_reaches_p(top_p: float, kept: set[int]) -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().repeat(4000, 1)
    tokens = Sampler(seed=0).sample(logits, [SamplingParams(top_p=top_p)] * 4000)
    assert set(tokens.tolist()) == kept
    # The kept tokens are renormalized, not reweighted.
    expected = torch.zeros(4)
    expected[list(kept)] = probs[list(kept)] / probs[list(kept)].sum()
    assert torch.allclose(frequencies(tokens, 4), expected, atol=0.03)


def test_top_p_beyond_the_candidate_tokens_sorts_the_whole_vocabulary() -> None:
    # A flat distribution: reaching p = 0.5 takes far more than the 1024 candidates.
    vocab_size = 6000
    logits = -torch.arange(vocab_size, dtype=torch.float32) * 2e-4
    probs = logits.double().softmax(dim=-1)
    expected = int((probs.cumsum(dim=-1) < 0.5).sum()) + 1
    tokens = Sampler(seed=0).sample(logits.repeat(3000, 1), [SamplingParams(top_p=0.5)] * 3000)
    assert 1024 < int(tokens.max()) < expected + 2


def test_ties_at_the_top_k_boundary_are_all_kept() -> None:
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0]]).repeat(2000, 1)
    tokens = Sampler(seed=0).sample(logits, [SamplingParams(top_k=1)] * 2000)
    assert set(tokens.tolist()) == {1, 2}


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_reshapes_the_distribution_as_softmax_of_logits_over_t(
    temperature: float,
) -> None:
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    rows = 8000
    tokens = Sampler(seed=1234).sample(
        logits.repeat(rows, 1), [SamplingParams(temperature=temperature)] * rows
    )
    expected = (logits / temperature).softmax(dim=-1)
    assert torch.allclose(frequencies(tokens, 4), expected, atol=0.02)


def test_lower_temperature_concentrates_on_the_top_token() -> None:
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0]).repeat(4000, 1)
    top_share = {
        t: frequencies(Sampler(seed=5).sample(logits, [SamplingParams(temperature=t)] * 4000), 4)[0]
        for t in (0.25, 1.0, 4.0)
    }
    assert top_share[0.25] > top_share[1.0] > top_share[4.0]


def test_a_seeded_request_gets_the_same_tokens_whatever_shares_its_batch() -> None:
    vocab_size = 300
    seeded = SamplingParams(seed=42, temperature=0.9, top_p=0.95)
    steps = [torch.randn(vocab_size, generator=torch.Generator().manual_seed(i)) for i in range(12)]

    def run(batch_with: list[SamplingParams], row: int) -> list[int]:
        sampler = Sampler()
        params = [*batch_with[:row], seeded, *batch_with[row:]]
        generators = [request_generator(p, device="cpu") for p in params]
        noise = torch.Generator().manual_seed(row)
        tokens = []
        for logits in steps:
            batch = torch.randn(len(params), vocab_size, generator=noise)
            batch[row] = logits
            tokens.append(sampler.sample(batch, params, generators)[row].item())
        return tokens

    alone = run([], 0)
    others = [GREEDY, SamplingParams(), SamplingParams(seed=7, top_k=5), SamplingParams(top_p=0.3)]
    assert run(others, 0) == alone
    assert run(others, 2) == alone
    assert run([SamplingParams(top_k=3)] * 3, 3) == alone
    assert len(set(alone)) > 1  # it really sampled


def test_a_seeded_top_p_row_does_not_depend_on_rows_that_need_a_full_sort() -> None:
    peaked = torch.randn(1, 5000, generator=torch.Generator().manual_seed(0)) * 8
    flat = torch.randn(1, 5000, generator=torch.Generator().manual_seed(1)) * 0.01
    params = SamplingParams(top_p=0.9, seed=3)

    def draw(batch: torch.Tensor, batch_params: list[SamplingParams]) -> list[int]:
        generator = request_generator(params, device="cpu")
        generators = [generator] + [None] * (len(batch_params) - 1)
        return [Sampler(seed=0).sample(batch, batch_params, generators)[0].item() for _ in "abcd"]

    with_flat = draw(torch.cat([peaked, flat]), [params, SamplingParams(top_p=0.9)])
    assert draw(peaked, [params]) == with_flat


def test_the_sampler_seed_makes_unseeded_rows_reproducible() -> None:
    logits = torch.randn(16, 100, generator=torch.Generator().manual_seed(3))
    params = [SamplingParams()] * 16
    assert torch.equal(
        Sampler(seed=9).sample(logits, params), Sampler(seed=9).sample(logits, params)
    )


def test_half_precision_logits_are_sampled_in_float32() -> None:
    logits = torch.randn(4, 64, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    tokens = Sampler(seed=0).sample(logits, [GREEDY, SamplingParams()] * 2)
    assert tokens.dtype == torch.long
    assert tokens[0].item() == logits[0].float().argmax().item()


def test_shape_and_length_mismatches_are_refused() -> None:
    sampler = Sampler()
    with pytest.raises(InvalidRequestError, match=r"\[S, V\]"):
        sampler.sample(torch.zeros(3, 10), [GREEDY] * 2)
    with pytest.raises(InvalidRequestError, match=r"\[S, V\]"):
        sampler.sample(torch.zeros(10), [GREEDY])
    with pytest.raises(InvalidRequestError, match="one per row"):
        sampler.sample(torch.zeros(2, 10), [GREEDY] * 2, [None])
