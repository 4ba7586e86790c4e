"""Every host-to-device copy in the engine goes through ``engine.host_staging``.

On a CPU the helper hands back the host tensor (nothing pinned: a CPU-only torch raises
on ``pin_memory``). A walk over ``engine/``'s syntax fails on any ``non_blocking`` copy
made elsewhere: a ``.to(device, non_blocking=True)`` of a pageable host tensor is a
hidden sync on CUDA and blocks the host outright on HIP. On a GPU (``gpu``) the staged
tensor is read from pinned memory.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from engine.host_staging import pinned_host, stage_tensor, stage_values

ENGINE = Path(__file__).resolve().parents[2] / "engine"
HELPER = ENGINE / "host_staging.py"


def test_on_a_cpu_the_host_tensor_is_the_staged_one() -> None:
    cpu = torch.device("cpu")
    host = torch.arange(6, dtype=torch.int32)
    staged = stage_tensor(host, cpu)
    assert staged is host and pinned_host(host, cpu) is host and not host.is_pinned()
    values = stage_values([3, 1, 2], dtype=torch.int64, device=cpu)
    assert values.tolist() == [3, 1, 2] and values.dtype == torch.int64
    assert not values.is_pinned()
    floats = stage_values([0.5, 2.0], dtype=torch.float32, device=cpu)
    assert floats.tolist() == [0.5, 2.0] and floats.dtype == torch.float32
    assert stage_values([], dtype=torch.int64, device=cpu).numel() == 0


def _non_blocking_copies(path: Path) -> list[tuple[ast.Call, str]]:
    """Each call in ``path`` that passes ``non_blocking`` (anything but a literal False),
    with its source."""
    source = path.read_text()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and any(
            kw.arg == "non_blocking"
            and not (isinstance(kw.value, ast.Constant) and kw.value.value is False)
            for kw in node.keywords
        ):
            found.append((node, ast.get_source_segment(source, node) or ""))
    return found


def _host_pool(node: ast.expr) -> bool:
    """``self.host_blocks[...]``: the KV cache's host pool, allocated pinned (checked in
    test_kv_cache), so its swap copies in and out need no staging."""
    return (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "host_blocks"
    )


def _copies_with_the_host_pool(call: ast.Call) -> bool:
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr == "copy_" and call.args):
        return False
    return _host_pool(func.value) or _host_pool(call.args[0])


def test_every_non_blocking_copy_in_the_engine_goes_through_the_helper() -> None:
    stray = []
    for path in sorted(ENGINE.rglob("*.py")):
        if path == HELPER:
            continue
        for call, text in _non_blocking_copies(path):
            if not _copies_with_the_host_pool(call):
                stray.append(f"{path.relative_to(ENGINE.parent)}:{call.lineno}: {text}")
    assert not stray, "stage host tensors with engine.host_staging:\n" + "\n".join(stray)
    # The walk sees what it looks for: the helper's own copy is one.
    assert [text for _, text in _non_blocking_copies(HELPER)] == [
        "pinned_host(host, device).to(device, non_blocking=True)"
    ]


@pytest.mark.gpu
def test_on_a_gpu_the_copy_reads_pinned_memory() -> None:
    cuda = torch.device("cuda", torch.cuda.current_device())
    pageable = torch.arange(10, dtype=torch.int64)
    assert not pageable.is_pinned() and pinned_host(pageable, cuda).is_pinned()
    staged = stage_tensor(pageable, cuda)
    assert staged.device == cuda and staged.cpu().tolist() == list(range(10))
    host = torch.tensor([4, 5], dtype=torch.int32, pin_memory=True)
    assert pinned_host(host, cuda) is host  # pinned already: not copied again
    values = stage_values([1.5, -2.0], dtype=torch.float32, device=cuda)
    assert values.device == cuda and values.cpu().tolist() == [1.5, -2.0]
