"""Expandable segments for the CUDA/ROCm caching allocator, asked for and never required.

With ``expandable_segments`` the allocator grows a segment in place instead of reserving
a new one, so the KV pool and a step's buffers coming and going (``engine.memory_profile``)
leave fewer fragmented blocks. The engine runs correctly without it, so asking is best
effort: ``enable_expandable_segments`` never raises and lets no warning out (the tests
turn warnings into errors), says whether the setting took, and logs one line saying why
when it did not.

Torch has moved the setter. Newer builds take the accelerator-wide
``torch._C._accelerator_setAllocatorSettings``, and torch >= 2.10 deprecates the CUDA one,
``torch.cuda.memory._set_allocator_settings``, with a FutureWarning (it still forwards the
setting); older builds have the CUDA one only. A ROCm build without the driver API for
expandable segments accepts the setting and warns "expandable_segments not supported on
this platform" (a UserWarning, ``TORCH_WARN_ONCE`` in c10's allocator config) the first
time the allocator reads it, at its next allocation, and then ignores it: so a device
given here gets one small allocation while the warnings are caught.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable

import torch

__all__ = ["enable_expandable_segments"]

logger = logging.getLogger(__name__)

_SETTING = "expandable_segments:True"


def enable_expandable_segments(*, device: torch.device | None = None) -> bool:
    """Ask the caching allocator for expandable segments; True when the setting took.

    ``device`` (CUDA or ROCm): allocate one element there before returning, so a build
    that cannot honour the setting says so now rather than at the weights' first
    allocation. Its warning comes once a process: after that a second call cannot tell,
    and returns True.
    """
    setter = _allocator_setter()
    if setter is None:
        logger.info("expandable segments are off: this torch has no allocator settings call")
        return False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            setter(_SETTING)
            if device is not None:
                torch.empty(1, device=device)  # the allocator reads the setting here
        except RuntimeError as exc:  # e.g. a build that rejects the key
            logger.info("expandable segments are off: the allocator refused them (%s)", exc)
            return False
    # A deprecation is about the call, not the setting: the deprecated setter forwards it.
    refusals = [
        w for w in caught if not issubclass(w.category, (DeprecationWarning, FutureWarning))
    ]
    if refusals:
        logger.info("expandable segments are off: %s", refusals[0].message)
        return False
    return True


def _allocator_setter() -> Callable[[str], object] | None:
    """The accelerator-wide setter where this torch has it, else the CUDA one, else None."""
    setter: Callable[[str], object] | None = getattr(
        torch._C, "_accelerator_setAllocatorSettings", None
    )
    if setter is None:
        setter = getattr(torch.cuda.memory, "_set_allocator_settings", None)
    return setter
