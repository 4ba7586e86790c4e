"""The governor package's public surface and its promise not to load torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

import governor
from governor import ConfigError, GenerationRequest


def test_importing_governor_loads_neither_torch_nor_the_engine() -> None:
    code = "import sys, governor; print('torch' in sys.modules, 'engine' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_every_public_name_resolves() -> None:
    for name in governor.__all__:
        assert getattr(governor, name) is not None


def test_a_request_needs_exactly_one_of_messages_and_prompt() -> None:
    with pytest.raises(ConfigError, match="exactly one"):
        GenerationRequest()
    with pytest.raises(ConfigError, match="exactly one"):
        GenerationRequest(prompt="hi", messages=[{"role": "user", "content": "hi"}])
    assert GenerationRequest(prompt="hi").max_tokens == 256
