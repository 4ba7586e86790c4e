"""Incremental detokenization: text for a stream of token ids, never half a character.

A token may end in the middle of a UTF-8 character (byte-level BPE splits emoji and CJK
across tokens), and some decoders change a token's text by its neighbours (a leading
``▁`` turns into a space only after another token). Either way ``push`` returns only
text that later tokens cannot change, and ``flush`` returns the rest, so the pieces
joined equal one ``decode`` of all the ids.
"""

from __future__ import annotations

import codecs
import operator
from collections.abc import Callable, Sequence
from typing import Protocol

from engine.errors import InvalidRequestError

__all__ = ["ByteStreamDecoder", "IncrementalDecoder", "WindowStreamDecoder"]


class IncrementalDecoder(Protocol):
    """Streaming decode of one sequence's tokens; one object per stream."""

    def push(self, token_id: int) -> str:
        """The text that ``token_id`` completes; often ``""`` while a character is split."""
        ...

    def flush(self) -> str:
        """The text still held back, at the end of the stream. Ends the stream."""
        ...

    def push_repeated(self, token_id: int, times: int) -> str:
        """``push(token_id)`` made ``times`` times, the texts joined."""
        ...


class ByteStreamDecoder:
    """For backends whose text is the UTF-8 decoding of the tokens' bytes joined (tiktoken)."""

    __slots__ = ("_closed", "_token_bytes", "_utf8")

    def __init__(self, token_bytes: Callable[[int], bytes]) -> None:
        self._token_bytes = token_bytes
        # Decoding incrementally with errors="replace" puts U+FFFD exactly where one
        # bytes.decode(errors="replace") of the whole stream would.
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._closed = False

    def push(self, token_id: int) -> str:
        _check_open(self._closed)
        return self._utf8.decode(self._token_bytes(check_token_id(token_id)))

    def push_repeated(self, token_id: int, times: int) -> str:
        # A push that finds no partial character held and leaves none returns what every
        # later push of the same token will: the rest need not be decoded.
        _check_open(self._closed)
        data = self._token_bytes(check_token_id(token_id))
        pieces = []
        for done in range(times):
            clean = not self._utf8.getstate()[0]
            text = self._utf8.decode(data)
            pieces.append(text)
            if clean and not self._utf8.getstate()[0]:
                pieces.append(text * (times - done - 1))
                break
        return "".join(pieces)

    def flush(self) -> str:
        _check_open(self._closed)
        self._closed = True
        return self._utf8.decode(b"", final=True)


class WindowStreamDecoder:
    """For backends that can only decode whole id lists (Hugging Face ``tokenizers``).

    Decodes a short window of recent ids twice, with and without the newest ones, and
    returns the difference (the scheme of vLLM's and TGI's detokenizers). Text is held
    back while it ends in U+FFFD, a character that later bytes may still complete.

    The pieces join to ``decode(ids)`` for valid text. For invalid UTF-8, which only a
    broken model emits, a byte-fallback decoder (Llama 2 style ``<0x..>`` tokens) may
    differ: it turns a whole byte run into U+FFFD once a bad byte arrives, including
    bytes that were valid, and already streamed, on their own.
    """

    __slots__ = ("_closed", "_decode", "_ids", "_prefix_offset", "_read_offset")

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self._decode = decode
        self._ids: list[int] = []
        # _ids[_prefix_offset:_read_offset] is context whose text was already returned;
        # _ids[_read_offset:] is not returned yet.
        self._prefix_offset = 0
        self._read_offset = 0
        self._closed = False

    def push(self, token_id: int) -> str:
        _check_open(self._closed)
        self._ids.append(check_token_id(token_id))
        return self._advance(final=False)

    def push_repeated(self, token_id: int, times: int) -> str:
        return "".join(self.push(token_id) for _ in range(times))

    def flush(self) -> str:
        _check_open(self._closed)
        self._closed = True
        return self._advance(final=True)

    def _advance(self, *, final: bool) -> str:
        window = self._ids[self._prefix_offset :]
        context = self._decode(window[: self._read_offset - self._prefix_offset])
        text = self._decode(window)
        if len(text) <= len(context) or (text.endswith("\ufffd") and not final):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        # Only the window is kept: older ids can no longer change the text.
        del self._ids[: self._prefix_offset]
        self._read_offset -= self._prefix_offset
        self._prefix_offset = 0
        return text[len(context) :]


def check_token_id(token_id: object) -> int:
    """``token_id`` as an int (numpy and 0-d torch integers too), or a typed error."""
    try:
        value = operator.index(token_id)  # type: ignore[arg-type]  # a non-index raises TypeError
    except TypeError:
        value = -1
    if isinstance(token_id, bool) or value < 0:
        raise InvalidRequestError(f"token ids must be ints >= 0, got {token_id!r}")
    return value


def _check_open(closed: bool) -> None:
    if closed:
        raise InvalidRequestError("the stream was flushed; start a new stream_decoder()")
