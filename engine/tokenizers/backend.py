"""The contract between ``Tokenizer`` and its backends, and what a loader hands back."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from engine.tokenizers.stream import IncrementalDecoder

__all__ = ["TokenizerBackend", "TokenizerParts"]


class TokenizerBackend(Protocol):
    """Text to ids and back. Ids that name no token decode to nothing."""

    @property
    def vocab_size(self) -> int:
        """One more than the largest token id: the rows an embedding needs."""
        ...

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]: ...

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool) -> str: ...

    def stream_decoder(self, *, skip_special_tokens: bool) -> IncrementalDecoder: ...

    def token_id(self, token: str) -> int | None:
        """The id of the vocabulary entry spelled ``token`` (e.g. ``"<|im_end|>"``), else None."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenizerParts:
    """Everything a loader found: the backend plus what the config files said about it.

    ``chat_templates`` maps template names to Jinja sources (``"default"``, ``"tool_use"``);
    ``special_tokens`` maps template variables such as ``bos_token`` to token text.
    """

    name: str
    backend: TokenizerBackend
    eos_token_ids: frozenset[int]
    bos_token_id: int | None = None
    chat_templates: Mapping[str, str] = field(default_factory=dict)
    special_tokens: Mapping[str, str] = field(default_factory=dict)
