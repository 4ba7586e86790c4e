"""One physical KV block: a fixed number of token slots of K and V in every layer."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KVCacheBlock"]


@dataclass(slots=True, eq=False)
class KVCacheBlock:
    """Metadata of a physical block; the tensors live in ``KVCache``.

    Invariants kept by ``BlockPool``:
    - ``ref_cnt`` counts the block tables and pins that hold the block; ``num_pins`` of
      those references are pins, so ``num_pins <= ref_cnt``.
    - The block is in the free queue exactly when ``ref_cnt == 0``; ``prev_free`` and
      ``next_free`` thread it through that queue, so freeing creates no Python object.
    - ``block_hash`` is set only while the block is the prefix cache's entry for that
      hash, whether it is in use or free (free and hashed = cached, evictable).
    """

    block_id: int
    ref_cnt: int = 0
    num_pins: int = 0
    block_hash: bytes | None = None
    prev_free: KVCacheBlock | None = None
    next_free: KVCacheBlock | None = None

    @property
    def is_free(self) -> bool:
        return self.ref_cnt == 0
