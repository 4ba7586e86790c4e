"""Content hashes of full blocks, chained so that equal hashes mean equal prefixes.

A block's hash covers its parent's hash, its token ids and the sequence's extra keys
(for instance an adapter name), so two blocks share a hash only if everything before
them matches too. BLAKE2b with a 128-bit digest, from the standard library: stable
across processes, machines and Python versions (unlike ``hash()``), and collisions are
out of reach for any cache size we will ever hold.

Token ids are hashed as 4-byte little-endian integers, so a 16-token block and its
16-byte parent fit one 128-byte BLAKE2b compression (8-byte ids took two); with the
hasher's parameters set once and copied, hashing a prompt costs about half what it did.
A block holding an id of 2**32 or more (or a negative one, which the engine refuses
anyway) is hashed with 8-byte ids under its own personalization, so the two encodings
never produce each other's hashes.

A per-tenant cache salt is mixed into the root that block 0 chains from. Without it,
one tenant could learn whether another tenant has sent a given prompt: a prefix-cache
hit is visible from outside as a faster first token, a timing side channel. With
different salts two tenants never share a block, whatever their tokens.

Shared prefixes are the one exception. A chain may start with ``num_shared_blocks`` (k)
blocks hashed unsalted, from ``root_hash(None)``, exactly as a shared pin's blocks are, so
every tenant's request that starts with those tokens hits them. The salt comes in at block
k instead of block 0: block k's parent is ``rekey(hash of block k-1, salt)``, a hash under
the root personalization (so, like a root, no token content can forge it). Everything
after block k - 1 is as private as before: two tenants whose prompts share the k public
blocks and more still part at block k. With k = 0, or without a salt, the chain is the
plain one, bit for bit.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from hashlib import blake2b

__all__ = [
    "DIGEST_SIZE",
    "encode_extra_keys",
    "hash_blocks",
    "hash_chain",
    "parent_hash",
    "rekey",
    "root_hash",
]

DIGEST_SIZE = 16
# Roots and blocks hash under different personalizations, so no token content can ever
# produce a tenant's root (and so enter that tenant's chain).
_ROOT_PERSON = b"kvgov-root"
_ROOT = blake2b(b"", digest_size=DIGEST_SIZE, person=_ROOT_PERSON).digest()
# Block hashers, parameters set once: ``copy()`` is cheaper than a new constructor call.
_U32 = next(code for code in "IL" if array(code).itemsize == 4)
_BLOCK = blake2b(digest_size=DIGEST_SIZE, person=b"kvgov-block4")  # 4-byte ids
_WIDE_BLOCK = blake2b(digest_size=DIGEST_SIZE, person=b"kvgov-block8")  # 8-byte ids
_BIG_ENDIAN = sys.byteorder == "big"

ExtraKey = str | int | bytes


def root_hash(cache_salt: str | None = None) -> bytes:
    """The parent hash of block 0: a constant, or one derived from the tenant's salt."""
    if cache_salt is None:
        return _ROOT
    return blake2b(
        b"salt:" + cache_salt.encode(), digest_size=DIGEST_SIZE, person=_ROOT_PERSON
    ).digest()


def rekey(previous: bytes, cache_salt: str) -> bytes:
    """Block k's parent in a chain whose first k blocks are shared: the hash of block
    k - 1 bound to the tenant's salt. "rekey:" never begins a root's input ("salt:" does),
    so a rekeyed parent is never another tenant's root either."""
    return blake2b(
        b"rekey:" + previous + cache_salt.encode(), digest_size=DIGEST_SIZE, person=_ROOT_PERSON
    ).digest()


def parent_hash(
    index: int, previous: bytes | None, *, cache_salt: str | None, num_shared_blocks: int = 0
) -> bytes:
    """The parent block ``index`` chains from; ``previous`` is the hash of block
    ``index - 1`` (unused for block 0)."""
    if index == 0:
        return root_hash(cache_salt if num_shared_blocks == 0 else None)
    assert previous is not None, "blocks after block 0 chain from the previous block's hash"
    if index == num_shared_blocks and cache_salt is not None:
        return rekey(previous, cache_salt)
    return previous


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
    tokens = token_ids[start_block * block_size : num_full * block_size]
    try:
        ids = array(_U32, tokens)
    except OverflowError:  # an id outside 0..2**32-1: each block picks its encoding
        return _hash_blocks_wide(tokens, block_size, parent=parent, extra=extra)
    if _BIG_ENDIAN:
        ids.byteswap()
    raw = ids.tobytes()
    stride = block_size * 4
    new = _BLOCK.copy
    hashes: list[bytes] = []
    append = hashes.append
    for offset in range(0, len(raw), stride):
        hasher = new()
        hasher.update(parent + raw[offset : offset + stride] + extra)
        parent = hasher.digest()
        append(parent)
    return hashes


def _hash_blocks_wide(
    tokens: Sequence[int], block_size: int, *, parent: bytes, extra: bytes
) -> list[bytes]:
    """``hash_blocks`` of full blocks where some id does not fit 4 bytes: blocks whose
    ids all fit hash as usual, the others as 8-byte ids under their own hasher."""
    hashes: list[bytes] = []
    for begin in range(0, len(tokens), block_size):
        block = tokens[begin : begin + block_size]
        try:
            ids, hasher = array(_U32, block), _BLOCK.copy()
        except OverflowError:
            ids, hasher = array("q", block), _WIDE_BLOCK.copy()
        if _BIG_ENDIAN:
            ids.byteswap()
        hasher.update(parent + ids.tobytes() + extra)
        parent = hasher.digest()
        hashes.append(parent)
    return hashes


def hash_chain(
    token_ids: Sequence[int],
    block_size: int,
    *,
    cache_salt: str | None = None,
    num_shared_blocks: int = 0,
    extra: bytes = b"",
    start_block: int = 0,
    previous: bytes | None = None,
) -> list[bytes]:
    """Hashes of the full blocks ``start_block, ...`` of a chain salted with
    ``cache_salt`` from block ``num_shared_blocks`` on (see the module docstring);
    ``previous`` is the hash of block ``start_block - 1``. With ``num_shared_blocks``
    0 this is ``hash_blocks(..., parent=root_hash(cache_salt))``."""
    hashes: list[bytes] = []
    shared = num_shared_blocks if cache_salt is not None else 0
    if start_block < shared < len(token_ids) // block_size:
        # The shared blocks, then the rest from the rekeyed parent.
        hashes = hash_blocks(
            token_ids[: shared * block_size],
            block_size,
            parent=parent_hash(start_block, previous, cache_salt=None),
            extra=extra,
            start_block=start_block,
        )
        start_block, previous = shared, hashes[-1]
    parent = parent_hash(start_block, previous, cache_salt=cache_salt, num_shared_blocks=shared)
    hashes += hash_blocks(
        token_ids, block_size, parent=parent, extra=extra, start_block=start_block
    )
    return hashes
