"""Paged attention: the metadata contract, the backend protocol and the kernels."""

from engine.attention.backend import AttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.attention.reference import ReferenceAttention, write_kv

__all__ = ["AttentionBackend", "AttentionMetadata", "ReferenceAttention", "write_kv"]
