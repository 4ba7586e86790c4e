"""``local_counter``: the ``TokenCounter`` of the tokenizer a user names for a server that
cannot count (no ``/tokenize``, as ``transformers serve`` and hosted APIs).

Accepted: a ``TokenCounter``; anything with ``encode(text)`` (a transformers tokenizer,
whose chat template then counts messages exactly); a tiktoken encoding's name.
"""

from __future__ import annotations

from typing import Any

from governor import BackendError, ConfigError, TokenCounter

__all__ = ["local_counter"]


def local_counter(tokenizer: Any, base_url: str, why: BackendError) -> TokenCounter:
    if tokenizer is None:
        raise ConfigError(
            f"the server at {base_url} cannot count tokens ({why}); name the served "
            "model's tokenizer: tokenizer=<a transformers tokenizer, anything with "
            "encode(text), or a tiktoken encoding name>",
            setting="tokenizer",
        )
    if isinstance(tokenizer, TokenCounter):
        return tokenizer
    if isinstance(tokenizer, str):
        return TokenCounter(encoding=tokenizer)
    return TokenCounter(tokenizer=tokenizer)
