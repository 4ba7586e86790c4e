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

from engine.attention import AttentionMetadata, AttentionShape
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


MODEL = AttentionShape(
    num_heads=32, num_kv_heads=8, head_dim=128, block_size=16, dtype=torch.float16
)


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
        assert isinstance(get_attention_backend("auto", device="cuda", shape=MODEL), want)
        assert isinstance(get_attention_backend("triton", device="cuda"), TritonAttention)
        assert isinstance(get_attention_backend("auto", device="cuda"), want)
    # The model's shape, dtype included; by name: not probed; no model: a small shape.
    small = AttentionShape(
        num_heads=4, num_kv_heads=2, head_dim=64, block_size=16, dtype=torch.bfloat16
    )
    assert probe.call_args_list == [mock.call(cuda0, MODEL), mock.call(cuda0, small)]


def test_the_probe_splits_its_decodes_so_the_merge_compiles_too() -> None:
    from engine.attention.triton_probe import _QUERY_LENS, _SEQ_LENS, probe_backends

    split, unsplit = probe_backends()
    decodes = sum(n == 1 for n in _QUERY_LENS)
    longest = max(s for q, s in zip(_QUERY_LENS, _SEQ_LENS, strict=True) if q == 1)
    for kv_heads in (1, 8, 64):
        programs, cpu = decodes * kv_heads, torch.device("cpu")
        assert split.partitions(num_programs=programs, max_len=longest, device=cpu)[0] >= 3
        assert unsplit.partitions(num_programs=programs, max_len=longest, device=cpu)[0] == 1


def test_the_triton_probe_falls_back_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    # Real kernels, real failure: on this CPU they cannot run outside the interpreter.
    pytest.importorskip("triton", reason="triton is not installed: pip install 'kvgov[triton]'")
    from engine.attention import triton_kernels
    from engine.attention.triton_probe import triton_runs_on

    if triton_kernels.INTERPRETED:
        pytest.skip("this process runs Triton's interpreter (TRITON_INTERPRET=1)")
    shape = AttentionShape(
        num_heads=6, num_kv_heads=2, head_dim=80, block_size=32, dtype=torch.float32
    )
    with caplog.at_level(logging.INFO, logger="engine.attention.triton_probe"):
        assert triton_runs_on(torch.device("cpu"), shape) is False
    (record,) = caplog.records  # exactly one line, naming the shape and the reason
    message = record.getMessage()
    assert record.levelno == logging.WARNING and "\n" not in message
    assert "using the SDPA path" in message and "TRITON_INTERPRET=1" in message
    assert "head_dim 80, 6 query / 2 kv heads, blocks of 32, torch.float32" in message
