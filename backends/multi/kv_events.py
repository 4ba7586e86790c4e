"""``KVEventIndex``: which replica holds which prefix, from vLLM's KV-cache events.

Feed it the frames your own SUB socket receives (``feed(replica, frames)``; pyzmq is yours
to install); ``matched_tokens(replica, token_ids, cache_salt=...)`` is how many leading
tokens of a prompt that replica holds in full blocks, stored under that salt. A tenant's
prompt never matches another tenant's blocks, nor a LoRA's; each replica's index keeps at
most ``max_blocks`` blocks; a batch is checked whole before any of it is applied, and a
sequence gap or a malformed batch clears that replica's index (stale rather than wrong).
Needs ``msgpack`` (``pip install 'kvgov[kv-events]'``). Thread-safe; ``_lock`` is a leaf.
The format, the keys, the bounds and the sequence rule: docs/guides/replicas.md.

    BackendError
    └── KVEventError   a malformed message from a replica's publisher (``replica``,
                       ``problem``); not retriable: the same bytes fail again
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from governor import BackendError, ConfigError

__all__ = ["DEFAULT_MAX_BLOCKS", "KVEventError", "KVEventIndex", "decode_batch"]

DEFAULT_MAX_BLOCKS = 131_072
_STORED_FIELDS = (  # the array form's order (msgspec's array_like structs)
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
)
_ROOT = bytes(16)  # the parent key of a prompt's first block
_PERSON = b"kvgov-kv-events"


class KVEventError(BackendError):
    """A message from ``replica``'s KV-event publisher that is not a vLLM KV event batch;
    ``problem`` says what was wrong. That replica's index was cleared."""

    def __init__(self, problem: str, *, replica: int | None = None) -> None:
        self.replica = replica
        where, cleared = "", ""
        if replica is not None:
            where = f" from replica {replica}"
            cleared = "; its index was cleared and fills again from the next events"
        super().__init__(
            f"a KV event message{where} is malformed: {problem}{cleared}. Feed the frames of "
            "a SUB socket connected to vLLM's --kv-events-config publisher (topic, 8-byte "
            "sequence, msgpack payload)",
            backend="vllm",
        )
        self.problem = problem


@dataclass(slots=True)
class _Replica:
    # vLLM's block hash -> our key, oldest stored first
    keys: OrderedDict[Hashable, bytes] = field(default_factory=OrderedDict)
    held: dict[bytes, int] = field(default_factory=dict)  # our key -> vLLM hashes holding it
    sequence: dict[Any, int] = field(default_factory=dict)  # publisher (rank) -> last number
    num_gaps: int = 0


def decode_batch(payload: bytes) -> list[dict[str, Any]]:
    """The events of one ``KVEventBatch`` payload, each a dict with ``type``; raises
    ``KVEventError`` for anything else."""
    _, events = _decode(payload)
    return events


def _decode(payload: bytes) -> tuple[Any, list[dict[str, Any]]]:
    """The batch's data-parallel rank (None: not said) and its events, checked."""
    try:
        import msgpack
    except ImportError as exc:  # pragma: no cover - the extra is installed in tests
        raise ConfigError(
            "reading vLLM's KV events needs msgpack: pip install 'kvgov[kv-events]'",
            setting="kv_events",
        ) from exc
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise KVEventError(f"the payload is a {type(payload).__name__}, not bytes")
    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several types, none of them ours
        raise KVEventError(f"not msgpack ({type(exc).__name__}: {exc})") from exc
    if isinstance(batch, dict):
        events, rank = batch.get("events"), batch.get("data_parallel_rank")
    elif isinstance(batch, list) and len(batch) >= 2:
        events, rank = batch[1], batch[2] if len(batch) > 2 else None
    else:
        raise KVEventError(f"the batch is a {type(batch).__name__}, not a KVEventBatch")
    if not isinstance(events, list):
        raise KVEventError(f"the batch's events are a {type(events).__name__}, not a list")
    if rank is not None and not _is_int(rank):
        raise KVEventError(f"data_parallel_rank is {rank!r}, not a whole number")
    return rank, [_event(item) for item in events]


def _event(item: Any) -> dict[str, Any]:
    """One event as a dict with ``type``, its fields checked (either form)."""
    if isinstance(item, list):
        if not item or not isinstance(item[0], str):
            raise KVEventError(f"an event array does not start with its type: {item!r:.80}")
        kind, values = item[0], item[1:]
        if kind == "BlockStored":
            item = {"type": kind, **dict(zip(_STORED_FIELDS, values, strict=False))}
        elif kind == "BlockRemoved":
            item = {"type": kind, "block_hashes": values[0] if values else None}
        else:
            item = {"type": kind}
    if not isinstance(item, dict) or not isinstance(item.get("type"), str):
        raise KVEventError(f"an event is not a tagged struct: {item!r:.80}")
    kind = item["type"]
    if kind in ("BlockStored", "BlockRemoved"):
        hashes = item.get("block_hashes")
        if not isinstance(hashes, list) or not all(_is_hash(h) for h in hashes):
            raise KVEventError(f"{kind}'s block_hashes are {hashes!r:.80}, not a list of hashes")
    if kind == "BlockStored":
        _check_stored(item)
    return item


def _check_stored(event: dict[str, Any]) -> None:
    parent, tokens = event.get("parent_block_hash"), event.get("token_ids")
    if parent is not None and not _is_hash(parent):
        raise KVEventError(f"BlockStored's parent_block_hash is {parent!r:.80}")
    if not isinstance(tokens, list) or not all(_is_int(t) for t in tokens):
        raise KVEventError(f"BlockStored's token_ids are {tokens!r:.80}, not whole numbers")
    size = event.get("block_size")
    if size is not None and not (_is_int(size) and size > 0):
        raise KVEventError(f"BlockStored's block_size is {size!r}, not a positive number")
    extra = event.get("extra_keys")
    if extra is not None and (
        not isinstance(extra, list)
        or len(extra) != len(event["block_hashes"])
        or not all(keys is None or isinstance(keys, list) for keys in extra)
    ):
        raise KVEventError(f"BlockStored's extra_keys are {extra!r:.80}, not one per block")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_hash(value: Any) -> bool:
    """vLLM's block hashes: ints (older releases), bytes (current), arrays of them."""
    if isinstance(value, list):
        return all(_is_hash(part) for part in value)
    return _is_int(value) or isinstance(value, (bytes, str))


def _hashable(block_hash: Any) -> Hashable:
    if isinstance(block_hash, list):
        return tuple(_hashable(part) for part in block_hash)
    return block_hash


def _frozen(value: Any) -> Any:
    """Extra keys as the same value whichever form they came in (arrays as tuples)."""
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(part) for part in value)
    return value


def _block_key(parent: bytes, token_ids: Sequence[int], extra_keys: Any) -> bytes:
    """A block's key: BLAKE2b (128 bits) of its parent's key, its tokens and extra keys
    (the tokens as decimal numbers: only digits, ``-`` and ``,`` before the ``|``)."""
    text = f"{','.join(map(str, token_ids))}|{_frozen(extra_keys)!r}"
    digest = hashlib.blake2b(parent, digest_size=16, person=_PERSON)
    digest.update(text.encode("utf-8", "surrogatepass"))
    return digest.digest()


class KVEventIndex:
    """Per replica (an index into ``MultiBackend``'s replicas), the token prefixes its
    engine holds in full blocks of ``block_size`` tokens, at most ``max_blocks`` of them."""

    def __init__(
        self, num_replicas: int, *, block_size: int, max_blocks: int = DEFAULT_MAX_BLOCKS
    ) -> None:
        for setting, value in (
            ("num_replicas", num_replicas),
            ("block_size", block_size),
            ("max_blocks", max_blocks),
        ):
            if not _is_int(value) or value < 1:
                raise ConfigError.below_minimum(setting, value, 1)
        self.block_size = block_size
        self.max_blocks = max_blocks
        self._replicas = [_Replica() for _ in range(num_replicas)]
        self._lock = threading.Lock()

    def feed(self, replica: int, frames: Sequence[bytes]) -> int:
        """One ZeroMQ message (``topic, sequence, payload``, or the payload alone); returns
        the events applied. Raises ``KVEventError`` for a malformed one."""
        self._check_replica(replica)
        if (
            isinstance(frames, (bytes, str))
            or not isinstance(frames, Sequence)
            or len(frames) not in (1, 3)
        ):
            with self._lock:
                self._reset(self._replicas[replica])
            raise KVEventError(
                "expected the frames (topic, sequence, payload) or the payload alone",
                replica=replica,
            )
        sequence = None
        if len(frames) == 3:
            number = frames[1]
            if not isinstance(number, (bytes, bytearray)) or len(number) != 8:
                with self._lock:
                    self._reset(self._replicas[replica])
                raise KVEventError(f"the sequence frame is {number!r:.40}", replica=replica)
            sequence = int.from_bytes(number, "big", signed=True)
        try:
            rank, events = _decode(frames[-1])
        except KVEventError as exc:
            with self._lock:
                self._reset(self._replicas[replica])
            raise KVEventError(exc.problem, replica=replica) from exc.__cause__
        with self._lock:
            state = self._replicas[replica]
            if sequence is not None:
                last = state.sequence.get(rank)
                if last is not None and sequence != last + 1:
                    self._reset(state)  # missed messages: what it holds is unknown
                    state.num_gaps += 1
                state.sequence[rank] = sequence
            self._apply(state, events)
        return len(events)

    def apply(self, replica: int, events: Sequence[dict[str, Any]]) -> None:
        """Apply decoded events (``decode_batch``'s) in order; a malformed one raises
        ``KVEventError`` before any is applied."""
        self._check_replica(replica)
        try:
            checked = [_event(event) for event in events]
        except KVEventError as exc:
            with self._lock:
                self._reset(self._replicas[replica])
            raise KVEventError(exc.problem, replica=replica) from exc
        with self._lock:
            self._apply(self._replicas[replica], checked)

    def clear(self, replica: int) -> None:
        """The replica restarted or left rotation: it holds nothing."""
        self.apply(replica, [{"type": "AllBlocksCleared"}])

    def num_blocks(self, replica: int) -> int:
        """Blocks indexed for the replica now (at most ``max_blocks``)."""
        self._check_replica(replica)
        with self._lock:
            return len(self._replicas[replica].keys)

    def num_gaps(self, replica: int) -> int:
        """Sequence gaps seen from the replica's publishers (each cleared its index)."""
        self._check_replica(replica)
        with self._lock:
            return self._replicas[replica].num_gaps

    def matched_tokens(
        self, replica: int, token_ids: Sequence[int], *, cache_salt: str | None = None
    ) -> int:
        """Leading tokens of the prompt the replica holds in full blocks stored under
        ``cache_salt`` (the value the engine was sent: ``VLLMBackend.sent_cache_salt``)."""
        self._check_replica(replica)
        size = self.block_size
        with self._lock:
            held = self._replicas[replica].held
            parent, matched = _ROOT, 0
            for start in range(0, len(token_ids) - size + 1, size):
                extra = (cache_salt,) if start == 0 and cache_salt is not None else None
                key = _block_key(parent, token_ids[start : start + size], extra)
                if key not in held:
                    break
                parent, matched = key, matched + size
            return matched

    # -- under the lock ---------------------------------------------------------------
    def _apply(self, state: _Replica, events: list[dict[str, Any]]) -> None:
        for event in events:
            kind = event["type"]
            if kind == "BlockStored":
                self._stored(state, event)
            elif kind == "BlockRemoved":
                for block_hash in event["block_hashes"]:
                    self._removed(state, _hashable(block_hash))
            elif kind == "AllBlocksCleared":
                state.keys.clear()
                state.held.clear()

    def _stored(self, state: _Replica, event: dict[str, Any]) -> None:
        size = event.get("block_size") or self.block_size
        if size != self.block_size:
            return  # another KV cache group's blocks (a sliding window, say)
        extra_keys = event.get("extra_keys")
        if extra_keys is None and (event.get("lora_id") or event.get("lora_name")):
            return  # a LoRA's blocks, from a release that does not say its extra keys
        parent_hash = event.get("parent_block_hash")
        parent = _ROOT if parent_hash is None else state.keys.get(_hashable(parent_hash))
        if parent is None:
            return  # its parent was evicted, or stored before we listened: unmatchable
        tokens = event["token_ids"]
        for i, block_hash in enumerate(event["block_hashes"]):
            chunk = tokens[i * size : (i + 1) * size]
            if len(chunk) < size:
                break
            key = _block_key(parent, chunk, extra_keys[i] if extra_keys else None)
            block_hash = _hashable(block_hash)
            if block_hash in state.keys:
                state.keys.move_to_end(block_hash)
            else:
                state.keys[block_hash] = key
                state.held[key] = state.held.get(key, 0) + 1
                while len(state.keys) > self.max_blocks:
                    _, oldest = state.keys.popitem(last=False)
                    self._unheld(state, oldest)
            parent = key

    def _removed(self, state: _Replica, block_hash: Hashable) -> None:
        key = state.keys.pop(block_hash, None)
        if key is not None:
            self._unheld(state, key)

    @staticmethod
    def _unheld(state: _Replica, key: bytes) -> None:
        count = state.held.get(key, 0) - 1
        if count > 0:
            state.held[key] = count
        else:
            state.held.pop(key, None)

    @staticmethod
    def _reset(state: _Replica) -> None:
        state.keys.clear()
        state.held.clear()
        state.sequence.clear()  # each publisher's next message starts it again

    def _check_replica(self, replica: int) -> None:
        if not _is_int(replica) or not 0 <= replica < len(self._replicas):
            raise ConfigError(
                f"replica must be an index from 0 to {len(self._replicas) - 1}, got "
                f"{replica!r}: the index was made for {len(self._replicas)} replicas",
                setting="replica",
            )
