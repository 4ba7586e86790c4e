"""What a step-time model reads: a model's shape, one engine step's batch, and a measured
step (``StepSample``), the unit of a step-time grid.

A step computes, for each scheduled sequence, ``num_new_tokens`` tokens (1 for a decode,
a prompt chunk for a prefill) attending over its ``num_context_tokens`` already in the KV
cache plus themselves. Nothing here imports torch: a grid recorded on a GPU is read and
fitted on any machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

    from engine.model_config import ModelConfig
    from engine.scheduler import ScheduledChunk

__all__ = ["ModelShape", "SequenceWork", "StepBatch", "StepSample"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelShape:
    """The dimensions that decide a step's FLOPs and bytes. ``weight_bits``: the
    projections' width as stored (32 float32, 16 bf16/fp16, 8 int8, 4 int4);
    ``activation_bits``: the width everything else (embeddings, norms, KV) is in."""

    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    num_projection_weights: int
    num_parameters: int
    weight_bits: int
    activation_bits: int

    @classmethod
    def from_config(
        cls, config: ModelConfig, *, name: str, activation_bits: int, weight_bits: int | None = None
    ) -> ModelShape:
        return cls(
            name=name,
            num_layers=config.num_layers,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_heads=config.num_heads,
            num_kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
            vocab_size=config.vocab_size,
            num_projection_weights=config.num_projection_weights(),
            num_parameters=config.num_parameters(),
            weight_bits=activation_bits if weight_bits is None else weight_bits,
            activation_bits=activation_bits,
        )

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token across every layer."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.activation_bits // 8

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelShape:
        return cls(**data)


@dataclass(frozen=True, slots=True)
class SequenceWork:
    """One sequence's share of a step."""

    num_new_tokens: int  # computed this step: 1 for a decode, a chunk for a prefill
    num_context_tokens: int  # already in its KV cache before this step

    @property
    def is_decode(self) -> bool:
        return self.num_new_tokens == 1 and self.num_context_tokens > 0


@dataclass(frozen=True, slots=True)
class StepBatch:
    """Every sequence one engine step computes, in the order scheduled."""

    sequences: tuple[SequenceWork, ...]

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.sequences)

    @property
    def num_sequences(self) -> int:
        return len(self.sequences)

    def to_json(self) -> list[list[int]]:
        return [[s.num_new_tokens, s.num_context_tokens] for s in self.sequences]

    @classmethod
    def of_chunks(cls, chunks: Sequence[ScheduledChunk]) -> StepBatch:
        """What the model runner is about to compute for ``chunks``: read before it runs,
        since the engine advances each request's ``num_computed_tokens`` after."""
        return cls(tuple(SequenceWork(c.num_tokens, c.request.num_computed_tokens) for c in chunks))

    @classmethod
    def from_json(cls, data: list[list[int]]) -> StepBatch:
        return cls(tuple(SequenceWork(int(new), int(context)) for new, context in data))


@dataclass(frozen=True, slots=True, kw_only=True)
class StepSample:
    """One measured engine step: its batch, on ``model`` on ``device``, took ``seconds``
    (the forward pass, sampling and the step's own bookkeeping; the median of repeats)."""

    device: str  # the profile name it was measured on ("cpu-here", "h100-sxm", ...)
    model: ModelShape
    batch: StepBatch
    seconds: float
    attention: str = ""  # the attention backend that ran ("sdpa-runs", "triton", ...)

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "model": self.model.name,
            "attention": self.attention,
            "batch": self.batch.to_json(),
            "seconds": self.seconds,
        }
