"""Decoder models that run over the paged KV cache."""

from engine.models.llama import LlamaForCausalLM, RMSNorm
from engine.models.rope import RotaryEmbedding, apply_rotary, rope_inv_freq

__all__ = ["LlamaForCausalLM", "RMSNorm", "RotaryEmbedding", "apply_rotary", "rope_inv_freq"]
