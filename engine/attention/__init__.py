"""Paged attention: the metadata contract, the backend protocol and the kernels."""

from engine.attention.backend import AttentionBackend
from engine.attention.gather import GatherAttention
from engine.attention.metadata import AttentionMetadata
from engine.attention.paged import PagedAttention
from engine.attention.reference import ReferenceAttention, write_kv
from engine.attention.select import ATTENTION_BACKENDS, get_attention_backend
from engine.attention.shape import AttentionShape
from engine.attention.triton_attention import TritonAttention

__all__ = [
    "ATTENTION_BACKENDS",
    "AttentionBackend",
    "AttentionMetadata",
    "AttentionShape",
    "GatherAttention",
    "PagedAttention",
    "ReferenceAttention",
    "TritonAttention",
    "get_attention_backend",
    "write_kv",
]
