"""``RemoteTokenizer``: counts exactly as ``kvgov serve`` does, mostly without asking it.

``GET /kvgov/v1/tokenizer`` names the server's tokenizer once. A tiktoken encoding is
loaded here and text is encoded locally with the same rule as the engine (every special
token allowed): the same ids, no round trip. Chat messages go through the server's chat
template, so they are counted by ``POST /kvgov/v1/count``, each distinct conversation
once (an LRU cache: a governor counts the same conversation again at every turn). A
tokenizer of another kind counts text through ``/count`` too.

Handed to ``governor.TokenCounter(tokenizer=...)``: ``count_chat_tokens`` makes the
counter use it for messages, as it uses the engine's own tokenizer in process.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tiktoken

__all__ = ["RemoteTokenizer"]

_CACHED_COUNTS = 4_096

Count = Callable[[Mapping[str, Any]], int]  # a /count body -> tokens


class RemoteTokenizer:
    """``encode`` and ``count_chat_tokens`` as the server's tokenizer; thread-safe."""

    def __init__(self, info: Mapping[str, Any], count: Count) -> None:
        self._count = count
        self._lock = threading.Lock()
        self._counts: OrderedDict[str, int] = OrderedDict()
        encoding = info.get("encoding") if info.get("kind") == "tiktoken" else None
        self._encoding = tiktoken.get_encoding(encoding) if encoding else None
        self.name = f"tiktoken:{encoding}" if encoding else "remote"

    def encode(self, text: str) -> list[int]:
        if self._encoding is not None:
            return self._encoding.encode(text, allowed_special="all")
        # Only the count is known without the ids; TokenCounter needs no more of them.
        return [0] * self._cached({"text": text})

    def count_chat_tokens(self, messages: Sequence[Mapping[str, Any]]) -> int:
        return self._cached({"messages": [dict(message) for message in messages]})

    def _cached(self, body: Mapping[str, Any]) -> int:
        key = json.dumps(body, sort_keys=True, ensure_ascii=False, default=str)
        with self._lock:
            tokens = self._counts.get(key)
            if tokens is not None:
                self._counts.move_to_end(key)
                return tokens
        tokens = self._count(body)  # outside the lock: a round trip
        with self._lock:
            self._counts[key] = tokens
            if len(self._counts) > _CACHED_COUNTS:
                self._counts.popitem(last=False)
        return tokens
