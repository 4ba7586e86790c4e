"""What an engine is built from: the model, its tokenizer, and the size of its KV pool.

A preset (``engine.presets``) is built in memory; anything else must be a local Hugging
Face folder (``config.json``, ``*.safetensors``, the tokenizer's files). The pool takes
``num_blocks`` when set, else ``kv_cache_bytes`` (refused when it is more than the memory
free on the device), else ``kv_cache_fraction`` of the memory free on the device; with
none of them, on a GPU what profiling the largest step leaves of
``gpu_memory_utilization`` of the card (``engine.memory_profile``), and 256 MiB on a CPU.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from engine.attention.backend import AttentionBackend
from engine.config import EngineConfig
from engine.errors import InvalidRequestError, ModelConfigError, WeightsDoNotFitError
from engine.memory_profile import MemoryProfile
from engine.model_config import ModelConfig
from engine.models.llama import LlamaForCausalLM
from engine.presets import PRESETS, build_preset_model
from engine.quantization.scheme import WeightQuantization, parse_quantization
from engine.quantization.triton_probe import choose_matmul_kernel
from engine.tokenizer import Tokenizer, load_tokenizer
from engine.weights import load_model

__all__ = ["check_weights_fit", "free_bytes", "load_parts", "num_kv_blocks", "read_model_config"]

_CPU_DEFAULT_KV_BYTES = 256 << 20


def read_model_config(config: EngineConfig) -> ModelConfig:
    """The model's config, from a preset or a local folder's ``config.json``."""
    if config.model in PRESETS:
        return PRESETS[config.model].config
    if not os.path.exists(config.model):
        raise ModelConfigError(
            f"{config.model!r} is neither a preset ({', '.join(PRESETS)}) nor an "
            "existing folder; pass a preset name or a local Hugging Face model folder"
        )
    return ModelConfig.from_pretrained(config.model)


def load_parts(
    config: EngineConfig,
    *,
    attention: AttentionBackend,
    device: torch.device,
    dtype: torch.dtype,
) -> tuple[ModelConfig, LlamaForCausalLM, Tokenizer]:
    """The model config, weights and tokenizer, from a preset or a local folder. A
    quantized model's layers take the Triton kernel where it runs for them
    (``choose_matmul_kernel``)."""
    quantization = parse_quantization(config.quantize)
    model_config = read_model_config(config)
    check_weights_fit(config.model, model_config, device, dtype, quantization)
    if config.model in PRESETS:
        model = build_preset_model(
            config.model,
            attention=attention,
            device=device,
            dtype=dtype,
            seed=config.seed,
            quantization=quantization,
        )
        tokenizer = load_tokenizer(config.tokenizer or PRESETS[config.model].tokenizer)
    else:
        model = load_model(
            config.model,
            attention=attention,
            device=device,
            dtype=dtype,
            quantization=quantization,
        )
        tokenizer = load_tokenizer(config.tokenizer or config.model)
    if quantization is not None:
        choose_matmul_kernel(model, device=device)
    return model_config, model, tokenizer


def check_weights_fit(
    name: str,
    model_config: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
    quantization: WeightQuantization | None,
) -> None:
    """Refuse weights that cannot fit in the memory free on ``device`` before any is
    allocated. The bound is low on purpose (quantized projections without their scales,
    no buffers): a model this refuses could never load, and one it lets through may
    still run short of room for its KV, which the pool's sizing reports."""
    projections = model_config.num_projection_weights()
    rest = model_config.num_parameters() - projections
    bits = dtype.itemsize * 8 if quantization is None else quantization.bits
    needed = rest * dtype.itemsize + projections * bits // 8
    available = free_bytes(device)
    if needed > available:
        raise WeightsDoNotFitError(
            name,
            needed=needed,
            available=available,
            device=str(device),
            dtype=str(dtype).removeprefix("torch."),
        )


def free_bytes(device: torch.device, *, meminfo: str = "/proc/meminfo") -> int:
    """Memory free for new tensors on ``device``: the GPU's free memory, or the host's
    ``MemAvailable`` (free pages and the caches the kernel would give back: ``MemFree``
    alone leaves out the page cache, most of a busy host's memory), else its free pages
    where ``meminfo`` cannot be read."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open(meminfo, encoding="ascii") as lines:
            fields = [line.split() for line in lines if line.startswith("MemAvailable:")]
        return int(fields[0][1]) * 1024
    except (OSError, ValueError, IndexError):  # not Linux: the free pages
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def num_kv_blocks(
    config: EngineConfig,
    *,
    device: torch.device,
    bytes_per_block: int,
    profile: Callable[[], MemoryProfile] | None = None,
) -> int:
    """The KV pool's size in blocks, from the config or the memory the device has free.

    ``profile`` measures the largest step on a GPU (``engine.memory_profile``); it runs
    only when the config gives no size.
    """
    if config.num_blocks is not None:
        return config.num_blocks
    if config.kv_cache_bytes is not None:
        nbytes = config.kv_cache_bytes
        available = free_bytes(device)
        if nbytes > available:  # refused here, not by the allocator half-way through
            raise InvalidRequestError(
                f"the KV cache is asked for {nbytes / 1e9:.1f} GB (kv_cache_bytes; kvgov "
                f"serve's --kv-budget, where a bare number is MiB) but {device} has "
                f"{available / 1e9:.1f} GB free; ask for less, or for kv_cache_fraction, a "
                "share of what is free"
            )
    elif config.kv_cache_fraction is not None:
        nbytes = int(free_bytes(device) * config.kv_cache_fraction)
    elif device.type == "cuda":
        assert profile is not None, "a GPU without a configured KV size needs a profile"
        nbytes = profile().kv_bytes
    else:
        nbytes = _CPU_DEFAULT_KV_BYTES
    num_blocks = nbytes // bytes_per_block
    if num_blocks < 1:
        raise InvalidRequestError(
            f"the KV cache gets {nbytes} bytes but one block needs {bytes_per_block}; "
            "give it more memory or a smaller block_size"
        )
    return num_blocks
