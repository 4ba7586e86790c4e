"""Where the engine's tensors live and which dtype they default to.

``resolve_device`` turns what a caller asked for ("auto", "cpu", "cuda:1", a
``torch.device``) into a concrete device that exists on this machine, and fails up
front with :class:`~engine.errors.InvalidRequestError` when it does not, rather
than deep inside the first allocation. ROCm builds of torch expose AMD GPUs as
``torch.cuda`` (with ``torch.version.hip`` set), so "cuda" covers both vendors.
"""

from __future__ import annotations

import torch

from engine.errors import InvalidRequestError

__all__ = ["default_dtype", "resolve_device"]


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """Return a concrete, available device; "auto" prefers CUDA/ROCm, then CPU.

    A bare "cuda" is pinned to the current GPU index so that ``cache.device ==
    tensor.device`` comparisons hold (tensors always carry an index).
    """
    if isinstance(device, str) and device.strip().lower() == "auto":
        return resolve_device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InvalidRequestError(
            f"unknown device {device!r}; pass 'auto', 'cpu', 'cuda' or 'cuda:N'"
        ) from exc

    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise InvalidRequestError(
                f"device {device!r} was requested but no CUDA/ROCm GPU is usable "
                f"(torch {torch.__version__}); pass device='auto' or 'cpu', or install a "
                "CUDA or ROCm build of torch on a machine with a GPU"
            )
        count = torch.cuda.device_count()
        index = torch.cuda.current_device() if resolved.index is None else resolved.index
        if not 0 <= index < count:
            raise InvalidRequestError(
                f"device {device!r} does not exist: this machine has {count} GPU(s), "
                f"cuda:0 to cuda:{count - 1}; pick one of those or pass device='auto'"
            )
        return torch.device("cuda", index)

    if resolved.type != "cpu":
        # Other backends (xpu, mps, ...) expose torch.<type>.is_available() when built in.
        is_available = getattr(getattr(torch, resolved.type, None), "is_available", None)
        if callable(is_available) and not is_available():
            raise InvalidRequestError(
                f"device {device!r} is not available in this torch build or on this "
                "machine; pass device='auto' or 'cpu'"
            )
    return resolved


def default_dtype(device: str | torch.device) -> torch.dtype:
    """float32 on CPU; bfloat16 on GPUs that run it natively, else float16.

    bfloat16 keeps float32's exponent range (no overflow in long-context logits);
    pre-Ampere NVIDIA GPUs only emulate it, slowly, so they get float16.
    """
    resolved = resolve_device(device)
    if resolved.type != "cuda":
        return torch.float32
    if torch.version.hip or torch.cuda.get_device_properties(resolved).major >= 8:
        return torch.bfloat16
    return torch.float16
