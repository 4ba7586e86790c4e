from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.device import default_dtype, resolve_device
from engine.errors import InvalidRequestError
from engine.kv_cache import KVCache

SIZES: dict[str, Any] = {
    "num_layers": 3,
    "num_blocks": 8,
    "block_size": 4,
    "num_kv_heads": 2,
    "head_dim": 5,
}
INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(INT_VIEW[t.dtype])


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def _filled(
    dtype: torch.dtype = torch.float32, *, num_host_blocks: int = 4, seed: int = 0
) -> KVCache:
    """A CPU cache full of random data, distinct per layer, with NaN, inf and -0.0 sprinkled in."""
    cache = KVCache(**SIZES, num_host_blocks=num_host_blocks, dtype=dtype, device="cpu")
    gen = torch.Generator().manual_seed(seed)
    for pool in (cache.kv, cache.host_kv):
        data = torch.randn(pool.shape, generator=gen)
        data += torch.arange(cache.num_layers).view(1, -1, 1, 1, 1, 1) * 100.0
        flat = data.view(-1)
        if flat.numel() >= 3:
            flat[0], flat[1], flat[2] = float("nan"), float("inf"), -0.0
        pool.copy_(data.to(dtype))
    return cache


def test_shapes_dtype_and_views_on_cpu() -> None:
    cache = KVCache(**SIZES, num_host_blocks=2)
    assert cache.device == torch.device("cpu")
    assert cache.dtype == torch.float32
    assert cache.kv.shape == (2, 3, 8, 4, 2, 5)
    assert cache.host_kv.shape == (2, 3, 2, 4, 2, 5)
    assert cache.host_kv.device == torch.device("cpu")
    assert len(cache.key_caches) == len(cache.value_caches) == 3
    assert cache.key_cache(1).shape == cache.value_cache(1).shape == (8, 4, 2, 5)
    cache.key_cache(1)[3] = 1.5
    cache.value_cache(2)[7] = -2.5
    assert bool((cache.kv[0, 1, 3] == 1.5).all()) and bool((cache.kv[1, 2, 7] == -2.5).all())
    assert float(cache.kv.abs().sum()) == 1.5 * 40 + 2.5 * 40
    assert "num_blocks=8" in repr(cache)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_explicit_dtype(dtype: torch.dtype) -> None:
    cache = KVCache(**SIZES, num_host_blocks=1, dtype=dtype)
    assert cache.kv.dtype == cache.host_kv.dtype == cache.key_cache(0).dtype == dtype


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour")
def test_device_resolution_without_gpu() -> None:
    assert resolve_device() == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    assert default_dtype("cpu") == torch.float32
    with pytest.raises(InvalidRequestError, match="device='auto' or 'cpu'"):
        resolve_device("cuda")
    with pytest.raises(InvalidRequestError, match="no CUDA/ROCm GPU"):
        KVCache(**SIZES, device="cuda:0")


def test_unknown_device_string() -> None:
    with pytest.raises(InvalidRequestError, match="unknown device"):
        resolve_device("not-a-device")


def test_bytes_math() -> None:
    cache = KVCache(**SIZES, dtype=torch.float16)
    assert cache.bytes_per_block == 2 * 3 * 4 * 2 * 5 * 2 == 480
    assert cache.bytes_per_token == 120
    assert cache.bytes_per_block == cache.kv[:, :, 0].numel() * cache.kv.element_size()
    shape = {k: v for k, v in SIZES.items() if k != "num_blocks"}
    assert KVCache.blocks_for_bytes(480 * 7 + 479, **shape, dtype=torch.float16) == 7
    assert KVCache.blocks_for_bytes(479, **shape, dtype=torch.float16) == 0
    assert KVCache.blocks_for_bytes(960 * 3, **shape, device="cpu") == 3  # float32 default
    with pytest.raises(InvalidRequestError, match="nbytes"):
        KVCache.blocks_for_bytes(-1, **shape)
    with pytest.raises(InvalidRequestError, match="head_dim"):
        KVCache.blocks_for_bytes(100, **{**shape, "head_dim": 0})


@pytest.mark.parametrize("name", sorted(SIZES))
@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "4"])
def test_sizes_must_be_positive_ints(name: str, bad: object) -> None:
    with pytest.raises(InvalidRequestError, match=name):
        KVCache(**{**SIZES, name: bad})


def test_host_blocks_may_be_zero_but_not_negative() -> None:
    assert KVCache(**SIZES, num_host_blocks=0).host_kv.shape[2] == 0
    with pytest.raises(InvalidRequestError, match="num_host_blocks"):
        KVCache(**SIZES, num_host_blocks=-1)


@pytest.mark.parametrize("bad", [torch.int32, torch.bool, "float16"])
def test_dtype_must_be_floating(bad: object) -> None:
    with pytest.raises(InvalidRequestError, match="dtype"):
        KVCache(**SIZES, dtype=bad)  # type: ignore[arg-type]


def test_layer_index_is_checked() -> None:
    cache = KVCache(**SIZES)
    with pytest.raises(InvalidRequestError, match="layer"):
        cache.key_cache(3)
    with pytest.raises(InvalidRequestError, match="layer"):
        cache.value_cache(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_copy_blocks_is_bit_exact_and_touches_only_destinations(dtype: torch.dtype) -> None:
    cache = _filled(dtype)
    before = cache.kv.clone()
    cache.copy_blocks([(1, 5), (1, 6), (0, 7)])
    for src, dst in [(1, 5), (1, 6), (0, 7)]:
        assert _same_bits(cache.kv[:, :, dst], before[:, :, src])
    assert _same_bits(cache.kv[:, :, :5], before[:, :, :5])
    assert _same_bits(cache.host_kv, _filled(dtype).host_kv)


def test_copy_blocks_reads_all_sources_before_writing() -> None:
    cache = _filled()
    before = cache.kv.clone()
    # A rotation plus a chain: every destination is some other pair's source.
    cache.copy_blocks([(0, 1), (1, 2), (2, 0), (3, 4), (4, 5)])
    for src, dst in [(0, 1), (1, 2), (2, 0), (3, 4), (4, 5)]:
        assert _same_bits(cache.kv[:, :, dst], before[:, :, src])
    assert _same_bits(cache.kv[:, :, 3], before[:, :, 3])


def test_pairs_may_be_an_int_tensor() -> None:
    cache = _filled()
    before = cache.kv.clone()
    cache.copy_blocks(torch.tensor([[2, 3], [2, 4]], dtype=torch.int32))
    assert _same_bits(cache.kv[:, :, 3], before[:, :, 2])
    assert _same_bits(cache.kv[:, :, 4], before[:, :, 2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_swap_round_trip_into_other_blocks(dtype: torch.dtype) -> None:
    cache = _filled(dtype)
    before = cache.kv.clone()
    cache.swap_out([(2, 0), (5, 3)])
    assert _same_bits(cache.host_kv[:, :, 0], before[:, :, 2])
    assert _same_bits(cache.host_kv[:, :, 3], before[:, :, 5])
    assert _same_bits(cache.kv, before)  # swapping out leaves the device untouched
    cache.kv[:, :, 2].zero_()
    cache.kv[:, :, 5].zero_()
    cache.swap_in([(0, 7), (3, 1)])
    assert _same_bits(cache.kv[:, :, 7], before[:, :, 2])
    assert _same_bits(cache.kv[:, :, 1], before[:, :, 5])
    assert _same_bits(cache.kv[:, :, 3:5], before[:, :, 3:5])


@pytest.mark.parametrize("empty", [[], (), torch.empty((0, 2), dtype=torch.int64)])
def test_empty_pairs_are_a_no_op(empty: object) -> None:
    cache = _filled(num_host_blocks=0)
    before = cache.kv.clone()
    cache.copy_blocks(empty)  # type: ignore[arg-type]
    cache.swap_out(empty)  # type: ignore[arg-type]
    cache.swap_in(empty)  # type: ignore[arg-type]
    assert _same_bits(cache.kv, before)


@pytest.mark.parametrize(
    ("op", "pairs", "match"),
    [
        ("copy_blocks", [(0, 8)], "destination device block id 8"),
        ("copy_blocks", [(-1, 0)], "source device block id -1"),
        ("copy_blocks", [(0, 1), (2, 1)], "block 1 appears more than once"),
        ("swap_out", [(8, 0)], "source device block id 8"),
        ("swap_out", [(0, 4)], "destination host block id 4"),
        ("swap_out", [(0, 1), (2, 1)], "host block 1 appears more than once"),
        ("swap_in", [(4, 0)], "source host block id 4"),
        ("swap_in", [(0, 9)], "destination device block id 9"),
        ("copy_blocks", [(0, 1, 2)], r"shape \[n, 2\]"),
        ("copy_blocks", torch.tensor([[0.0, 1.0]]), "integers"),
        ("copy_blocks", [("a", 1)], "tuples of ints"),
    ],
)
def test_bad_pairs_raise_and_change_nothing(op: str, pairs: object, match: str) -> None:
    cache = _filled()
    kv, host = cache.kv.clone(), cache.host_kv.clone()
    with pytest.raises(InvalidRequestError, match=match):
        getattr(cache, op)(pairs)
    assert _same_bits(cache.kv, kv) and _same_bits(cache.host_kv, host)


def test_swapping_without_host_blocks_says_what_to_do() -> None:
    cache = KVCache(**SIZES)
    with pytest.raises(InvalidRequestError, match="num_host_blocks > 0"):
        cache.swap_out([(0, 0)])


@pytest.mark.gpu
def test_swap_round_trip_on_gpu() -> None:
    cache = KVCache(**SIZES, num_host_blocks=4, device="cuda")
    assert cache.device.type == "cuda" and cache.dtype in (torch.bfloat16, torch.float16)
    assert cache.host_kv.is_pinned()
    cache.kv.copy_(torch.randn(cache.kv.shape, device=cache.device).to(cache.dtype))
    before = cache.kv.clone()
    cache.copy_blocks([(0, 1), (1, 2)])
    cache.swap_out([(2, 0), (5, 3)])
    cache.kv[:, :, 2].zero_()
    cache.swap_in(torch.tensor([[0, 7], [3, 6]], device=cache.device))
    torch.cuda.synchronize()
    assert _same_bits(cache.kv[:, :, 1], before[:, :, 0])
    assert _same_bits(cache.kv[:, :, 7], before[:, :, 1])
    assert _same_bits(cache.kv[:, :, 6], before[:, :, 5])


# Property: any sequence of moves matches a reference that keeps one cloned tensor per block.

SMALL: dict[str, Any] = {
    "num_layers": 2,
    "num_blocks": 5,
    "block_size": 2,
    "num_kv_heads": 1,
    "head_dim": 3,
}
NUM_HOST = 3


def _moves(num_src: int, num_dst: int) -> st.SearchStrategy[list[tuple[int, int]]]:
    pair = st.tuples(st.integers(0, num_src - 1), st.integers(0, num_dst - 1))
    return st.lists(pair, max_size=num_dst, unique_by=lambda p: p[1])


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("copy_blocks"), _moves(SMALL["num_blocks"], SMALL["num_blocks"])),
        st.tuples(st.just("swap_out"), _moves(SMALL["num_blocks"], NUM_HOST)),
        st.tuples(st.just("swap_in"), _moves(NUM_HOST, SMALL["num_blocks"])),
    ),
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(ops=OPS, as_tensor=st.booleans())
def test_random_moves_match_reference(
    ops: list[tuple[str, list[tuple[int, int]]]], as_tensor: bool
) -> None:
    cache = KVCache(**SMALL, num_host_blocks=NUM_HOST, dtype=torch.float16, device="cpu")
    gen = torch.Generator().manual_seed(1)
    cache.kv.copy_(torch.randn(cache.kv.shape, generator=gen).half())
    cache.host_kv.copy_(torch.randn(cache.host_kv.shape, generator=gen).half())
    pools = {
        "device": {i: cache.kv[:, :, i].clone() for i in range(SMALL["num_blocks"])},
        "host": {i: cache.host_kv[:, :, i].clone() for i in range(NUM_HOST)},
    }
    routes = {
        "copy_blocks": ("device", "device"),
        "swap_out": ("device", "host"),
        "swap_in": ("host", "device"),
    }
    for op, pairs in ops:
        arg = torch.tensor(pairs, dtype=torch.int64).view(-1, 2) if as_tensor else pairs
        getattr(cache, op)(arg)
        src_pool, dst_pool = (pools[name] for name in routes[op])
        read = {src: src_pool[src].clone() for src, _ in pairs}
        for src, dst in pairs:
            dst_pool[dst] = read[src]
    for i, block in pools["device"].items():
        assert _same_bits(cache.kv[:, :, i], block)
    for i, block in pools["host"].items():
        assert _same_bits(cache.host_kv[:, :, i], block)
