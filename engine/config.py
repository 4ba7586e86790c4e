"""Engine configuration: which model, where, and how much KV cache."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from engine.errors import InvalidRequestError
from engine.quantization.scheme import parse_quantization

__all__ = ["EngineConfig", "PreemptionMode"]


class PreemptionMode(Enum):
    SWAP = "swap"  # swap to host while swap space lasts, then recompute
    RECOMPUTE = "recompute"  # always free and recompute later


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """KV capacity is set by at most one of ``num_blocks``, ``kv_cache_bytes`` or
    ``kv_cache_fraction`` (of free device memory); with none set, 256 MiB on CPU, and on a
    GPU ``gpu_memory_utilization`` of the card less what is in use and what the largest
    step peaks at, measured by a dummy step (``engine.memory_profile``).

    Host swap (the pool that swapped and offloaded blocks move to) is set by
    ``swap_space_blocks``, else ``swap_space_bytes`` (0: none), taken exactly; with
    neither, it is sized from the model (``engine.host_swap``): enough for
    max(32,768, max_model_len) tokens of its KV (4 GiB for an 8B model in bf16, vLLM's
    default ``--swap-space``), at most a quarter of the host's available memory, never
    under 64 MiB (the former fixed default)."""

    model: str = "tiny-random"  # a preset name or a local Hugging Face folder
    tokenizer: str | None = None  # "tiktoken:<encoding>" or a folder; None: the model's own
    device: str = "auto"
    dtype: str | None = None  # "float32" | "bfloat16" | "float16"; None: per device
    # Weight-only "int8" | "int4" (group-wise round-to-nearest at load); None: full precision
    quantize: str | None = None
    block_size: int = 16
    num_blocks: int | None = None
    kv_cache_bytes: int | None = None
    kv_cache_fraction: float | None = None
    gpu_memory_utilization: float = 0.9  # of the card's total, for everything the engine holds
    # The host pool for swapped and offloaded blocks, in blocks (each holds block_size
    # tokens of every layer: a 9B model's 16-token block is about 2.2 MB, so 64 MiB is
    # only about 480 tokens), else in bytes; both None: sized from the model.
    swap_space_blocks: int | None = None
    swap_space_bytes: int | None = None
    preemption_mode: PreemptionMode = PreemptionMode.SWAP
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048  # per-step token budget (chunked prefill)
    max_model_len: int | None = None  # None: the model's maximum positions
    enable_prefix_caching: bool = True
    attention: str = "auto"  # one of engine.attention.ATTENTION_BACKENDS; auto picks per device
    # Decode steps as CUDA/HIP graphs (engine.decode_graphs): "auto" on a GPU with Triton
    # attention, "off" never (vLLM's enforce_eager), "eager" their static path uncaptured.
    decode_graphs: str = "auto"
    seed: int = 0  # for the random weights of presets
    # CPU: run steps on one thread while they are faster so (other processes holding the
    # cores make every OpenMP region wait); False keeps torch's thread count throughout.
    adapt_cpu_threads: bool = True

    def __post_init__(self) -> None:
        sizing = [self.num_blocks, self.kv_cache_bytes, self.kv_cache_fraction]
        if sum(value is not None for value in sizing) > 1:
            raise InvalidRequestError(
                "set at most one of num_blocks, kv_cache_bytes and kv_cache_fraction"
            )
        if not isinstance(self.adapt_cpu_threads, bool):
            raise InvalidRequestError(
                f"adapt_cpu_threads must be True or False, got {self.adapt_cpu_threads!r}"
            )
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidRequestError(f"{name} must be a positive int, got {value!r}")
        if self.swap_space_blocks is not None and (
            not isinstance(self.swap_space_blocks, int) or self.swap_space_blocks < 0
        ):
            raise InvalidRequestError(
                f"swap_space_blocks must be an int >= 0 (0: no swap space), got "
                f"{self.swap_space_blocks!r}"
            )
        for name in ("num_blocks", "kv_cache_bytes", "max_model_len"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise InvalidRequestError(f"{name} must be a positive int, got {value!r}")
        swap_bytes = self.swap_space_bytes
        if swap_bytes is not None and (
            not isinstance(swap_bytes, int) or isinstance(swap_bytes, bool) or swap_bytes < 0
        ):
            raise InvalidRequestError(
                f"swap_space_bytes must be an int >= 0 (0: no swap space; None: sized from "
                f"the model), got {swap_bytes!r}"
            )
        fraction = self.kv_cache_fraction
        if fraction is not None and not 0 < fraction <= 1:
            raise InvalidRequestError(f"kv_cache_fraction must be in (0, 1], got {fraction}")
        parse_quantization(self.quantize)  # refuses anything but None, "int8" and "int4"
        utilization = self.gpu_memory_utilization
        if not isinstance(utilization, (int, float)) or not 0 < utilization <= 1:
            raise InvalidRequestError(
                f"gpu_memory_utilization must be in (0, 1], got {utilization!r}; it is the "
                "share of the card's total memory the engine may take (0.9 leaves 10%)"
            )
        if self.dtype not in (None, "float32", "bfloat16", "float16"):
            raise InvalidRequestError(
                f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}"
            )
