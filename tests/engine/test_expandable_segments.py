"""Expandable segments: asked for with the setter this torch prefers, never fatal.

This suite runs on a CPU build, whose allocator settings call would change nothing a
test can see, so each test puts a recording setter in its place: one as torch >= 2.10
has it, one as older torch has it (deprecated with a FutureWarning from 2.10), one as a
ROCm build without expandable segments behaves (a UserWarning), one that raises. pytest
turns warnings into errors here, so a warning that escaped would fail the test.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable

import pytest
import torch

from engine.expandable_segments import enable_expandable_segments

SETTING = "expandable_segments:True"
NOT_SUPPORTED = "expandable_segments not supported on this platform"
LOGGER = "engine.expandable_segments"


def _setter(calls: list[str], effect: Callable[[], None] = lambda: None) -> Callable[[str], None]:
    def set_allocator_settings(env: str) -> None:
        calls.append(env)
        effect()

    return set_allocator_settings


def _warns(message: str, category: type[Warning]) -> Callable[[], None]:
    return lambda: warnings.warn(message, category, stacklevel=2)


def _refuses() -> None:
    raise RuntimeError("Unrecognized key 'expandable_segments' in Caching Allocator Config.")


@pytest.fixture
def accelerator_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The accelerator-wide setter replaced by a recording one (it is there on torch 2.13)."""
    calls: list[str] = []
    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", _setter(calls))
    return calls


def _old_torch(monkeypatch: pytest.MonkeyPatch, setter: Callable[[str], None]) -> None:
    """A torch with only the CUDA setter."""
    monkeypatch.delattr(torch._C, "_accelerator_setAllocatorSettings", raising=False)
    monkeypatch.setattr(torch.cuda.memory, "_set_allocator_settings", setter)


def test_the_accelerator_setter_is_preferred_over_the_deprecated_cuda_one(
    monkeypatch: pytest.MonkeyPatch, accelerator_calls: list[str]
) -> None:
    deprecated: list[str] = []
    monkeypatch.setattr(
        torch.cuda.memory,
        "_set_allocator_settings",
        _setter(deprecated, _warns("use the accelerator setter", FutureWarning)),
    )
    assert enable_expandable_segments() is True
    assert accelerator_calls == [SETTING] and deprecated == []


def test_a_deprecated_setter_still_sets_and_its_future_warning_stays_inside(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    _old_torch(monkeypatch, _setter(calls, _warns("_set_allocator_settings", FutureWarning)))
    assert enable_expandable_segments() is True
    assert calls == [SETTING]


def test_a_rocm_build_without_expandable_segments_is_off_and_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(
        torch._C,
        "_accelerator_setAllocatorSettings",
        _setter(calls, _warns(NOT_SUPPORTED, UserWarning)),
    )
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert enable_expandable_segments() is False
    assert calls == [SETTING]
    assert [r.getMessage() for r in caplog.records] == [
        f"expandable segments are off: {NOT_SUPPORTED}"
    ]


def test_the_warning_at_the_allocators_first_read_is_caught_too(
    monkeypatch: pytest.MonkeyPatch, accelerator_calls: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A ROCm build warns where the allocator next reads the setting, not in the setter:
    the allocation on ``device`` brings that read inside the call."""
    allocate = torch.empty

    def empty_on_rocm(*args: object, **kwargs: object) -> torch.Tensor:
        warnings.warn(NOT_SUPPORTED, UserWarning, stacklevel=2)
        return allocate(*args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(torch, "empty", empty_on_rocm)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert enable_expandable_segments(device=torch.device("cpu")) is False
    assert accelerator_calls == [SETTING]
    assert NOT_SUPPORTED in caplog.text


def test_a_setter_that_raises_leaves_them_off_and_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []
    _old_torch(monkeypatch, _setter(calls, _refuses))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert enable_expandable_segments() is False
    assert calls == [SETTING]
    assert len(caplog.records) == 1
    assert "the allocator refused them (Unrecognized key" in caplog.records[0].getMessage()


def test_a_torch_without_either_setter_leaves_them_off_and_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delattr(torch._C, "_accelerator_setAllocatorSettings", raising=False)
    monkeypatch.delattr(torch.cuda.memory, "_set_allocator_settings", raising=False)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert enable_expandable_segments() is False
    assert "no allocator settings call" in caplog.text
