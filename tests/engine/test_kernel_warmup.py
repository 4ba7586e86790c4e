"""The engine compiles every Triton attention kernel a step can launch before it serves.

What a step passes is kept to one specialization (checked here on Triton's own
specialization function: the block table's width and the merge's split count are not
specialized, every staged view starts 16-byte aligned), so the variants are the decode's
``NUM_SPLITS``: ``decode_variants`` must name each one any batch can reach. Under
Triton's interpreter (a child process, as in ``test_triton_kernels``) the warm-up runs
each variant through tiny-random; on a GPU (``gpu``) serving after it compiles nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.attention.triton_attention import TritonAttention, padded_splits
from engine.kernel_warmup import warm_up_attention
from tests import background
from tests.engine.triton_interpreter import (
    NO_TRITON,
    Where,
    interpreter_child,
    kernel_device,
)

WHERE = kernel_device()
CPU = torch.device("cpu")
interpreted = pytest.mark.skipif(
    WHERE is not Where.HERE,
    reason=NO_TRITON if WHERE is Where.NOWHERE else "run by test_the_warmup_under_the_interpreter",
)


def test_an_h200s_variants_are_one_per_power_of_two_of_splits() -> None:
    # 132 multiprocessors x 4 programs; 8 kv heads: a lone decode splits up to 66 ways.
    attention = TritonAttention(target_programs=528)
    variants = attention.decode_variants(kv_heads=8, max_len=32_768, device=CPU)
    assert variants == {
        1: 1,
        2: 512,
        4: 1024,
        8: 2048,
        16: 4096,
        32: 8192,
        64: 16_384,
        128: 16_896,  # 66 partitions of 256
    }
    # Short contexts never split far: at most 4,096 // 256 = 16 partitions.
    assert list(attention.decode_variants(kv_heads=8, max_len=4096, device=CPU)) == [
        1,
        2,
        4,
        8,
        16,
    ]


@pytest.mark.parametrize(
    ("targets", "kv_heads", "min_partition", "max_len"),
    [(528, 8, 256, 32_768), (1024, 2, 256, 9000), (120, 4, 100, 5000), (64, 1, 64, 3000)],
)
def test_every_batch_launches_a_variant_the_warmup_compiled(
    targets: int, kv_heads: int, min_partition: int, max_len: int
) -> None:
    attention = TritonAttention(target_programs=targets, min_partition_tokens=min_partition)
    variants = attention.decode_variants(kv_heads=kv_heads, max_len=max_len, device=CPU)
    for padded, length in variants.items():  # each variant's row launches that variant
        got, _ = attention.partitions(num_programs=kv_heads, max_len=length, device=CPU)
        assert padded_splits(got) == padded
    lengths = sorted({*range(1, 600), *range(600, max_len + 1, 37), max_len})
    for num_decodes in range(1, 40):
        for length in lengths:
            splits, _ = attention.partitions(
                num_programs=num_decodes * kv_heads, max_len=length, device=CPU
            )
            assert padded_splits(splits) in variants, (num_decodes, length, splits)


@pytest.mark.skipif(
    WHERE in (Where.HERE, Where.NOWHERE),
    reason=NO_TRITON if WHERE is Where.NOWHERE else "interpreted kernels are not specialized",
)
def test_the_launch_arguments_a_batch_changes_keep_one_specialization() -> None:
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    from engine.attention import AttentionMetadata

    def key(value: object, *, specialize: bool = True) -> tuple:
        return native_specialize_impl(BaseBackend, value, False, specialize, True)

    # Triton compiles apart an int equal to 1, and one divisible by 16 ...
    assert len({key(1), key(16), key(17)}) == 3
    # ... but not where the kernels ask it not to (the block table's width, the split count).
    from engine.attention import triton_kernels

    for kernel, name in [
        (triton_kernels.decode_partition, "stride_bt_seq"),
        (triton_kernels.prefill, "stride_bt_seq"),
        (triton_kernels.decode_merge, "num_splits"),
    ]:
        assert name in kernel.do_not_specialize, (kernel, name)
    # Every staged view starts on 16 bytes, whatever the batch's decodes and chunks.
    attention = TritonAttention()
    for num_decodes in range(1, 9):
        lens = [1] * num_decodes + [5, 40]
        metadata = AttentionMetadata.build(
            block_size=16,
            query_lens=lens,
            seq_lens=[n + 20 for n in lens],
            block_tables=[[0, 1, 2, 3]] * len(lens),
            device=CPU,
        )
        attention.prepare(metadata)
        plan = attention._plan
        assert plan is not None
        views = [plan.decode_rows, plan.decode_seqs, *plan.tiles.values()]
        assert {key(view)[1] for view in views} == {"D"}, num_decodes


def test_on_a_cpu_there_is_nothing_to_warm() -> None:
    engine = Engine(EngineConfig(num_blocks=16))
    assert warm_up_attention(engine.runner, max_len=engine.max_model_len) is None


@interpreted
def test_the_warmup_runs_each_variant_through_the_model() -> None:
    from engine.block_manager import BlockManager
    from engine.kernel_warmup import run_attention_variants
    from engine.kv_cache import KVCache
    from engine.model_runner import ModelRunner
    from engine.presets import PRESETS, build_preset_model

    launched = []

    class Recording(TritonAttention):  # the real launches, each split count noted
        def _decode(self, kernels, plan, shape, args):  # type: ignore[no-untyped-def]
            splits, _ = self.partitions(
                num_programs=plan.num_decodes * shape.kv_heads,
                max_len=plan.max_decode_len,
                device=CPU,
            )
            launched.append(padded_splits(splits))
            super()._decode(kernels, plan, shape, args)

    attention = Recording(target_programs=64, min_partition_tokens=64)
    model = build_preset_model(
        "tiny-random", attention=attention, device=CPU, dtype=torch.float32, seed=0
    )
    config = PRESETS["tiny-random"].config
    cache = KVCache(
        num_layers=config.num_layers,
        num_blocks=8,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        dtype=torch.float32,
        device=CPU,
    )
    runner = ModelRunner(
        model=model,
        attention=attention,
        kv_cache=cache,
        block_manager=BlockManager(num_blocks=8, block_size=16),
    )
    warmup = run_attention_variants(runner, attention, max_len=300)
    # 2 kv heads want 32 partitions; 300 tokens hold 4 of 64: rows of 1, 128 and 256.
    assert warmup.variants == {1: 1, 2: 128, 4: 256}
    layers = config.num_layers  # each decode row launches in every layer; the chunk, none
    assert launched == [1] * layers + [2] * layers + [4] * layers and warmup.seconds > 0
    assert not cache.kv.any()  # block 0, written by the launches, is zeros again


def background_child() -> background.Child | None:
    return interpreter_child(__file__, timeout_s=300)


@pytest.mark.background
@pytest.mark.skipif(
    WHERE is not Where.CHILD,
    reason=NO_TRITON if WHERE is Where.NOWHERE else "the warm-up runs in this process",
)
def test_the_warmup_under_the_interpreter() -> None:
    done, _ = background.finished(__name__, background_child)
    report = done.stdout[-6000:] + done.stderr[-2000:]
    assert done.returncode == 0, report
    # The enumeration's 6 cases and the warm-up ran there (the gpu one skips).
    assert "7 passed" in done.stdout and "failed" not in done.stdout, report


def _num_compiled(kernel: Any) -> int:
    caches = getattr(kernel, "device_caches", None)  # triton >= 3.2: (kernels, ...) a device
    if caches is not None:
        return sum(len(entry[0]) for entry in caches.values())
    return sum(len(c) for c in kernel.cache.values())  # triton 3.0 and 3.1: kernels a device


@pytest.mark.gpu
def test_serving_after_the_warmup_compiles_nothing() -> None:
    from engine.attention import triton_kernels as kernels

    engine = Engine(EngineConfig(device="cuda", num_blocks=2048, max_model_len=8192))
    assert isinstance(engine.attention, TritonAttention)
    launchable = (kernels.decode_partition, kernels.decode_merge, kernels.prefill)
    before = [_num_compiled(k) for k in launchable]
    greedy = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    # Batches of 1 to 9 sequences, of 5 to 8,000 tokens: widths 1, 16 and others, decodes
    # split every way and not, chunks beside decodes.
    for size, length in [(1, 5), (1, 8000), (3, 700), (9, 33), (2, 4100), (5, 1600)]:
        prompts = [[(7 * i + j) % 5000 + 1 for j in range(length - i)] for i in range(size)]
        engine.generate(prompts, greedy)
    assert [_num_compiled(k) for k in launchable] == before
