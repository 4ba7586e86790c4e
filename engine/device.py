"""Where the engine's tensors live and which dtype they default to.

``resolve_device`` turns what a caller asked for ("auto", "cpu", "cuda:1", a
``torch.device``) into a concrete device that exists on this machine, and fails up
front with :class:`~engine.errors.InvalidRequestError` when it does not, rather
than deep inside the first allocation. ROCm builds of torch expose AMD GPUs as
``torch.cuda`` (with ``torch.version.hip`` set), so "cuda" covers both vendors.
"""

from __future__ import annotations

import functools

import torch

from engine.errors import InvalidRequestError

__all__ = ["bf16_matrix_units", "default_dtype", "multiprocessors", "resolve_device"]


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
    """float32 on CPU; on a GPU, bfloat16 where it has bfloat16 matrix instructions,
    else float16 (``bf16_matrix_units``).

    bfloat16 keeps float32's exponent range (no overflow in long-context logits); a
    card without bfloat16 matrix units only emulates it, slowly, so it gets float16.
    """
    resolved = resolve_device(device)
    if resolved.type != "cuda":
        return torch.float32
    props = torch.cuda.get_device_properties(resolved)
    if torch.version.hip:
        fast = bf16_matrix_units(hip_arch=props.gcnArchName)
    else:
        fast = bf16_matrix_units(cuda_capability=(props.major, props.minor))
    return torch.bfloat16 if fast else torch.float16


# ROCm architectures with bfloat16 matrix instructions: CDNA2 (MI200, gfx90a), CDNA3
# (MI300, gfx940-942), CDNA4 (MI350, gfx950); RDNA3 (gfx11xx, WMMA) and RDNA4 (gfx12xx).
# Not CDNA1 (MI100, gfx908), Vega (gfx906) or RDNA1/2 (gfx10xx).
_BF16_HIP_ARCHS = ("gfx90a", "gfx94", "gfx95", "gfx11", "gfx12")


def bf16_matrix_units(
    *, cuda_capability: tuple[int, int] | None = None, hip_arch: str | None = None
) -> bool:
    """Whether a GPU has bfloat16 matrix instructions: CUDA sm80 (Ampere) and later, or a
    ROCm architecture (``gcnArchName``, e.g. ``"gfx1201"`` or ``"gfx942:sramecc+:xnack-"``)
    of CDNA2 and later or RDNA3 and later."""
    if cuda_capability is not None:
        return cuda_capability >= (8, 0)
    if hip_arch is not None:
        return hip_arch.split(":")[0].startswith(_BF16_HIP_ARCHS)
    raise TypeError("pass cuda_capability or hip_arch")


@functools.cache
def multiprocessors(index: int) -> int:
    """Streaming multiprocessors (NVIDIA) or compute units (AMD) of GPU ``index``, read
    once: how many programs a kernel needs to fill the card."""
    return torch.cuda.get_device_properties(index).multi_processor_count
