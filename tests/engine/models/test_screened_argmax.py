"""The screened greedy head gives the float32 argmax, ties and near-ties included, and a
greedy step on the CPU never computes the full logits where the screen applies."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.config import EngineConfig
from engine.engine import Engine
from engine.models.int8_screen import Int8Screen, int8_screen_works
from engine.models.packed_linear import onednn_packing_works
from engine.models.screened_argmax import ScreenedArgmax, fast_bf16_matmul
from engine.sampling import SamplingParams

pytestmark = pytest.mark.skipif(
    not onednn_packing_works(), reason="this torch build has no oneDNN weight packing"
)


def _weight(num_tokens: int, hidden: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(num_tokens, hidden, generator=g) * 0.02


# Both screens run wherever oneDNN packs (without their fast units, slowly), so both are
# held to the float32 argmax here whatever the CPU.
KINDS = pytest.mark.parametrize(
    "kind",
    [
        pytest.param(
            "int8",
            marks=pytest.mark.skipif(
                not int8_screen_works(require_units=False),
                reason="oneDNN's u8 x s8 linear is missing or wrong here",
            ),
        ),
        "bfloat16",
    ],
)


def _hidden(rows: int, hidden: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return F.rms_norm(torch.randn(rows, hidden, generator=g), (hidden,))


@KINDS
def test_equals_the_argmax_of_the_float32_logits(kind: str) -> None:
    weight = _weight(20_000, 64, seed=0)
    head = ScreenedArgmax(kind=kind)
    for seed in range(20):
        hidden = _hidden(8, 64, seed)
        tokens = head(hidden, weight, require_fast_units=False)
        assert tokens is not None
        assert torch.equal(tokens, F.linear(hidden, weight).argmax(dim=-1))


@KINDS
def test_near_ties_below_bfloat16_resolution_go_to_the_larger_float32_logit(kind: str) -> None:
    """Rows equal in bfloat16 but not in float32: only the exact pass can tell them apart."""
    hidden = _hidden(4, 64, seed=1)
    weight = _weight(5_000, 64, seed=2)
    leader = int(F.linear(hidden[:1], weight).argmax())
    near = weight[leader].clone()
    near[0] += 1e-6 * torch.sign(hidden[0, 0])  # well below a bfloat16 step of near[0]
    assert torch.equal(near.bfloat16(), weight[leader].bfloat16())
    weight = torch.cat([weight, near[None]])  # the new last token beats the leader by a hair
    tokens = ScreenedArgmax(kind=kind)(hidden, weight, require_fast_units=False)
    assert tokens is not None
    assert tokens[0] == weight.shape[0] - 1
    assert torch.equal(tokens, F.linear(hidden, weight).argmax(dim=-1))


@KINDS
def test_exact_ties_go_to_the_lowest_token_id(kind: str) -> None:
    hidden = _hidden(3, 32, seed=3)
    weight = _weight(3_000, 32, seed=4)
    leaders = F.linear(hidden, weight).argmax(dim=-1)
    weight = torch.cat([weight, weight[leaders]])  # each leader repeated at a higher id
    tokens = ScreenedArgmax(kind=kind)(hidden, weight, require_fast_units=False)
    assert tokens is not None
    assert torch.equal(tokens, leaders)


@KINDS
def test_follows_a_weight_changed_in_place(kind: str) -> None:
    weight = _weight(4_000, 32, seed=5)
    hidden = _hidden(2, 32, seed=6)
    head = ScreenedArgmax(kind=kind)
    head(hidden, weight, require_fast_units=False)
    with torch.no_grad():
        weight.neg_()  # e.g. weights loaded after the first call
    assert torch.equal(
        head(hidden, weight, require_fast_units=False), F.linear(hidden, weight).argmax(dim=-1)
    )


@KINDS
def test_leaves_what_it_cannot_screen_to_the_full_logits(kind: str) -> None:
    weight = _weight(2_000, 32, seed=7)
    hidden = _hidden(2, 32, seed=8)
    head = ScreenedArgmax(kind=kind)
    nan = hidden.clone()
    nan[0, 0] = float("nan")
    assert head(nan, weight, require_fast_units=False) is None
    assert head(hidden.bfloat16(), weight.bfloat16(), require_fast_units=False) is None


@pytest.mark.skipif(not fast_bf16_matmul(), reason="the CPU has no bfloat16 units")
def test_a_greedy_step_computes_no_full_logits(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 100_000, (20,), generator=g).tolist() for _ in range(3)]
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    full = Engine(EngineConfig(num_blocks=64, seed=0))
    monkeypatch.setattr(full.model, "_screened_argmax", lambda *args, **kwargs: None)
    expected = [c.token_ids for c in full.generate(prompts, greedy)]  # full float32 logits

    engine = Engine(EngineConfig(num_blocks=64, seed=0))

    def refuse(hidden: torch.Tensor) -> torch.Tensor:
        raise AssertionError("a greedy step computed the full logits")

    monkeypatch.setattr(engine.model, "compute_logits", refuse)
    assert [c.token_ids for c in engine.generate(prompts, greedy)] == expected


def test_greedy_and_seeded_rows_in_one_step_each_get_their_own_tokens() -> None:
    """The runner splits a mixed step: greedy rows screened, seeded rows sampled from the
    full logits; each request's tokens are those it gets alone."""
    engine = Engine(EngineConfig(num_blocks=64, seed=0))
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 100_000, (12,), generator=g).tolist() for _ in range(4)]
    params = [
        SamplingParams(max_tokens=5, temperature=0, ignore_eos=True),
        SamplingParams(max_tokens=5, temperature=0.8, seed=7, ignore_eos=True),
        SamplingParams(max_tokens=5, temperature=0, ignore_eos=True),
        SamplingParams(max_tokens=5, temperature=1.2, top_k=50, seed=9, ignore_eos=True),
    ]
    alone = [engine.generate(p, s)[0].token_ids for p, s in zip(prompts, params, strict=True)]
    engine.reset_prefix_cache()
    ids = [engine.add_request(p, s) for p, s in zip(prompts, params, strict=True)]
    while engine.has_unfinished():
        engine.step()
    assert [engine.pop_completion(i).token_ids for i in ids] == alone


@pytest.mark.skipif(not int8_screen_works(), reason="the CPU has no int8 dot-product units")
def test_a_cpu_with_int8_units_screens_with_one_byte_per_weight() -> None:
    """The screen's read of the head is most of a greedy step, and it is bound by memory
    bandwidth: int8 reads half the bytes of bfloat16 (26 MB against 51 MB here)."""
    engine = Engine(EngineConfig(num_blocks=16, seed=0))
    engine.generate([1, 2, 3], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    screen = engine.model._screened_argmax._screen
    assert isinstance(screen, Int8Screen)
    num_tokens = engine.model._output_weight().shape[0]
    assert screen.num_tokens == num_tokens and screen.scales.numel() >= num_tokens


def test_the_exact_pass_reads_whole_rows_where_onednn_packs_the_head() -> None:
    """The exact pass gathers a few hundred rows of the head; stored column-major (kept
    only for a plain GEMM's sake) each row would be 256 strided reads."""
    engine = Engine(EngineConfig(num_blocks=16, seed=0))
    weight = engine.model._output_weight()
    assert weight.is_contiguous()
    assert weight.shape == (engine.model_config.vocab_size, engine.model_config.hidden_size)
