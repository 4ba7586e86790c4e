"""Every Triton kernel launch in the engine asks for FMA contraction explicitly.

Triton 3.9 warns at each compile whose launch leaves ``enable_fp_fusion`` unset (and
pyproject turns warnings into errors), and older Tritons take the option too. A walk
over ``engine/``'s syntax finds each launch (``kernel[grid](...)``) and fails on one
that passes neither ``enable_fp_fusion`` nor ``**LAUNCH`` (``launch_options``, which
holds it).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from engine.attention.triton_attention import launch_options

ENGINE = Path(__file__).resolve().parents[2] / "engine"


def _launches() -> list[tuple[str, ast.Call]]:
    """Each ``kernel[grid](...)``: a call of a subscript by a tuple or a name ``grid``."""
    found = []
    for path in sorted(ENGINE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)):
                continue
            grid = node.func.slice
            if isinstance(grid, ast.Tuple) or (isinstance(grid, ast.Name) and grid.id == "grid"):
                found.append((f"{path.relative_to(ENGINE.parent)}:{node.lineno}", node))
    return found


def _fuses(call: ast.Call) -> bool:
    for keyword in call.keywords:
        if keyword.arg == "enable_fp_fusion":
            return True
        value = keyword.value
        if keyword.arg is None and isinstance(value, ast.Name) and value.id == "LAUNCH":
            return True
    return False


@pytest.mark.parametrize("hip", [False, True], ids=["cuda", "rocm"])
def test_the_attention_launch_options_ask_for_fusion(hip: bool) -> None:
    assert launch_options(hip=hip)["enable_fp_fusion"] is True


def test_every_kernel_launch_asks_for_fusion() -> None:
    launches = _launches()
    where = {place.split(":")[0] for place, _ in launches}
    # decode, merge and prefill; the quantized matmul
    assert {"engine/attention/triton_attention.py", "engine/quantization/triton_matmul.py"} <= where
    assert len(launches) >= 4
    missing = [place for place, call in launches if not _fuses(call)]
    assert not missing, f"launches without enable_fp_fusion: {missing}"
