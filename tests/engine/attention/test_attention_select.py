"""Choosing an attention backend by name and device."""

from __future__ import annotations

import pytest
import torch

from engine.attention import ReferenceAttention
from engine.attention.gather import GatherAttention
from engine.attention.paged import PagedAttention
from engine.attention.select import ATTENTION_BACKENDS, get_attention_backend
from engine.attention.triton_attention import TritonAttention, triton_available
from engine.errors import InvalidRequestError


@pytest.mark.parametrize("name", ["auto", "fast", "paged"])
def test_the_fast_backend_on_cpu_is_paged(name: str) -> None:
    assert isinstance(get_attention_backend(name, device="cpu"), PagedAttention)
    assert isinstance(get_attention_backend(name, device=torch.device("cpu")), PagedAttention)


def test_named_backends() -> None:
    assert isinstance(get_attention_backend("reference", device="cpu"), ReferenceAttention)
    assert isinstance(get_attention_backend("gather", device="cpu"), GatherAttention)
    assert get_attention_backend(device="cpu").name == "paged"


def test_each_call_returns_a_new_backend() -> None:
    # A backend holds its step's plan: two models must not share one by accident.
    assert get_attention_backend(device="cpu") is not get_attention_backend(device="cpu")


def test_an_unknown_name_says_which_names_exist() -> None:
    with pytest.raises(InvalidRequestError, match="flash") as info:
        get_attention_backend("flash", device="cpu")
    for name in ATTENTION_BACKENDS:
        assert name in str(info.value)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["auto", "fast"])
def test_the_fast_backend_on_a_gpu_is_triton_or_gathers_for_sdpa(name: str) -> None:
    want = TritonAttention if triton_available() else GatherAttention
    assert isinstance(get_attention_backend(name, device="cuda"), want)
