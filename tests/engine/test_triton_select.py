"""Which backend ``auto`` picks where: Triton on CUDA and ROCm when it imports.

This machine has no GPU, so the device is given to ``resolve_name`` as a type and the
triton check as a flag (a fake capability: the real ``get_attention_backend`` on a GPU
is the ``gpu`` test in ``attention/test_attention_select.py``). ROCm builds of torch
call their device ``cuda``, so one row covers both vendors.
"""

from __future__ import annotations

import logging
from unittest import mock

import pytest
import torch

from engine.attention import AttentionMetadata
from engine.attention.gather import GatherAttention
from engine.attention.select import get_attention_backend, resolve_name
from engine.attention.triton_attention import TritonAttention
from engine.errors import InvalidRequestError

# (name, device type, triton imports) -> backend
TABLE = [
    ("auto", "cpu", True, "paged"),
    ("auto", "cpu", False, "paged"),
    ("fast", "cpu", True, "paged"),
    ("auto", "cuda", True, "triton"),
    ("fast", "cuda", True, "triton"),
    ("auto", "cuda", False, "gather"),
    ("auto", "xpu", True, "gather"),
    ("gather", "cuda", True, "gather"),
    ("paged", "cuda", True, "paged"),
    ("reference", "cuda", True, "reference"),
    ("triton", "cuda", True, "triton"),
    ("triton", "cpu", True, "triton"),
]


@pytest.mark.parametrize(("name", "device_type", "has_triton", "want"), TABLE)
def test_auto_picks_triton_on_gpus_that_have_it(
    name: str, device_type: str, has_triton: bool, want: str
) -> None:
    assert resolve_name(name, device_type=device_type, has_triton=has_triton) == want


def test_asking_for_triton_without_it_says_what_to_install() -> None:
    with pytest.raises(InvalidRequestError, match=r"kvgov\[triton\].*attention='auto'"):
        resolve_name("triton", device_type="cuda", has_triton=False)


def test_triton_by_name_on_a_cpu_is_the_triton_backend() -> None:
    pytest.importorskip("triton", reason="triton is not installed: pip install 'kvgov[triton]'")
    assert isinstance(get_attention_backend("triton", device="cpu"), TritonAttention)


def test_triton_on_cpu_tensors_without_the_interpreter_says_how_to_run_it() -> None:
    pytest.importorskip("triton", reason="triton is not installed: pip install 'kvgov[triton]'")
    from engine.attention import triton_kernels

    if triton_kernels.INTERPRETED:
        pytest.skip("this process runs Triton's interpreter (TRITON_INTERPRET=1)")
    metadata = AttentionMetadata.build(
        block_size=4, query_lens=[1], seq_lens=[3], block_tables=[[0]], device=torch.device("cpu")
    )
    cache = torch.zeros(1, 4, 1, 16)
    token = torch.zeros(1, 1, 16)
    with pytest.raises(InvalidRequestError, match="TRITON_INTERPRET=1"):
        TritonAttention().forward(token, token, token, cache, cache.clone(), metadata, scale=1.0)


@pytest.mark.parametrize(("runs", "want"), [(True, TritonAttention), (False, GatherAttention)])
def test_auto_on_a_gpu_takes_triton_only_where_its_kernels_ran(runs: bool, want: type) -> None:
    # Faked: a CUDA device (none here), its SDPA probe and the Triton probe's answer.
    from engine.attention import select

    cuda0 = torch.device("cuda", 0)
    with (
        mock.patch.object(select, "resolve_device", return_value=cuda0),
        mock.patch.object(select, "probe_sdpa"),
        mock.patch.object(select, "default_dtype", return_value=torch.bfloat16),
        mock.patch.object(select, "triton_available", return_value=True),
        mock.patch.object(select, "triton_runs_on", return_value=runs) as probe,
    ):
        assert isinstance(get_attention_backend("auto", device="cuda"), want)
        assert isinstance(get_attention_backend("triton", device="cuda"), TritonAttention)
    probe.assert_called_once_with(cuda0, torch.bfloat16)  # by name: not probed


def test_the_triton_probe_falls_back_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    # Real kernels, real failure: on this CPU they cannot run outside the interpreter.
    pytest.importorskip("triton", reason="triton is not installed: pip install 'kvgov[triton]'")
    from engine.attention import triton_kernels
    from engine.attention.triton_probe import triton_runs_on

    if triton_kernels.INTERPRETED:
        pytest.skip("this process runs Triton's interpreter (TRITON_INTERPRET=1)")
    with caplog.at_level(logging.WARNING, logger="engine.attention.triton_probe"):
        assert triton_runs_on(torch.device("cpu"), torch.float32) is False
    assert "using the SDPA path" in caplog.text and "TRITON_INTERPRET=1" in caplog.text
