"""Where the Triton kernels' tests run: compiled on a GPU, interpreted on a CPU.

Triton's interpreter is chosen when triton is first imported (``TRITON_INTERPRET=1``:
its own library, ``tl.zeros``, ``tl.max`` and the rest, is wrapped then), and importing
``torch.nn.attention`` imports triton (torch._dynamo checks for it), so in a test run
that imports the engine the choice is made long before any test module could set the
variable. A kernel test module on a CPU therefore runs itself again in a child process
started with ``TRITON_INTERPRET=1`` (``interpreter_command``; ``interpreter_child``
starts it when collection ends); the variable reaches no other test and no other process.
"""

from __future__ import annotations

import os
import sys
from enum import Enum
from pathlib import Path

import torch

from tests.background import Child

__all__ = ["Where", "interpreter_child", "interpreter_command", "kernel_device"]

ROOT = Path(__file__).resolve().parents[2]


class Where(Enum):
    GPU = "gpu"  # compiled, on the GPU torch sees
    HERE = "here"  # interpreted in this process: TRITON_INTERPRET=1 was set at its start
    CHILD = "child"  # interpreted in a child process
    NOWHERE = "nowhere"  # triton is not installed


def kernel_device() -> Where:
    from engine.attention.triton_attention import triton_available

    if not triton_available():
        return Where.NOWHERE
    if torch.cuda.is_available():
        return Where.GPU
    if os.environ.get("TRITON_INTERPRET") == "1":
        from engine.attention import triton_kernels

        if triton_kernels.INTERPRETED:
            return Where.HERE
    return Where.CHILD


NO_TRITON = "triton is not installed: pip install 'kvgov[triton]' (the dev extra has it)"


def interpreter_command(test_file: str) -> tuple[list[str], dict[str, str], Path]:
    """argv, environment and directory that run ``test_file`` under the interpreter."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    argv = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", test_file]
    return argv, env, ROOT


def interpreter_child(test_file: str, *, timeout_s: float) -> Child | None:
    """``test_file`` again under the interpreter, as a background child
    (``tests/background.py``: started when collection ends); ``None`` where this process
    runs the kernels itself (a GPU, or the interpreter's own run) or cannot (no triton)."""
    if kernel_device() is not Where.CHILD:
        return None
    argv, env, cwd = interpreter_command(test_file)
    return Child(argv, env, cwd, timeout_s=timeout_s)
