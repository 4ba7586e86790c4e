"""Chat prompts' token ids, encoded line by line with each line's ids kept: the open-loop
workload's histories repeat every line of the turn before, and compaction counts the same
history many times, so each line is encoded once (``workload.prompts`` and
``workload.counter_for`` check the result against ``encode_chat`` and fall back to it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from engine.tokenizer import Tokenizer

__all__ = ["LineIds"]


# A line starts after a newline and at a character that is not white space: tiktoken's
# and byte-level BPE's pre-tokenizers never join a piece across such a point, so a text's
# ids are its lines' ids joined (``counter_for`` and ``prompts`` check it). The split
# takes the newline that ends each line but the last (seven times faster on a prompt
# than a split between two lookarounds).
_LINE_END = re.compile(r"\n(?=\S)")


class LineIds:
    """``encode_chat`` with each line's ids kept: a history's prompt repeats every line of
    the one before, and compaction counts the same history many times."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.name = tokenizer.name
        self.ids: dict[str, list[int]] = {}  # a line -> the ids of it and its newline
        self.tails: dict[str, list[int]] = {}  # a text's last line -> its ids

    def encode(self, text: str) -> list[int]:
        encode = self.tokenizer.encode
        *lines, tail = _LINE_END.split(text)
        out: list[int] = []
        for line in lines:
            ids = self.ids.get(line)
            if ids is None:
                ids = self.ids[line] = encode(line + "\n")
            out += ids
        ids = self.tails.get(tail)
        if ids is None:
            ids = self.tails[tail] = encode(tail)
        return out + ids

    def encode_chat(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        return self.encode(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True))

    def count_chat_tokens(self, messages: Sequence[Mapping[str, Any]]) -> int:
        return len(self.encode_chat(messages))
