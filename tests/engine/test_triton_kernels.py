"""The Triton paged attention kernels equal ``ReferenceAttention``.

On a GPU they run compiled. On a CPU they run under Triton's interpreter, which must be
chosen before triton is imported: ``test_the_kernels_under_the_interpreter`` runs this
file again in a child process that sets it (``triton_interpreter``), and the cases here
are skipped in favour of that run.

The matrix (head_dim 64/128/256, GQA groups 1/4/8, fp32/fp16/bf16, decode split or not,
prefill after cached tokens or from scratch) is sampled, not crossed: the interpreter
runs each program in numpy, 1-10 s per case here (about a minute for the file, in its
child process), and every value of each axis appears. Block size 16, block tables
shuffled (no run is contiguous), lengths that end mid-block, contexts up to 1,000 tokens.

Tolerances against the float32 reference on the same (rounded) inputs: fp32 2e-5;
fp16 2e-3; bf16 1.6e-2 (one bf16 step at 1.0 is 7.8e-3: the output's own rounding).
Under the interpreter bf16 dot products run in fp32 (``triton_kernels``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

from engine.attention import AttentionMetadata, AttentionShape, ReferenceAttention
from engine.attention.triton_attention import TritonAttention, num_splits
from tests import background
from tests.engine.triton_interpreter import (
    NO_TRITON,
    Where,
    interpreter_child,
    kernel_device,
)

WHERE = kernel_device()
DEVICE = "cuda" if WHERE is Where.GPU else "cpu"
pytestmark = pytest.mark.kernels  # tests/gpu_run.sh selects the matrix with -m "gpu or kernels"
runs_kernels = pytest.mark.skipif(
    WHERE in (Where.CHILD, Where.NOWHERE),
    reason=NO_TRITON
    if WHERE is Where.NOWHERE
    else "run under the interpreter by test_the_kernels_under_the_interpreter",
)

BLOCK = 16
TOL = {
    torch.float32: {"atol": 2e-5, "rtol": 2e-5},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
    torch.bfloat16: {"atol": 1.6e-2, "rtol": 1.6e-2},
}


@dataclass(frozen=True)
class Case:
    head_dim: int
    group: int
    dtype: torch.dtype
    query_lens: tuple[int, ...]
    seq_lens: tuple[int, ...]
    split: bool  # force partitions (flash-decoding) for the decodes
    num_kv_heads: int = 2


DECODES = ((1, 1, 1, 1), (1000, 333, 17, 1))
CASES = {
    "d64-mha-fp32-mixed-split": Case(
        64, 1, torch.float32, (1, 40, 1, 7), (1000, 70, 17, 255), True
    ),
    "d128-gqa4-fp16-decode-split": Case(128, 4, torch.float16, *DECODES, True),
    "d256-gqa8-bf16-decode": Case(256, 8, torch.bfloat16, *DECODES, False),
    "d128-gqa8-fp32-prefill": Case(128, 8, torch.float32, (100, 37, 1), (100, 237, 999), False),
    "d64-gqa4-bf16-chunk-split": Case(64, 4, torch.bfloat16, (1, 33), (777, 530), True),
    "d256-mha-fp16-chunk": Case(256, 1, torch.float16, (48, 1), (561, 90), False),
    "d24-gqa2-fp32-small": Case(24, 2, torch.float32, (5, 1, 1), (5, 3, 49), True),
}


def _batch(case: Case) -> tuple[AttentionMetadata, dict[str, torch.Tensor]]:
    rng = random.Random(0)
    num_blocks = sum(-(-n // BLOCK) for n in case.seq_lens) + 3
    ids = list(range(num_blocks))
    rng.shuffle(ids)
    tables, cursor = [], 0
    for n in case.seq_lens:
        width = -(-n // BLOCK)
        tables.append(ids[cursor : cursor + width])
        cursor += width
    metadata = AttentionMetadata.build(
        block_size=BLOCK,
        query_lens=case.query_lens,
        seq_lens=case.seq_lens,
        block_tables=tables,
        device=torch.device(DEVICE),
    )
    gen = torch.Generator().manual_seed(0)
    tokens, hkv, d = sum(case.query_lens), case.num_kv_heads, case.head_dim
    shapes = {
        "q": (tokens, hkv * case.group, d),
        "k": (tokens, hkv, d),
        "v": (tokens, hkv, d),
        "key_cache": (num_blocks, BLOCK, hkv, d),
        "value_cache": (num_blocks, BLOCK, hkv, d),
    }
    inputs = {
        name: torch.randn(shape, generator=gen).to(DEVICE, case.dtype)
        for name, shape in shapes.items()
    }
    return metadata, inputs


def _attend(backend: object, metadata: AttentionMetadata, inputs: dict[str, torch.Tensor]):
    key_cache, value_cache = inputs["key_cache"].clone(), inputs["value_cache"].clone()
    backend.prepare(metadata)  # type: ignore[attr-defined]
    out = backend.forward(  # type: ignore[attr-defined]
        inputs["q"],
        inputs["k"],
        inputs["v"],
        key_cache,
        value_cache,
        metadata,
        scale=inputs["q"].shape[-1] ** -0.5,
    )
    return out, key_cache, value_cache


@runs_kernels
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_triton_attention_equals_the_reference(case: Case) -> None:
    metadata, inputs = _batch(case)
    # 512 programs wanted: 4 decodes x 2 kv heads split into partitions of >= 64 tokens.
    backend = TritonAttention(target_programs=512 if case.split else 1, min_partition_tokens=64)
    out, key_cache, value_cache = _attend(backend, metadata, inputs)
    want, want_keys, want_values = _attend(ReferenceAttention(), metadata, inputs)
    assert out.dtype == inputs["q"].dtype and out.shape == inputs["q"].shape
    torch.testing.assert_close(out.float(), want.float(), **TOL[case.dtype])
    assert torch.equal(key_cache, want_keys) and torch.equal(value_cache, want_values)


def test_a_forced_split_does_cut_the_decodes() -> None:
    # The split cases above test partitions only if the launch really makes several:
    # 4 decodes x 2 kv heads of up to 1,000 tokens, wanting 512 programs.
    backend = TritonAttention(target_programs=512, min_partition_tokens=64)
    splits, partition = backend.partitions(
        num_programs=8, max_len=1000, device=torch.device(DEVICE)
    )
    # 15 wanted; 1000 / 15 = 67 tokens, rounded up to whole 64-token tiles: 8 of 128.
    assert (splits, partition) == (8, 128)
    assert (splits - 1) * partition < 1000 <= splits * partition  # no empty partition at the end
    unsplit = TritonAttention(target_programs=1).partitions(
        num_programs=8, max_len=1000, device=torch.device(DEVICE)
    )
    assert unsplit == (1, 1024)


def test_splits_fill_the_device_without_tiny_partitions() -> None:
    # 8 sequences x 8 kv heads on 132 multiprocessors (4 programs each): 9 partitions.
    assert (
        num_splits(num_programs=64, max_len=4096, target_programs=528, min_partition_tokens=256)
        == 9
    )
    # Short contexts are not cut below the minimum partition.
    assert (
        num_splits(num_programs=64, max_len=300, target_programs=528, min_partition_tokens=256) == 1
    )
    # A batch that fills the device already is never split.
    assert (
        num_splits(num_programs=600, max_len=9000, target_programs=528, min_partition_tokens=256)
        == 1
    )


def background_child() -> background.Child | None:
    return interpreter_child(__file__, timeout_s=600)


@pytest.mark.background
@pytest.mark.skipif(
    WHERE is not Where.CHILD,
    reason=NO_TRITON if WHERE is Where.NOWHERE else "the kernels run in this process",
)
def test_the_kernels_under_the_interpreter() -> None:
    done, _ = background.finished(__name__, background_child)
    report = done.stdout[-6000:] + done.stderr[-2000:]
    assert done.returncode == 0, report
    # Every CPU case ran there (the gpu ones skip): the interpreter really was in use.
    assert f"{len(CASES) + 5} passed" in done.stdout and "failed" not in done.stdout, report


PROBED = {
    # tiny-random's heads in float32; a 9B model's (GQA 4, d=128) in bfloat16, blocks of 32
    "tiny-random-fp32": AttentionShape(
        num_heads=8, num_kv_heads=2, head_dim=32, block_size=16, dtype=torch.float32
    ),
    "d128-gqa4-bf16-b32": AttentionShape(
        num_heads=8, num_kv_heads=2, head_dim=128, block_size=32, dtype=torch.bfloat16
    ),
}


@runs_kernels
@pytest.mark.parametrize("shape", PROBED.values(), ids=PROBED.keys())
def test_the_startup_probe_finds_the_kernels_run_here(shape: AttentionShape) -> None:
    # The model's own shapes, its decodes split and not (the merge kernel runs too).
    from engine.attention.triton_probe import triton_runs_on

    assert triton_runs_on(torch.device(DEVICE), shape) is True


@runs_kernels
def test_the_engine_on_triton_generates_what_it_does_on_the_reference() -> None:
    # tiny-random (8 query heads, 2 kv heads, head_dim 32), prompts that end mid-block,
    # a prefill then decodes, continuously batched: the kernels wired into a real model.
    from engine import Engine, EngineConfig, SamplingParams

    greedy = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    prompts = [list(range(100, 119)), list(range(7, 60, 2))]
    tokens = {}
    for attention in ("reference", "triton"):
        engine = Engine(EngineConfig(num_blocks=16, attention=attention, device=DEVICE))
        tokens[attention] = [c.token_ids for c in engine.generate(prompts, greedy)]
    assert [len(t) for t in tokens["reference"]] == [5, 5]
    assert tokens["triton"] == tokens["reference"]


# -- on a GPU: realistic shapes ---------------------------------------------------------

GPU_CASES = {
    # 2 x 16k decodes and 6 ragged ones, a 9B model's heads (32/8, d=128).
    "d128-gqa4-bf16-16k-decode": Case(
        128, 4, torch.bfloat16, (1,) * 8, (16_000, 16_383, 1_000, 999, 2_047, 5, 4_097, 3), True, 8
    ),
    # A 2,048-token chunk after 8k cached tokens, beside a 4k decode.
    "d128-gqa4-fp16-chunk-after-8k": Case(
        128, 4, torch.float16, (2_048, 1), (10_240, 4_096), False, 8
    ),
    "d256-gqa8-bf16-4k": Case(256, 8, torch.bfloat16, (1, 1, 300), (4_096, 1_001, 1_300), True, 4),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES.values(), ids=GPU_CASES.keys())
def test_triton_at_realistic_shapes_on_the_gpu(case: Case) -> None:
    metadata, inputs = _batch(case)
    out, _, _ = _attend(TritonAttention(), metadata, inputs)  # split as the device wants
    want, _, _ = _attend(ReferenceAttention(), metadata, inputs)
    torch.testing.assert_close(out.float(), want.float(), **TOL[case.dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES.values(), ids=GPU_CASES.keys())
def test_gather_runs_on_fused_kernels_only(case: Case) -> None:
    # The SDPA path where triton is absent; a silent fallback to math raises here.
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from engine.attention.gather import GatherAttention

    metadata, inputs = _batch(case)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
        out, _, _ = _attend(GatherAttention(), metadata, inputs)
    want, _, _ = _attend(ReferenceAttention(), metadata, inputs)
    torch.testing.assert_close(out.float(), want.float(), **TOL[case.dtype])


@pytest.mark.gpu
def test_the_engine_on_a_gpu_chooses_triton() -> None:
    from engine import Engine, EngineConfig

    engine = Engine(EngineConfig(num_blocks=16, device="cuda"))
    assert isinstance(engine.attention, TritonAttention)
