"""An engine's parts, assembled from its ``EngineConfig``: the device, model and tokenizer,
the KV pool sized on the device and on the host, and the block manager, scheduler and model
runner over that pool, warmed up before the first step.

The parts share one ``KVCache`` and one ``BlockManager``. Where decode graphs run, the
pool's last block is the scratch their padding rows write, and the block manager never
hands it out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention.backend import AttentionBackend
from engine.attention.select import get_attention_backend
from engine.attention.shape import AttentionShape
from engine.block_manager import BlockManager
from engine.config import EngineConfig, PreemptionMode
from engine.decode_graphs import set_up_decode_graphs, wants_decode_graphs
from engine.device import default_dtype, resolve_device
from engine.errors import InvalidRequestError
from engine.expandable_segments import enable_expandable_segments
from engine.host_swap import HostSwap, size_host_swap
from engine.kernel_warmup import warm_up_attention
from engine.kv_cache import KVCache
from engine.loader import free_bytes, load_parts, num_kv_blocks, read_model_config
from engine.memory_profile import profile_largest_step
from engine.model_config import ModelConfig
from engine.model_runner import ModelRunner
from engine.models.llama import LlamaForCausalLM
from engine.scheduler import Scheduler
from engine.step_threads import StepThreads
from engine.tokenizer import Tokenizer

__all__ = ["EngineParts", "assemble"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True, slots=True)
class EngineParts:
    """What ``Engine`` runs on, each part built once from the config."""

    device: torch.device
    dtype: torch.dtype
    attention: AttentionBackend
    model_config: ModelConfig
    model: LlamaForCausalLM
    tokenizer: Tokenizer
    max_model_len: int
    host_swap: HostSwap
    kv_cache: KVCache
    block_manager: BlockManager
    scheduler: Scheduler
    runner: ModelRunner


def assemble(config: EngineConfig) -> EngineParts:
    """Load the model and tokenizer, size the KV pool and build what runs over it."""
    device = resolve_device(config.device)
    dtype = _DTYPES[config.dtype] if config.dtype else default_dtype(device)
    if device.type == "cuda":
        # Before the weights take their segments; a build without them says so here.
        enable_expandable_segments(device=device)
    shape = AttentionShape.of(read_model_config(config), block_size=config.block_size, dtype=dtype)
    attention = get_attention_backend(config.attention, device=device, shape=shape)
    model_config, model, tokenizer = load_parts(
        config, attention=attention, device=device, dtype=dtype
    )
    model.eval()
    max_model_len = config.max_model_len or model_config.max_position_embeddings
    bytes_per_block = model_config.kv_bytes_per_token(dtype) * config.block_size
    num_blocks = num_kv_blocks(
        config,
        device=device,
        bytes_per_block=bytes_per_block,
        profile=lambda: profile_largest_step(model, config),
    )
    host_swap = size_host_swap(
        config,
        bytes_per_block=bytes_per_block,
        max_model_len=max_model_len,
        host_available_bytes=free_bytes(torch.device("cpu")),
    )
    kv_cache = KVCache(
        num_layers=model_config.num_layers,
        num_blocks=num_blocks,
        block_size=config.block_size,
        num_kv_heads=model_config.num_kv_heads,
        head_dim=model_config.head_dim,
        num_host_blocks=host_swap.num_blocks,
        dtype=dtype,
        device=device,
    )
    graphs = wants_decode_graphs(config.decode_graphs, attention, device)
    if graphs and num_blocks < 2:
        raise InvalidRequestError("decode graphs need 2 KV blocks or more (one is scratch)")
    block_manager = BlockManager(
        num_blocks=num_blocks - 1 if graphs else num_blocks,
        block_size=config.block_size,
        num_host_blocks=kv_cache.num_host_blocks,
        enable_prefix_caching=config.enable_prefix_caching,
    )
    scheduler = Scheduler(
        block_manager=block_manager,
        kv_cache=kv_cache,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        allow_swap=config.preemption_mode is PreemptionMode.SWAP,
    )
    runner = ModelRunner(
        model=model,
        attention=attention,
        kv_cache=kv_cache,
        block_manager=block_manager,
        threads=StepThreads() if device.type == "cpu" and config.adapt_cpu_threads else None,
    )
    warm_up_attention(runner, max_len=max_model_len)  # before the first step
    if graphs:  # after the warm-up: every kernel a graph records is compiled by then
        runner.graphs = set_up_decode_graphs(
            mode=config.decode_graphs,
            model=model,
            kv_cache=kv_cache,
            max_num_seqs=config.max_num_seqs,
            max_model_len=max_model_len,
            scratch_block=num_blocks - 1,
        )
    return EngineParts(
        device=device,
        dtype=dtype,
        attention=attention,
        model_config=model_config,
        model=model,
        tokenizer=tokenizer,
        max_model_len=max_model_len,
        host_swap=host_swap,
        kv_cache=kv_cache,
        block_manager=block_manager,
        scheduler=scheduler,
        runner=runner,
    )
