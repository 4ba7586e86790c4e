"""How many K ranges the quantized matmul cuts (``split_k``), as a pure function.

A decode's rows are one tile of 16, so a layer's programs are its output tiles of 64:
an 8B model's o_proj and down_proj (4,096 outputs) make 64, under half an H100's 132
multiprocessors, until K is split. Ranges are whole quantization groups, none empty.
"""

from __future__ import annotations

import pytest

from engine.quantization.triton_matmul import split_k


@pytest.mark.parametrize(
    ("num_programs", "k_groups", "target", "splits"),
    [
        (64, 32, 264, 5),  # o_proj at a decode, K 4,096 in groups of 128, on an H100
        (64, 112, 264, 5),  # down_proj, K 14,336
        (96, 32, 264, 3),  # qkv_proj: 4,096 + 2 x 1,024 outputs
        (448, 32, 264, 1),  # gate_up_proj: 28,672 outputs fill the card unsplit
        (264, 32, 264, 1),  # exactly the target
        (1, 5, 3, 3),  # 5 groups in 3 ranges: 2 + 2 + 1
        (1, 4, 264, 4),  # never finer than one group a range
        (1, 9, 4, 3),  # 4 ranges of 3 would leave the last empty: 3 of 3
        (1, 1, 264, 1),  # one group: nothing to split
        (0, 32, 264, 1),  # no rows, no programs
    ],
)
def test_split_k(num_programs: int, k_groups: int, target: int, splits: int) -> None:
    assert split_k(num_programs=num_programs, k_groups=k_groups, target_programs=target) == splits


def test_every_split_covers_k_in_ranges_none_empty() -> None:
    for num_programs in range(1, 20):
        for k_groups in range(1, 40):
            for target in range(1, 80):
                splits = split_k(
                    num_programs=num_programs, k_groups=k_groups, target_programs=target
                )
                per_range = -(-k_groups // splits)  # as the launcher cuts them
                assert (splits - 1) * per_range < k_groups <= splits * per_range
                if num_programs >= target:
                    assert splits == 1
                    continue
                want = -(-target // num_programs)  # ranges the target asks for
                assert splits <= want
                # As short as the target allows: one group shorter takes too many ranges.
                assert per_range == 1 or -(-k_groups // (per_range - 1)) > want
