"""The fast backends equal ``ReferenceAttention`` on random paged batches.

A batch mixes decodes (one new token) and prefill chunks after a cached prefix, over
block tables laid out in contiguous runs, fragmented, or both, where a sequence may
start with full cached blocks of an earlier one (a shared prefix). As in the engine,
this step's tokens are only ever written into blocks their sequence alone holds.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.attention import AttentionMetadata, ReferenceAttention
from engine.attention.backend import AttentionBackend
from engine.attention.gather import GatherAttention
from engine.attention.paged import PagedAttention
from engine.attention.select import get_attention_backend

FP32_TOL = {"atol": 1e-5, "rtol": 1e-5}
LOW_PRECISION_TOL = {
    torch.bfloat16: {"atol": 1.6e-2, "rtol": 1.6e-2},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
}


@dataclass(frozen=True)
class Batch:
    block_size: int
    num_blocks: int
    query_lens: tuple[int, ...]
    seq_lens: tuple[int, ...]
    tables: tuple[tuple[int, ...], ...]

    def metadata(self, device: str | torch.device = "cpu") -> AttentionMetadata:
        return AttentionMetadata.build(
            block_size=self.block_size,
            query_lens=self.query_lens,
            seq_lens=self.seq_lens,
            block_tables=self.tables,
            device=torch.device(device),
        )


@dataclass(frozen=True)
class Heads:
    num_kv_heads: int
    group: int  # query heads per kv head: 1 (MHA), 2, 4; with one kv head, MQA
    head_dim: int


HEADS = st.builds(
    Heads,
    num_kv_heads=st.sampled_from([1, 2, 4]),
    group=st.sampled_from([1, 2, 4]),
    head_dim=st.sampled_from([32, 64]),
)


@st.composite
def batches(draw: st.DrawFn, *, max_seqs: int = 6, max_len: int = 80) -> Batch:
    block_size = draw(st.sampled_from([1, 4, 16]))
    num_seqs = draw(st.integers(1, max_seqs))
    seq_lens = draw(st.lists(st.integers(1, max_len), min_size=num_seqs, max_size=num_seqs))
    query_lens = [draw(st.one_of(st.just(1), st.integers(1, n))) for n in seq_lens]
    layout = draw(st.sampled_from(["runs", "fragmented", "mixed"]))
    rng: random.Random = draw(st.randoms(use_true_random=False))
    # Full blocks before a sequence's new tokens: nobody writes them this step.
    cached = [(n - q) // block_size for n, q in zip(seq_lens, query_lens, strict=True)]
    capacity = 4 * sum(-(-n // block_size) for n in seq_lens) + 8
    tables: list[list[int]] = []
    used: set[int] = set()
    cursor = 0
    for seq, seq_len in enumerate(seq_lens):
        table: list[int] = []
        donors = [d for d in range(seq) if cached[d]]
        if donors and cached[seq] and rng.random() < 0.4:  # a shared prefix
            donor = rng.choice(donors)
            table = tables[donor][: rng.randint(1, min(cached[donor], cached[seq]))]
        fragmented = layout == "fragmented" or (layout == "mixed" and rng.random() < 0.5)
        for _ in range(-(-seq_len // block_size) - len(table)):
            if fragmented:
                block = rng.choice([b for b in range(capacity) if b not in used])
            else:
                if rng.random() < 0.15:  # a gap: another sequence took the next block
                    cursor += rng.randint(1, 3)
                while cursor in used:
                    cursor += 1
                block = cursor
            used.add(block)
            table.append(block)
        tables.append(table)
    return Batch(
        block_size=block_size,
        num_blocks=max(max(t) for t in tables) + 1 + rng.randint(0, 2),
        query_lens=tuple(query_lens),
        seq_lens=tuple(seq_lens),
        tables=tuple(tuple(t) for t in tables),
    )


def make_inputs(
    batch: Batch, heads: Heads, *, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """q, k, v of the step's tokens and random caches."""
    gen = torch.Generator().manual_seed(0)
    num_tokens = sum(batch.query_lens)
    hkv, d = heads.num_kv_heads, heads.head_dim
    cache = (batch.num_blocks, batch.block_size, hkv, d)
    shapes = {
        "q": (num_tokens, hkv * heads.group, d),
        "k": (num_tokens, hkv, d),
        "v": (num_tokens, hkv, d),
        "key_cache": cache,
        "value_cache": cache,
    }
    return {
        name: torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
        for name, shape in shapes.items()
    }


def run(
    backend: AttentionBackend, batch: Batch, inputs: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One prepared step on copies of the caches: (output, key cache, value cache)."""
    metadata = batch.metadata(inputs["q"].device)
    key_cache, value_cache = inputs["key_cache"].clone(), inputs["value_cache"].clone()
    backend.prepare(metadata)
    scale = inputs["q"].shape[-1] ** -0.5
    out = backend.forward(
        inputs["q"], inputs["k"], inputs["v"], key_cache, value_cache, metadata, scale=scale
    )
    return out, key_cache, value_cache


FAST_BACKENDS: dict[str, Callable[[], AttentionBackend]] = {
    "paged": PagedAttention,
    # One row of at most 16 tokens per tile: many partials to merge per token.
    "paged-tiny-tiles": lambda: PagedAttention(stage_bytes=1, chunk_tokens=16),
    "paged-small-tiles": lambda: PagedAttention(stage_bytes=4096, chunk_tokens=8),
    "paged-prefill-all-gathered": lambda: PagedAttention(min_run_tokens=10**9),
    "paged-prefill-all-in-place": lambda: PagedAttention(min_run_tokens=1),
    # Decode runs of a block or more read in place, cut in chunks of at most two blocks.
    "paged-decode-views": lambda: PagedAttention(min_view_tokens=1, view_chunk_tokens=2),
    "paged-decode-all-gathered": lambda: PagedAttention(min_view_tokens=10**9),
    "gather": GatherAttention,
}


def assert_same_cache_writes(
    batch: Batch,
    inputs: dict[str, torch.Tensor],
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
) -> None:
    """Each new token's K/V sits in its slot; every other slot is untouched."""
    slots = batch.metadata().slot_mapping
    for name, new, cache in (("k", "key_cache", key_cache), ("v", "value_cache", value_cache)):
        want = inputs[new].clone()
        want.view(-1, *want.shape[2:])[slots] = inputs[name]
        assert torch.equal(cache, want), f"{new} differs from the expected writes"


@settings(max_examples=120, deadline=None)
@given(batch=batches(), heads=HEADS)
def test_fast_backends_equal_the_reference_in_float32(batch: Batch, heads: Heads) -> None:
    inputs = make_inputs(batch, heads)
    want, ref_keys, ref_values = run(ReferenceAttention(), batch, inputs)
    assert_same_cache_writes(batch, inputs, ref_keys, ref_values)
    for name, make in FAST_BACKENDS.items():
        out, keys, values = run(make(), batch, inputs)
        torch.testing.assert_close(out, want, **FP32_TOL, msg=lambda m, n=name: f"{n}: {m}")
        assert torch.equal(keys, ref_keys) and torch.equal(values, ref_values), name


@settings(max_examples=40, deadline=None)
@given(
    batch=batches(),
    heads=HEADS,
    dtype=st.sampled_from([torch.bfloat16, torch.float16]),
)
def test_fast_backends_equal_the_reference_in_half_precision(
    batch: Batch, heads: Heads, dtype: torch.dtype
) -> None:
    inputs = make_inputs(batch, heads, dtype=dtype)
    want, ref_keys, _ = run(ReferenceAttention(), batch, inputs)
    for name, make in FAST_BACKENDS.items():
        out, keys, _ = run(make(), batch, inputs)
        assert out.dtype == dtype
        torch.testing.assert_close(
            out.float(), want.float(), **LOW_PRECISION_TOL[dtype], msg=lambda m, n=name: f"{n}: {m}"
        )
        assert torch.equal(keys, ref_keys), name


def small_tiles() -> PagedAttention:
    """Every code path in a small batch: in-place runs, gathers, several tiles, merges."""
    return PagedAttention(
        min_run_tokens=4, stage_bytes=4096, chunk_tokens=8, min_view_tokens=8, view_chunk_tokens=8
    )


@settings(max_examples=20, deadline=None)
@given(batch=batches(), heads=HEADS)
def test_float32_activations_over_a_bfloat16_cache(batch: Batch, heads: Heads) -> None:
    inputs = make_inputs(batch, heads)
    for name in ("key_cache", "value_cache"):
        inputs[name] = inputs[name].to(torch.bfloat16)
    want, ref_keys, _ = run(ReferenceAttention(), batch, inputs)
    for name, make in FAST_BACKENDS.items():
        out, keys, _ = run(make(), batch, inputs)
        assert out.dtype == torch.float32, name
        torch.testing.assert_close(out, want, **LOW_PRECISION_TOL[torch.bfloat16])
        assert torch.equal(keys, ref_keys), name


@settings(max_examples=25, deadline=None)
@given(batch=batches(), heads=HEADS)
def test_plain_math_fallback_for_torch_without_the_cpu_flash_kernel(
    batch: Batch, heads: Heads
) -> None:
    inputs = make_inputs(batch, heads)
    want, _, _ = run(ReferenceAttention(), batch, inputs)
    with mock.patch("engine.attention.partial.flash_cpu_op", return_value=None):
        out, _, _ = run(small_tiles(), batch, inputs)
    torch.testing.assert_close(out, want, **FP32_TOL)


@settings(max_examples=25, deadline=None)
@given(batch=batches(), heads=HEADS)
def test_flash_kernel_that_cannot_share_kv_heads_gets_repeated_heads(
    batch: Batch, heads: Heads
) -> None:
    # torch 2.4's kernel takes fewer kv heads than query heads but reads past them.
    inputs = make_inputs(batch, heads)
    want, _, _ = run(ReferenceAttention(), batch, inputs)
    with mock.patch("engine.attention.partial.flash_cpu_shares_kv_heads", return_value=False):
        out, _, _ = run(small_tiles(), batch, inputs)
    torch.testing.assert_close(out, want, **FP32_TOL)


@pytest.mark.parametrize("name", sorted(FAST_BACKENDS))
def test_one_plan_serves_every_layer(name: str) -> None:
    batch = Batch(
        block_size=4,
        num_blocks=40,
        query_lens=(1, 7, 1),
        seq_lens=(30, 19, 3),
        tables=((0, 1, 2, 3, 4, 5, 20, 21), (8, 9, 10, 31, 32), (39,)),
    )
    backend = FAST_BACKENDS[name]()
    metadata = batch.metadata()
    backend.prepare(metadata)
    for layer in range(3):  # each layer: its own caches and activations, the same plan
        inputs = make_inputs(batch, Heads(num_kv_heads=2, group=2, head_dim=32))
        inputs = {key: value * (1 + layer) for key, value in inputs.items()}
        want, _, _ = run(ReferenceAttention(), batch, inputs)
        keys, values = inputs["key_cache"].clone(), inputs["value_cache"].clone()
        scale = 32**-0.5
        out = backend.forward(
            inputs["q"], inputs["k"], inputs["v"], keys, values, metadata, scale=scale
        )
        torch.testing.assert_close(out, want, **FP32_TOL)


@pytest.mark.parametrize("name", sorted(FAST_BACKENDS))
def test_chunked_prefill_after_a_cached_prefix_equals_one_whole_prefill(name: str) -> None:
    seq_len, block_size, chunk = 45, 4, 8
    table = (3, 4, 5, 6, 7, 8, 30, 31, 12, 13, 14, 15)  # three runs
    heads = Heads(num_kv_heads=1, group=4, head_dim=32)
    whole = Batch(block_size, 32, (seq_len,), (seq_len,), (table,))
    inputs = make_inputs(whole, heads)
    want, _, _ = run(ReferenceAttention(), whole, inputs)

    backend = FAST_BACKENDS[name]()
    keys, values = inputs["key_cache"].clone(), inputs["value_cache"].clone()
    outs = []
    for start in range(0, seq_len, chunk):
        stop = min(start + chunk, seq_len)
        metadata = AttentionMetadata.build(
            block_size=block_size,
            query_lens=[stop - start],
            seq_lens=[stop],
            block_tables=[table],
            device=torch.device("cpu"),
        )
        backend.prepare(metadata)
        rows = slice(start, stop)
        outs.append(
            backend.forward(
                inputs["q"][rows],
                inputs["k"][rows],
                inputs["v"][rows],
                keys,
                values,
                metadata,
                scale=32**-0.5,
            )
        )
    torch.testing.assert_close(torch.cat(outs), want, **FP32_TOL)


def test_long_decodes_and_a_prefill_with_the_default_tiles() -> None:
    """Sequences of thousands of tokens: several rows and tiles per sequence, merged."""
    block_size, lens = 16, (5000, 2100, 3333, 700)
    tables, cursor = [], 0
    for n in lens:  # a prompt run, then blocks interleaved with the other sequences
        run_blocks = (n - 300) // block_size
        tables.append(list(range(cursor, cursor + run_blocks)))
        cursor += run_blocks
    for i in range(-(-300 // block_size) + 1):
        for seq, n in enumerate(lens):
            if len(tables[seq]) * block_size < n:
                tables[seq].append(cursor + i * len(lens) + seq)
    batch = Batch(
        block_size=block_size,
        num_blocks=cursor + 40 * len(lens),
        query_lens=(1, 1, 1, 200),
        seq_lens=lens,
        tables=tuple(tuple(t) for t in tables),
    )
    inputs = make_inputs(batch, Heads(num_kv_heads=2, group=4, head_dim=32))
    want, ref_keys, _ = run(ReferenceAttention(), batch, inputs)
    out, keys, _ = run(PagedAttention(), batch, inputs)
    torch.testing.assert_close(out, want, **FP32_TOL)
    assert torch.equal(keys, ref_keys)


def test_prepare_is_optional_but_plans_the_step_it_is_given() -> None:
    batch = Batch(4, 8, (1, 1), (9, 5), ((0, 1, 2), (5, 6)))
    inputs = make_inputs(batch, Heads(num_kv_heads=2, group=2, head_dim=32))
    want, _, _ = run(ReferenceAttention(), batch, inputs)
    backend = PagedAttention()
    backend.prepare(Batch(4, 8, (1,), (3,), ((7,),)).metadata())  # a stale plan
    keys, values = inputs["key_cache"].clone(), inputs["value_cache"].clone()
    out = backend.forward(
        inputs["q"], inputs["k"], inputs["v"], keys, values, batch.metadata(), scale=32**-0.5
    )
    torch.testing.assert_close(out, want, **FP32_TOL)


def test_inference_mode_workspace_is_not_reused_outside_inference_mode() -> None:
    batch = Batch(4, 16, (1, 1), (9, 13), ((0, 9, 4), (1, 7, 12, 3)))  # all fragments
    inputs = make_inputs(batch, Heads(num_kv_heads=2, group=2, head_dim=32))
    want, _, _ = run(ReferenceAttention(), batch, inputs)
    backend = PagedAttention()
    with torch.inference_mode():
        run(backend, batch, inputs)
    out, _, _ = run(backend, batch, inputs)
    torch.testing.assert_close(out, want, **FP32_TOL)


@pytest.mark.gpu
@settings(max_examples=30, deadline=None)
@given(
    batch=batches(),
    heads=HEADS,
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_auto_backend_on_the_gpu_equals_the_reference(
    batch: Batch, heads: Heads, dtype: torch.dtype
) -> None:
    inputs = make_inputs(batch, heads, dtype=dtype, device="cuda")
    want, ref_keys, _ = run(ReferenceAttention(), batch, inputs)
    for backend in (get_attention_backend("auto", device="cuda"), PagedAttention()):
        out, keys, _ = run(backend, batch, inputs)
        # GPU kernels may use TF32 or reduced-precision accumulation: a looser float32 bound.
        tol = {"atol": 2e-3, "rtol": 2e-3} if dtype == torch.float32 else LOW_PRECISION_TOL[dtype]
        torch.testing.assert_close(out.float(), want.float(), **tol)
        assert torch.equal(keys, ref_keys)


def test_decoded_runs_read_through_one_strided_view_equal_the_reference() -> None:
    """Evenly spaced decoded runs share one view whose chunks are not back to back: the
    stride between them must be the runs' spacing, not the chunk size."""
    # Prompts of 6 blocks back to back (blocks 0-23), then each one's 4 decoded blocks
    # in a run of its own, 7 blocks apart (as BlockPool.run_start lays them out).
    tables = [[*range(6 * s, 6 * s + 6), *range(25 + 7 * s, 29 + 7 * s)] for s in range(4)]
    batch = Batch(
        block_size=4,
        num_blocks=1 + max(max(t) for t in tables),
        query_lens=(1,) * 4,
        seq_lens=(10 * 4,) * 4,
        tables=tuple(tuple(t) for t in tables),
    )
    inputs = make_inputs(batch, Heads(num_kv_heads=2, group=2, head_dim=16))
    want, _, _ = run(ReferenceAttention(), batch, inputs)
    backend = PagedAttention(min_view_tokens=16, view_chunk_tokens=16)
    out, _, _ = run(backend, batch, inputs)
    torch.testing.assert_close(out, want, **FP32_TOL)


def test_decodes_sharing_a_prefix_read_it_through_one_view_with_stride_zero() -> None:
    """Two decodes whose tables start with the same 4-block run: both chunks start at the
    same slot, so the view's chunk axis has stride 0 (read twice, never written)."""
    tables = ((0, 1, 2, 3, 4), (0, 1, 2, 3, 5))
    batch = Batch(block_size=4, num_blocks=6, query_lens=(1, 1), seq_lens=(18, 19), tables=tables)
    backend = PagedAttention(min_view_tokens=16, view_chunk_tokens=16)
    inputs = make_inputs(batch, Heads(num_kv_heads=2, group=2, head_dim=16))
    out, _, _ = run(backend, batch, inputs)
    (view,) = backend._plan.decode_views if backend._plan is not None else ()
    assert (view.start_slot, view.chunk_stride, view.rows.tolist()) == (0, 0, [0, 1])
    want, _, _ = run(ReferenceAttention(), batch, inputs)
    torch.testing.assert_close(out, want, **FP32_TOL)
