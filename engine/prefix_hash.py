"""Content hashes of full blocks, chained so that equal hashes mean equal prefixes.

A block's hash covers its parent's hash, its token ids and the sequence's extra keys
(for instance an adapter name), so two blocks share a hash only if everything before
them matches too. BLAKE2b with a 128-bit digest, from the standard library: stable
across processes and Python versions (unlike ``hash()``), and collisions are out of
reach for any cache size we will ever hold.

A per-tenant cache salt is mixed into the root that block 0 chains from. Without it,
one tenant could learn whether another tenant has sent a given prompt: a prefix-cache
hit is visible from outside as a faster first token, a timing side channel. With
different salts two tenants never share a block, whatever their tokens.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from hashlib import blake2b

__all__ = ["DIGEST_SIZE", "encode_extra_keys", "hash_blocks", "root_hash"]

DIGEST_SIZE = 16
_TOKEN_BYTES = 8  # array typecode "q"
# Roots and blocks hash under different personalizations, so no token content can ever
# produce a tenant's root (and so enter that tenant's chain).
_ROOT_PERSON = b"kvgov-root"
_BLOCK_PERSON = b"kvgov-block"
_ROOT = blake2b(b"", digest_size=DIGEST_SIZE, person=_ROOT_PERSON).digest()

ExtraKey = str | int | bytes


def root_hash(cache_salt: str | None = None) -> bytes:
    """The parent hash of block 0: a constant, or one derived from the tenant's salt."""
    if cache_salt is None:
        return _ROOT
    return blake2b(
        b"salt:" + cache_salt.encode(), digest_size=DIGEST_SIZE, person=_ROOT_PERSON
    ).digest()


def encode_extra_keys(extra_keys: Sequence[ExtraKey] = ()) -> bytes:
    """A deterministic, unambiguous byte string for the extra keys (type tag + length)."""
    parts: list[bytes] = []
    for key in extra_keys:
        if isinstance(key, bool) or not isinstance(key, (str, int, bytes)):
            raise TypeError(f"extra keys must be str, int or bytes, got {type(key).__name__}")
        if isinstance(key, str):
            raw, tag = key.encode(), b"s"
        elif isinstance(key, int):
            raw, tag = str(key).encode(), b"i"
        else:
            raw, tag = key, b"b"
        parts.append(tag + len(raw).to_bytes(4, "little") + raw)
    return b"".join(parts)


def hash_blocks(
    token_ids: Sequence[int],
    block_size: int,
    *,
    parent: bytes,
    extra: bytes = b"",
    start_block: int = 0,
) -> list[bytes]:
    """Hashes of the full blocks ``start_block, start_block + 1, ...`` of ``token_ids``.

    ``parent`` is the hash of block ``start_block - 1`` (or ``root_hash(salt)`` for block
    0). A trailing partial block is not hashed: only full blocks are ever shared.
    """
    num_full = len(token_ids) // block_size
    if num_full <= start_block:
        return []
    begin = start_block * block_size
    raw = array("q", token_ids[begin : num_full * block_size]).tobytes()
    stride = block_size * _TOKEN_BYTES
    hashes: list[bytes] = []
    append = hashes.append
    for offset in range(0, len(raw), stride):
        parent = blake2b(
            parent + raw[offset : offset + stride] + extra,
            digest_size=DIGEST_SIZE,
            person=_BLOCK_PERSON,
        ).digest()
        append(parent)
    return hashes
