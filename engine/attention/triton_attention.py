"""Triton paged attention: the GPU backend, on CUDA and ROCm alike.

``prepare`` stages the step's launch data once for all layers, in one host-to-device
copy: the decode rows and their sequences, and the prefill tiles (up to 16 or 32 new
tokens of one chunk each, for wide and narrow heads). Block tables and sequence lengths
become int32 on the device, without a host sync. Each layer's ``forward`` writes the new
K/V into their slots, then launches the kernels of ``triton_kernels`` on the cache in
place.

Decode is split across partitions of each row's positions (flash-decoding) when decode
rows x kv heads are fewer than ``target_programs`` (4 per multiprocessor on a GPU): a
batch of 8 long sequences with 8 kv heads is 64 programs, half an H200's 132
multiprocessors, each streaming 4,096 tokens alone, until split.

Triton compiles a kernel again for each new set of constexprs and argument
specializations (ints equal to 1 or divisible by 16, pointers 16-byte aligned), 1-3 s on
a GPU. So what a step passes is kept to one specialization whatever the batch (each
staged view starts 16-byte aligned; the block table's row stride and the merge's split
count are not specialized, ``triton_kernels``), and the one constexpr a batch changes,
the decode's split count padded to a power of two, takes a handful of values
(``decode_variants``), which the engine compiles before it serves (``engine.kernel_warmup``).

On CPU tensors the same kernels run under Triton's interpreter: slow, for tests.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from types import ModuleType

import torch

from engine.attention.metadata import AttentionMetadata
from engine.attention.reference import write_kv
from engine.device import multiprocessors
from engine.errors import InvalidRequestError
from engine.host_staging import stage_values
from engine.validation import require_int

__all__ = [
    "KernelShape",
    "TritonAttention",
    "launch_options",
    "num_splits",
    "padded_splits",
    "triton_available",
]

_TILE_ROWS = (16, 32)  # prefill query rows per program: for wide heads, for the rest
_MIN_DOT = 16  # tl.dot's smallest tile side
_PARTITION_QUANTUM = 64  # decode partitions are whole K/V tiles (16 to 64 tokens)
_TILE_ELEMENTS = 4096  # a K/V tile's tokens x head_dim (padded)
_ALIGN = 4  # int32s in 16 bytes: Triton specializes a pointer on 16-byte alignment


def launch_options(*, hip: bool) -> dict[str, object]:
    """Compile options of every launch. Software pipelining keeps a K/V tile in flight
    besides the one in use on NVIDIA, not on ROCm (an RDNA card has 64 KiB of LDS per
    workgroup). FMA contraction is asked for explicitly: triton 3.9 warns otherwise."""
    return {"num_warps": 4, "num_stages": 1 if hip else 2, "enable_fp_fusion": True}


LAUNCH = launch_options(hip=bool(torch.version.hip))


@functools.cache
def triton_available() -> bool:
    """Whether ``triton`` imports here (GPU builds of torch ship it; CPU installs may not)."""
    try:
        if importlib.util.find_spec("triton") is None:
            return False
        import triton.language  # noqa: F401
    except (ImportError, ValueError):  # ValueError: blocked in sys.modules (None)
        return False
    return True


def num_splits(
    *, num_programs: int, max_len: int, target_programs: int, min_partition_tokens: int
) -> int:
    """Partitions per decode row: enough for ``target_programs`` programs, none shorter
    than ``min_partition_tokens`` (a partition's fixed cost is its merge)."""
    if num_programs <= 0 or num_programs >= target_programs:
        return 1
    want = -(-target_programs // num_programs)
    return max(1, min(want, max_len // min_partition_tokens))


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def padded_splits(splits: int) -> int:
    """The decode kernels' ``NUM_SPLITS`` for ``splits`` partitions (1: unsplit)."""
    return 1 if splits == 1 else _pow2(splits)


@dataclass(frozen=True, slots=True)
class _Plan:
    block_tables: torch.Tensor  # [S, W] int32
    seq_lens: torch.Tensor  # [S] int32
    num_decodes: int
    decode_rows: torch.Tensor  # [R] int32: token index of each decode
    decode_seqs: torch.Tensor  # [R] int32: its sequence
    max_decode_len: int
    tiles: dict[int, torch.Tensor]  # rows per tile -> [P, 4] int32: first row, rows,
    # first position, sequence


class TritonAttention:
    """- ``target_programs``: decode programs to aim for before splitting rows; ``None``
      is 4 per multiprocessor of the device (1 on a CPU: the interpreter gains nothing).
    - ``min_partition_tokens``: the shortest partition a split may cut.
    """

    name = "triton"

    __slots__ = ("_min_partition_tokens", "_plan", "_planned_for", "_target_programs")

    def __init__(
        self, *, target_programs: int | None = None, min_partition_tokens: int = 256
    ) -> None:
        if target_programs is not None:
            require_int("target_programs", target_programs, minimum=1)
        self._target_programs = target_programs
        self._min_partition_tokens = require_int(
            "min_partition_tokens", min_partition_tokens, minimum=1
        )
        self._plan: _Plan | None = None
        self._planned_for: AttentionMetadata | None = None

    def prepare(self, metadata: AttentionMetadata) -> None:
        device = metadata.seq_lens.device
        decode_rows: list[int] = []
        decode_seqs: list[int] = []
        tiles: dict[int, list[int]] = {rows: [] for rows in _TILE_ROWS}
        max_decode_len = 0
        row = 0
        for s, (q_len, s_len) in enumerate(
            zip(metadata.query_lens_cpu, metadata.seq_lens_cpu, strict=True)
        ):
            if q_len == 1:
                decode_rows.append(row)
                decode_seqs.append(s)
                max_decode_len = max(max_decode_len, s_len)
            else:
                context = s_len - q_len
                for rows, cells in tiles.items():
                    for i in range(0, q_len, rows):
                        cells += [row + i, min(rows, q_len - i), context + i, s]
            row += q_len
        num_decodes = len(decode_rows)
        # Each section starts on 16 bytes (tiles are 4 int32s each), so whatever the
        # batch, every pointer into the buffer keeps one specialization: no recompile.
        section = num_decodes + -num_decodes % _ALIGN
        padding = [0] * (section - num_decodes)
        flat = [*decode_rows, *padding, *decode_seqs, *padding]
        flat += [cell for cells in tiles.values() for cell in cells]
        staged = stage_values(flat, dtype=torch.int32, device=device)
        self._plan = _Plan(
            block_tables=metadata.block_tables.to(torch.int32),
            seq_lens=metadata.seq_lens.to(torch.int32),
            num_decodes=num_decodes,
            decode_rows=staged[:num_decodes],
            decode_seqs=staged[section : section + num_decodes],
            max_decode_len=max_decode_len,
            tiles=dict(
                zip(
                    tiles,
                    staged[2 * section :].split([len(c) for c in tiles.values()]),
                    strict=True,
                )
            ),
        )
        self._planned_for = metadata

    def forward(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
        key_cache: torch.Tensor,  # [N, B, Hkv, D]
        value_cache: torch.Tensor,  # [N, B, Hkv, D]
        metadata: AttentionMetadata,
        *,
        scale: float,
    ) -> torch.Tensor:  # [T, Hq, D]
        if self._planned_for is not metadata:
            self.prepare(metadata)
        plan = self._plan
        assert plan is not None
        assert key_cache.stride() == value_cache.stride() and key_cache.stride(-1) == 1
        from engine.attention import triton_kernels as kernels

        if q.device.type == "cpu" and not kernels.INTERPRETED:
            raise InvalidRequestError(
                "the Triton attention backend runs on CPU tensors only under Triton's "
                "interpreter: set TRITON_INTERPRET=1 before triton is imported, or choose "
                "attention='auto' (the CPU's own backend)"
            )
        write_kv(k, v, key_cache, value_cache, metadata.slot_mapping)
        out = torch.empty_like(q)
        query = q.to(key_cache.dtype)
        if query.stride(-1) != 1:
            query = query.contiguous()
        shape = KernelShape.of(query, key_cache, interpreted=kernels.INTERPRETED)
        args = (
            query,
            key_cache,
            value_cache,
            plan.block_tables,
            out,
            scale * 1.4426950408889634,  # scale * log2(e): the kernels use exp2
            query.stride(0),
            query.stride(1),
            key_cache.stride(0),
            key_cache.stride(1),
            key_cache.stride(2),
            plan.block_tables.stride(0),
            out.stride(0),
            out.stride(1),
        )
        if plan.num_decodes:
            self._decode(kernels, plan, shape, args)
        tiles = plan.tiles[shape.block_m].view(-1, 4)
        if tiles.numel():
            kernels.prefill[(tiles.shape[0], shape.num_heads)](
                *args,
                tiles,
                GROUP=shape.group,
                BLOCK_M=shape.block_m,
                TILE_N=shape.tile_n,
                **shape.constexprs(),
                **LAUNCH,
            )
        return out

    def partitions(
        self, *, num_programs: int, max_len: int, device: torch.device
    ) -> tuple[int, int]:
        """Partitions per decode row and tokens per partition (a multiple of 64)."""
        splits = num_splits(
            num_programs=num_programs,
            max_len=max_len,
            target_programs=self._targets(device),
            min_partition_tokens=self._min_partition_tokens,
        )
        partition = -(-max_len // splits)
        partition = -(-partition // _PARTITION_QUANTUM) * _PARTITION_QUANTUM
        return -(-max_len // partition), partition

    def decode_variants(
        self, *, kv_heads: int, max_len: int, device: torch.device
    ) -> dict[int, int]:
        """Every decode kernel a step can launch on ``device``, by ``NUM_SPLITS`` (the
        partitions padded to a power of two; 1 unsplit), each with the length of one
        decode row that launches it. One row splits the most (the fewest programs), and
        no row is longer than ``max_len``."""
        most = num_splits(
            num_programs=kv_heads,
            max_len=max_len,
            target_programs=self._targets(device),
            min_partition_tokens=self._min_partition_tokens,
        )
        # A row of splits x (the shortest partition, in whole tiles) makes that many.
        shortest = -(-self._min_partition_tokens // _PARTITION_QUANTUM) * _PARTITION_QUANTUM
        variants: dict[int, int] = {}
        for want in range(1, most + 1):
            length = 1 if want == 1 else min(want * shortest, max_len)
            splits, _ = self.partitions(num_programs=kv_heads, max_len=length, device=device)
            variants[padded_splits(splits)] = length
        return dict(sorted(variants.items()))

    def _decode(self, kernels: ModuleType, plan: _Plan, shape: KernelShape, args: tuple) -> None:
        num_decodes, out = plan.num_decodes, args[4]
        splits, partition = self.partitions(
            num_programs=num_decodes * shape.kv_heads,
            max_len=plan.max_decode_len,
            device=out.device,
        )
        padded = padded_splits(splits)
        if splits == 1:
            part_out = part_lse = out  # not written: the kernel stores the output directly
        else:
            cells = (num_decodes, shape.num_heads, padded)
            part_out = torch.empty((*cells, shape.dim_pad), dtype=torch.float32, device=out.device)
            part_lse = torch.empty(cells, dtype=torch.float32, device=out.device)
        kernels.decode_partition[(num_decodes, shape.kv_heads, splits)](
            *args,
            plan.seq_lens,
            plan.decode_rows,
            plan.decode_seqs,
            part_out,
            part_lse,
            partition,
            GROUP=shape.group,
            GROUP_PAD=max(_MIN_DOT, _pow2(shape.group)),
            TILE_N=shape.tile_n,
            NUM_SPLITS=padded,
            **shape.constexprs(),
            **LAUNCH,
        )
        if splits > 1:
            kernels.decode_merge[(num_decodes, shape.num_heads)](
                part_out,
                part_lse,
                plan.decode_rows,
                out,
                splits,
                out.stride(0),
                out.stride(1),
                HEAD_DIM=shape.head_dim,
                DIM_PAD=shape.dim_pad,
                NUM_SPLITS=padded,
                **LAUNCH,
            )

    def _targets(self, device: torch.device) -> int:
        if self._target_programs is not None:
            return self._target_programs
        if device.type != "cuda":
            return 1
        return 4 * multiprocessors(device.index or 0)


@dataclass(frozen=True, slots=True)
class KernelShape:
    """What the kernels are compiled for: heads, head size, block size, tile sizes."""

    num_heads: int
    kv_heads: int
    head_dim: int
    block_size: int
    upcast: bool  # the interpreter gets bfloat16 dot products wrong: fp32 there

    @classmethod
    def of(cls, query: torch.Tensor, cache: torch.Tensor, *, interpreted: bool) -> KernelShape:
        block_size, kv_heads, head_dim = cache.shape[1:]
        upcast = interpreted and cache.dtype == torch.bfloat16
        return cls(query.shape[1], kv_heads, head_dim, block_size, upcast)

    @property
    def group(self) -> int:
        return self.num_heads // self.kv_heads

    @property
    def dim_pad(self) -> int:
        return max(_MIN_DOT, _pow2(self.head_dim))

    @property
    def tile_n(self) -> int:
        """Tokens per K/V tile: 4,096 elements (32 x 128, 16 x 256), which RDNA4 (wave32)
        holds without spilling registers and sm90 in at most 168 (``test_triton_compile``:
        64 x 128 spilled 56-84 registers on gfx1201 and took 234 on sm90)."""
        return min(_PARTITION_QUANTUM, max(_MIN_DOT, _TILE_ELEMENTS // self.dim_pad))

    @property
    def block_m(self) -> int:
        """Prefill query rows per program: 16 for heads wider than 128 (32 x 256 spilled
        registers on gfx1201), else 32."""
        return _TILE_ROWS[0] if self.dim_pad > 128 else _TILE_ROWS[1]

    def constexprs(self) -> dict[str, object]:
        return {
            "HEAD_DIM": self.head_dim,
            "DIM_PAD": self.dim_pad,
            "BLOCK_SIZE": self.block_size,
            "UPCAST": self.upcast,
        }
