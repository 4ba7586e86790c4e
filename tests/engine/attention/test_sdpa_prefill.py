"""The SDPA path's prefill: cached and new keys apart, merged by LSE; the startup probe.

The fused GPU kernels cannot run here; the split and merge around them, the tiled math
fallback and the probe's decisions can, and are checked on the CPU (the probe's GPU
side through ``decide_support`` with a fake ``runs``: no GPU here).
"""

from __future__ import annotations

import logging
import math
from unittest import mock

import pytest
import torch

from engine.attention import AttentionMetadata, ReferenceAttention
from engine.attention.gather import GatherAttention
from engine.attention.sdpa_lse import SdpaKernel, attend_lse, math_tile_rows
from engine.attention.sdpa_prefill import attend_chunk
from engine.attention.sdpa_probe import (
    EXPERIMENTAL_ENV,
    SdpaSupport,
    aotriton_experimental,
    decide_support,
    probe_sdpa,
)

TOL = {"atol": 1e-5, "rtol": 1e-5}


def _support(kernels: tuple[SdpaKernel, ...], *, gqa: bool = True, budget: int = 1 << 28):
    return SdpaSupport("cpu", "cpu", kernels, gqa, set_experimental=False, math_budget_bytes=budget)


def _reference_chunk(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float):
    """Row i of a chunk after C cached tokens sees keys 0..C + i: plain float64 math."""
    num_queries, group = query.shape[0], query.shape[1] // keys.shape[1]
    k = keys.double().repeat_interleave(group, dim=1)
    v = values.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", query.double(), k) * scale
    cached = keys.shape[0] - num_queries
    hidden = torch.arange(keys.shape[0])[None, :] > torch.arange(cached, keys.shape[0])[:, None]
    probs = scores.masked_fill(hidden, -math.inf).softmax(-1)
    return torch.einsum("hqk,khd->qhd", probs, v).float()


@pytest.mark.parametrize("kernels", [(SdpaKernel.CPU,), ()], ids=["cpu-flash", "math"])
@pytest.mark.parametrize("gqa", [True, False], ids=["enable_gqa", "repeat"])
@pytest.mark.parametrize(("group", "cached"), [(1, 0), (4, 0), (1, 37), (4, 37), (8, 300)])
def test_a_chunk_split_at_the_cache_equals_one_causal_attention(
    kernels: tuple[SdpaKernel, ...], gqa: bool, group: int, cached: int
) -> None:
    gen = torch.Generator().manual_seed(group + cached)
    num_queries, kv_heads, head_dim = 21, 2, 32
    query = torch.randn(num_queries, kv_heads * group, head_dim, generator=gen)
    keys = torch.randn(cached + num_queries, kv_heads, head_dim, generator=gen)
    values = torch.randn(cached + num_queries, kv_heads, head_dim, generator=gen)
    out = attend_chunk(query, keys, values, scale=0.2, support=_support(kernels, gqa=gqa))
    torch.testing.assert_close(out, _reference_chunk(query, keys, values, 0.2), **TOL)


def test_math_tiles_keep_the_scores_within_the_budget() -> None:
    # 32 heads, a 2,048-token chunk after 8k cached tokens: 2.7 GB of scores untiled.
    shape = {"batch": 1, "heads": 32, "num_queries": 2048, "num_keys": 10_240}
    budget = 256 << 20
    rows = math_tile_rows(**shape, budget_bytes=budget)
    assert 1 <= rows < 2048
    assert 3 * 4 * 32 * 10_240 * rows <= budget < 3 * 4 * 32 * 10_240 * (rows + 1)
    # However large the keys, a tile is at least one row (then it can only be done so).
    assert math_tile_rows(**{**shape, "num_keys": 10**9}, budget_bytes=budget) == 1


def test_tiled_math_equals_untiled_math() -> None:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, n, 16, generator=gen) for n in (50, 50, 50))
    untiled = attend_lse(q, k, v, scale=0.3, causal=True, kernel=SdpaKernel.MATH)
    # A budget of one row's scores: 50 tiles of one row each.
    one_row = 3 * 4 * 4 * 50
    assert math_tile_rows(batch=1, heads=4, num_queries=50, num_keys=50, budget_bytes=one_row) == 1
    tiled = attend_lse(
        q, k, v, scale=0.3, causal=True, kernel=SdpaKernel.MATH, math_budget_bytes=one_row
    )
    torch.testing.assert_close(tiled, untiled, **TOL)
    assert torch.isfinite(untiled[1]).all()


def _batch(tables: list[list[int]]) -> tuple[AttentionMetadata, dict[str, torch.Tensor]]:
    # A chunk after 9 cached tokens, a decode, a whole prefill; 4-token blocks.
    metadata = AttentionMetadata.build(
        block_size=4,
        query_lens=[5, 1, 6],
        seq_lens=[14, 10, 6],
        block_tables=tables,
        device=torch.device("cpu"),
    )
    gen = torch.Generator().manual_seed(0)
    shapes = {"q": (12, 8, 16), "k": (12, 2, 16), "v": (12, 2, 16)}
    inputs = {name: torch.randn(shape, generator=gen) for name, shape in shapes.items()}
    inputs["key_cache"] = torch.randn(12, 4, 2, 16, generator=gen)
    inputs["value_cache"] = torch.randn(12, 4, 2, 16, generator=gen)
    return metadata, inputs


def _run(backend: object, metadata: AttentionMetadata, inputs: dict[str, torch.Tensor]):
    keys, values = inputs["key_cache"].clone(), inputs["value_cache"].clone()
    backend.prepare(metadata)  # type: ignore[attr-defined]
    return backend.forward(  # type: ignore[attr-defined]
        inputs["q"], inputs["k"], inputs["v"], keys, values, metadata, scale=0.25
    )


RUNS = [[3, 4, 5, 6], [0, 1, 2], [8, 9]]  # every sequence one run of consecutive blocks
FRAGMENTED = [[3, 0, 7, 1], [2, 5, 9], [4, 6]]


@pytest.mark.parametrize("tables", [RUNS, FRAGMENTED], ids=["runs", "fragmented"])
def test_gather_prefill_equals_the_reference(tables: list[list[int]]) -> None:
    metadata, inputs = _batch(tables)
    want = _run(ReferenceAttention(), metadata, inputs)
    torch.testing.assert_close(_run(GatherAttention(), metadata, inputs), want, **TOL)


def test_a_prefill_whose_blocks_form_one_run_is_read_in_place() -> None:
    prefill_only = AttentionMetadata.build(
        block_size=4,
        query_lens=[5, 6],
        seq_lens=[14, 6],
        block_tables=RUNS[:1] + RUNS[2:],
        device=torch.device("cpu"),
    )
    _, inputs = _batch(RUNS)
    inputs = {**inputs, "q": inputs["q"][:11], "k": inputs["k"][:11], "v": inputs["v"][:11]}
    want = _run(ReferenceAttention(), prefill_only, inputs)
    copy = mock.patch.object(torch.Tensor, "index_select", side_effect=AssertionError("copied"))
    with copy:
        out = _run(GatherAttention(), prefill_only, inputs)
    torch.testing.assert_close(out, want, **TOL)


# -- the startup probe ----------------------------------------------------------------


def _all_run(kernel: SdpaKernel) -> bool:
    return True


def _none_run(kernel: SdpaKernel) -> bool:
    return False


@pytest.mark.parametrize(
    ("arch", "experimental"),
    [
        ("gfx1201", True),  # RDNA4, RX 9070 XT
        ("gfx1200", True),
        ("gfx1100", True),  # RDNA3
        ("gfx1151", True),
        ("gfx942:sramecc+:xnack-", False),  # CDNA3, MI300
        ("gfx90a", False),
        ("gfx908", False),
    ],
)
def test_aotriton_experimental_archs(arch: str, experimental: bool) -> None:
    assert aotriton_experimental(arch) is experimental


def test_the_probe_enables_aotriton_on_rdna4_before_trying_a_kernel() -> None:
    environ: dict[str, str] = {}
    seen: list[str | None] = []

    def runs(kernel: SdpaKernel) -> bool:
        seen.append(environ.get(EXPERIMENTAL_ENV))
        return True

    support = decide_support(
        device="cuda:0", arch="gfx1201", hip=True, environ=environ, runs=runs, gqa=True
    )
    assert environ == {EXPERIMENTAL_ENV: "1"} and seen == ["1", "1"]
    assert support.set_experimental and EXPERIMENTAL_ENV in support.describe()
    assert support.kernels == (SdpaKernel.FLASH, SdpaKernel.EFFICIENT)


@pytest.mark.parametrize(
    ("arch", "hip", "environ"),
    [
        ("gfx1201", True, {EXPERIMENTAL_ENV: "0"}),  # the user's choice stands
        ("gfx942", True, {}),  # not experimental there
        ("sm90", False, {}),  # CUDA
    ],
)
def test_the_probe_leaves_the_variable_alone_otherwise(
    arch: str, hip: bool, environ: dict[str, str]
) -> None:
    before = dict(environ)
    support = decide_support(
        device="cuda:0", arch=arch, hip=hip, environ=environ, runs=_all_run, gqa=True
    )
    assert environ == before and not support.set_experimental


def test_with_no_fused_kernel_the_probe_warns_and_math_is_tiled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="engine.attention.sdpa_probe"):
        support = decide_support(
            device="cuda:0", arch="gfx1201", hip=True, environ={}, runs=_none_run, gqa=True
        )
    assert support.kernels == () and support.kernel_for(torch.bfloat16, 128) is SdpaKernel.MATH
    assert "tiled math" in caplog.text and EXPERIMENTAL_ENV in caplog.text


@pytest.mark.parametrize(
    ("dtype", "head_dim", "want"),
    [
        (torch.bfloat16, 128, SdpaKernel.FLASH),
        (torch.float16, 256, SdpaKernel.FLASH),
        (torch.float32, 128, SdpaKernel.EFFICIENT),  # flash takes half precision only
        (torch.float16, 24 + 4, SdpaKernel.MATH),  # 28: not a multiple of 8
        (torch.float32, 28, SdpaKernel.EFFICIENT),  # a multiple of 4 is enough in fp32
        (torch.bfloat16, 512, SdpaKernel.EFFICIENT),
    ],
)
def test_the_kernel_for_the_inputs(dtype: torch.dtype, head_dim: int, want: SdpaKernel) -> None:
    support = decide_support(
        device="cuda:0", arch="sm90", hip=False, environ={}, runs=_all_run, gqa=True
    )
    assert support.kernel_for(dtype, head_dim) is want


def test_the_probe_logs_what_it_found(caplog: pytest.LogCaptureFixture) -> None:
    probe_sdpa.cache_clear()
    with caplog.at_level(logging.INFO, logger="engine.attention.sdpa_probe"):
        support = probe_sdpa(torch.device("cpu"))
    assert support.describe() in caplog.text
    assert support.kernel_for(torch.float32, 16) in (SdpaKernel.CPU, SdpaKernel.MATH)


@pytest.mark.parametrize(
    ("op", "positional"),
    [
        # sdpa_lse passes these positionally, then scale= by name: the schema must agree.
        ("_scaled_dot_product_flash_attention", ["dropout_p", "is_causal", "return_debug_mask"]),
        (
            "_scaled_dot_product_efficient_attention",
            ["attn_bias", "compute_log_sumexp", "dropout_p", "is_causal"],
        ),
    ],
)
def test_the_fused_ops_take_the_arguments_sdpa_lse_passes(op: str, positional: list[str]) -> None:
    # The ops run only on a GPU; their schemas can be read anywhere.
    arguments = getattr(torch.ops.aten, op).default._schema.arguments
    names = [a.name for a in arguments]
    assert names[:3] == ["query", "key", "value"] and names[3 : 3 + len(positional)] == positional
    assert "scale" in names and next(a for a in arguments if a.name == "scale").kwarg_only
