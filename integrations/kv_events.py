"""``KVEventIndex``: which replica holds which prefix, from vLLM's KV-cache events.

vLLM started with ``--kv-events-config '{"enable_kv_cache_events": true, "publisher":
"zmq", "endpoint": "tcp://*:5557"}'`` publishes every block it caches and evicts, over a
ZeroMQ PUB socket, as multipart messages ``(topic, sequence as 8 big-endian bytes,
payload)``; the payload is a ``KVEventBatch`` encoded by msgspec's msgpack encoder
(``vllm/distributed/kv_events.py``): ``{"ts", "events", "data_parallel_rank"}`` whose
events are tagged structs, ``{"type": "BlockStored", "block_hashes", "parent_block_hash",
"token_ids", "block_size", "lora_id", "medium", ...}``, ``{"type": "BlockRemoved",
"block_hashes", "medium"}`` and ``{"type": "AllBlocksCleared"}``. Releases that encoded
them as arrays (``["BlockStored", block_hashes, parent_block_hash, token_ids, ...]``,
the batch ``[ts, events, data_parallel_rank]``) are read too.

vLLM's block hashes cannot be computed here (they hash with a per-process seed and
extra keys), so the index keys each stored block by its own chain of token ids, kept
beside vLLM's hash for the parent and removal lookups: ``matched_tokens(replica,
token_ids)`` is how many leading tokens of a prompt that replica holds in full blocks,
exactly as its events say. Feed it the frames your own SUB socket receives
(``feed(replica, frames)``; pyzmq is yours to install). Needs ``msgpack``
(``pip install 'kvgov[kv-events]'``). Thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from governor import ConfigError

__all__ = ["KVEventIndex", "decode_batch"]

_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size")


@dataclass(slots=True)
class _Replica:
    keys: dict[Any, int] = field(default_factory=dict)  # vLLM's block hash -> our key
    held: dict[int, int] = field(default_factory=dict)  # our key -> vLLM hashes holding it


def decode_batch(payload: bytes) -> list[dict[str, Any]]:
    """The events of one ``KVEventBatch`` payload, each a dict with ``type``."""
    try:
        import msgpack
    except ImportError as exc:  # pragma: no cover - the extra is installed in tests
        raise ConfigError(
            "reading vLLM's KV events needs msgpack: pip install 'kvgov[kv-events]'",
            setting="kv_events",
        ) from exc
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    events = batch.get("events", []) if isinstance(batch, dict) else batch[1]
    return [_event(item) for item in events]


def _event(item: Any) -> dict[str, Any]:
    if isinstance(item, dict):
        return item
    kind, *values = item  # array form: the tag first, then the fields in order
    if kind == "BlockStored":
        return {"type": kind, **dict(zip(_STORED_FIELDS, values, strict=False))}
    if kind == "BlockRemoved":
        return {"type": kind, "block_hashes": values[0] if values else []}
    return {"type": kind}


class KVEventIndex:
    """Per replica (an index into ``MultiBackend``'s replicas), the token prefixes its
    engine holds in full blocks of ``block_size`` tokens."""

    def __init__(self, num_replicas: int, *, block_size: int) -> None:
        self.block_size = block_size
        self._replicas = [_Replica() for _ in range(num_replicas)]
        self._lock = threading.Lock()

    def feed(self, replica: int, frames: Sequence[bytes]) -> int:
        """One ZeroMQ message (``topic, sequence, payload``, or the payload alone);
        returns the events applied."""
        events = decode_batch(frames[-1])
        self.apply(replica, events)
        return len(events)

    def apply(self, replica: int, events: Sequence[dict[str, Any]]) -> None:
        with self._lock:
            state = self._replicas[replica]
            for event in events:
                kind = event.get("type")
                if kind == "BlockStored":
                    self._stored(state, event)
                elif kind == "BlockRemoved":
                    for block_hash in event.get("block_hashes") or ():
                        self._removed(state, block_hash)
                elif kind == "AllBlocksCleared":
                    state.keys.clear()
                    state.held.clear()

    def clear(self, replica: int) -> None:
        """The replica restarted or left rotation: it holds nothing."""
        self.apply(replica, [{"type": "AllBlocksCleared"}])

    def matched_tokens(self, replica: int, token_ids: Sequence[int]) -> int:
        size = self.block_size
        with self._lock:
            held = self._replicas[replica].held
            parent, matched = None, 0
            for start in range(0, len(token_ids) - size + 1, size):
                key = hash((parent, tuple(token_ids[start : start + size])))
                if key not in held:
                    break
                parent, matched = key, matched + size
            return matched

    def _stored(self, state: _Replica, event: dict[str, Any]) -> None:
        size = int(event.get("block_size") or self.block_size)
        if size != self.block_size:
            return  # another KV cache group's blocks (a sliding window, say)
        parent_hash = event.get("parent_block_hash")
        parent = None if parent_hash is None else state.keys.get(_hashable(parent_hash))
        if parent_hash is not None and parent is None:
            return  # its parent was evicted, or stored before we listened: unmatchable
        tokens = list(event.get("token_ids") or ())
        for i, block_hash in enumerate(event.get("block_hashes") or ()):
            chunk = tokens[i * size : (i + 1) * size]
            if len(chunk) < size:
                break
            key = hash((parent, tuple(chunk)))
            block_hash = _hashable(block_hash)
            if block_hash not in state.keys:
                state.keys[block_hash] = key
                state.held[key] = state.held.get(key, 0) + 1
            parent = key

    def _removed(self, state: _Replica, block_hash: Any) -> None:
        key = state.keys.pop(_hashable(block_hash), None)
        if key is None:
            return
        count = state.held.get(key, 0) - 1
        if count > 0:
            state.held[key] = count
        else:
            state.held.pop(key, None)


def _hashable(block_hash: Any) -> Any:
    return tuple(block_hash) if isinstance(block_hash, list) else block_hash
