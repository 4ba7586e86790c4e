"""The Hugging Face ``tokenizers`` backend (a model folder's tokenizer.json)."""

from __future__ import annotations

from collections.abc import Sequence

import tokenizers

from engine.tokenizers.stream import IncrementalDecoder, WindowStreamDecoder

__all__ = ["HFBackend"]


class HFBackend:
    """A ``tokenizers.Tokenizer``, with padding and truncation switched off.

    A tokenizer.json may carry padding or truncation settings from training; left on,
    they would change the ids and the counts the engine relies on.
    """

    __slots__ = ("_tokenizer", "_vocab_size")

    def __init__(self, tokenizer: tokenizers.Tokenizer) -> None:
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self._tokenizer = tokenizer
        self._vocab_size = max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1) + 1

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool) -> str:
        # tokenizers skips ids it does not know, but ids past 2**32 overflow its u32.
        known = [i for i in ids if i < self._vocab_size]
        return self._tokenizer.decode(known, skip_special_tokens=skip_special_tokens)

    def stream_decoder(self, *, skip_special_tokens: bool) -> IncrementalDecoder:
        return WindowStreamDecoder(
            lambda ids: self.decode(ids, skip_special_tokens=skip_special_tokens)
        )

    def token_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)
