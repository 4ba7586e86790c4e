"""The default dtype by architecture: bfloat16 only where the GPU multiplies it natively.

No GPU here: the table is checked on ``bf16_matrix_units``, and ``default_dtype``'s
wiring with faked device properties (``mock``: the real ones need a GPU).
"""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from engine import device as device_module
from engine.device import bf16_matrix_units, default_dtype

CUDA = [
    ((7, 0), False),  # V100
    ((7, 5), False),  # T4
    ((8, 0), True),  # A100
    ((8, 6), True),  # RTX 30xx
    ((8, 9), True),  # L4, RTX 40xx
    ((9, 0), True),  # H100, H200
    ((12, 0), True),  # RTX 50xx
]
ROCM = [
    ("gfx906", False),  # Vega 20, MI50
    ("gfx908", False),  # CDNA1, MI100
    ("gfx90a", True),  # CDNA2, MI200
    ("gfx90a:sramecc+:xnack-", True),
    ("gfx942:sramecc+:xnack-", True),  # CDNA3, MI300
    ("gfx950", True),  # CDNA4, MI350
    ("gfx1030", False),  # RDNA2, RX 6800
    ("gfx1100", True),  # RDNA3, RX 7900
    ("gfx1151", True),  # RDNA3.5
    ("gfx1201", True),  # RDNA4, RX 9070 XT
]


@pytest.mark.parametrize(("capability", "bf16"), CUDA)
def test_cuda_has_bf16_matrix_units_from_ampere_on(capability: tuple[int, int], bf16: bool) -> None:
    assert bf16_matrix_units(cuda_capability=capability) is bf16


@pytest.mark.parametrize(("arch", "bf16"), ROCM)
def test_rocm_has_bf16_matrix_units_from_cdna2_and_rdna3_on(arch: str, bf16: bool) -> None:
    assert bf16_matrix_units(hip_arch=arch) is bf16


def test_the_cpu_default_is_unchanged() -> None:
    assert default_dtype("cpu") == torch.float32


@pytest.mark.parametrize(
    ("hip", "props", "want"),
    [
        ("6.4", SimpleNamespace(gcnArchName="gfx1201", major=12, minor=0), torch.bfloat16),
        ("6.4", SimpleNamespace(gcnArchName="gfx1030", major=10, minor=3), torch.float16),
        ("6.4", SimpleNamespace(gcnArchName="gfx908", major=9, minor=0), torch.float16),
        (None, SimpleNamespace(gcnArchName="", major=9, minor=0), torch.bfloat16),
        (None, SimpleNamespace(gcnArchName="", major=7, minor=5), torch.float16),
    ],
)
def test_default_dtype_reads_the_gpu_architecture(
    hip: str | None, props: SimpleNamespace, want: torch.dtype
) -> None:
    # ROCm reports its major version from the arch (gfx908 is "9.0"): only the arch counts.
    cuda0 = torch.device("cuda", 0)
    with (
        mock.patch.object(device_module, "resolve_device", return_value=cuda0),
        mock.patch.object(torch.cuda, "get_device_properties", return_value=props),
        mock.patch.object(torch.version, "hip", hip),
    ):
        assert default_dtype("cuda") == want
