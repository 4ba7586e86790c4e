"""``KVEventIndex`` on KV-event batches in vLLM's encoding, and ``MultiBackend`` routing
calls of token ids by it: matching from the start in full blocks, removals, the array
form, one error type for whatever a publisher sends, a bounded index, sequence gaps,
BLAKE2 keys and the cache salt.

No vLLM runs here (it needs CUDA): the batches are written as vLLM's publisher encodes them
(msgspec's msgpack encoder over ``KVEventBatch``, ``vllm/distributed/kv_events.py`` at
vllm-project/vllm 0181ea3: maps with the ``type`` tag, defaults omitted, block hashes as
bytes; current releases add ``extra_keys``, one entry per block, the first block's holding
the request's ``cache_salt``), and in the array form of the releases whose structs were
``array_like``. The vLLM replicas of the salt test are the FAKE engines of
tests/fake_engines.py.
"""

from __future__ import annotations

import msgpack
import pytest

from backends import MultiBackend
from backends.multi.kv_events import DEFAULT_MAX_BLOCKS, KVEventError, KVEventIndex, decode_batch
from backends.openai._engine_requests import engine_cache_salt
from backends.openai.vllm import VLLMBackend
from governor import BackendError, ConfigError, FakeBackend, GenerationRequest
from tests.fake_engines import FakeEngine, serving

BLOCK = 16
PROMPT = list(range(1000, 1000 + 3 * BLOCK))  # three full blocks


def _stored(
    hashes: list[bytes],
    parent: bytes | None,
    tokens: list[int],
    *,
    salt: str | None = None,
    block_size: int = BLOCK,
) -> dict[str, object]:
    event: dict[str, object] = {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": block_size,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }
    if salt is not None:  # as current vLLM says it: the first block's extra keys
        first = [salt] if parent is None else None
        event["extra_keys"] = [first] + [None] * (len(hashes) - 1)
    return event


def _batch(*events: dict[str, object], rank: int = 0) -> bytes:
    batch = {"ts": 1_733_000_000.5, "events": list(events), "data_parallel_rank": rank}
    return msgpack.packb(batch)


def _message(sequence: int, *events: dict[str, object], rank: int = 0) -> list[bytes]:
    return [b"kv-events", sequence.to_bytes(8, "big"), _batch(*events, rank=rank)]


def test_stored_blocks_are_matched_from_the_start_and_removed_ones_cut_the_match() -> None:
    index = KVEventIndex(2, block_size=BLOCK)
    # two blocks in one event, the third chained to the second by vLLM's hash
    index.feed(
        0, [b"kv", (0).to_bytes(8, "big"), _batch(_stored([b"h1", b"h2"], None, PROMPT[:32]))]
    )
    index.feed(0, [b"kv", (1).to_bytes(8, "big"), _batch(_stored([b"h3"], b"h2", PROMPT[32:]))])
    assert index.matched_tokens(0, [*PROMPT, 7, 8]) == 48
    assert index.matched_tokens(0, PROMPT[:40]) == 32  # a partial block is never held
    assert index.matched_tokens(0, [1, *PROMPT]) == 0  # a prefix from the start only
    assert index.matched_tokens(1, PROMPT) == 0
    index.feed(0, [_batch({"type": "BlockRemoved", "block_hashes": [b"h2"], "medium": "GPU"})])
    assert index.matched_tokens(0, PROMPT) == 16
    index.feed(0, [_batch({"type": "AllBlocksCleared"})])
    assert index.matched_tokens(0, PROMPT) == 0


def test_a_block_whose_parent_is_unknown_is_not_indexed() -> None:
    index = KVEventIndex(1, block_size=BLOCK)
    index.feed(0, [_batch(_stored([b"h9"], b"never-seen", PROMPT[:16]))])
    assert index.matched_tokens(0, PROMPT) == 0


def test_the_array_form_of_older_releases_reads_the_same() -> None:
    older = msgpack.packb(
        [1.5, [["BlockStored", [11, 12], None, PROMPT[:32], BLOCK, None, "GPU"]], 0]
    )
    assert decode_batch(older) == [
        {
            "type": "BlockStored",
            "block_hashes": [11, 12],
            "parent_block_hash": None,
            "token_ids": PROMPT[:32],
            "block_size": BLOCK,
            "lora_id": None,
            "medium": "GPU",
        }
    ]
    index = KVEventIndex(1, block_size=BLOCK)
    index.feed(0, [older])
    assert index.matched_tokens(0, PROMPT) == 32


def test_multi_backend_sends_token_prompts_where_the_engine_says_they_are_held() -> None:
    replicas = [FakeBackend(num_blocks=64, block_size=BLOCK) for _ in range(2)]
    index = KVEventIndex(2, block_size=BLOCK)
    index.feed(1, [_batch(_stored([b"a", b"b", b"c"], None, PROMPT))])
    multi = MultiBackend(replicas, kv_events=index)
    multi.generate(GenerationRequest(prompt=[*PROMPT, 5, 6], max_tokens=1))
    assert [len(r.calls) for r in replicas] == [0, 1]  # the client's own record was empty
    multi.generate(GenerationRequest(prompt=[9] * 40, max_tokens=1))
    assert [len(r.calls) for r in replicas] == [1, 1]  # held nowhere: the freer one


_VALID = _batch(_stored([b"h1"], None, PROMPT[:16]))
_STORED = _stored([b"x"], None, PROMPT[:16])


def _events(*events: object) -> bytes:
    return msgpack.packb({"ts": 1.0, "events": list(events)})


MALFORMED = {
    "not msgpack": [b"\xc1"],
    "cut short": [_VALID[:-3]],
    "bytes after the batch": [_VALID + b"x"],
    "nested past msgpack's stack": [b"\x91" * 100_000],
    "invalid UTF-8 in a string": [b"\xd9\x02\xff\xfe"],
    "a map keyed by an array": [b"\x81\x91\x01\x02"],
    "a batch that is a number": [msgpack.packb(5)],
    "a batch array without events": [msgpack.packb([1.5])],
    "events that are a map": [msgpack.packb({"events": {"a": 1}})],
    "an event that is a number": [_events(5)],
    "an event without its type": [_events({"block_hashes": [b"x"]})],
    "an empty event array": [_events([])],
    "block hashes that are a number": [_events({**_STORED, "block_hashes": 5})],
    "a block hash that is a float": [_events({**_STORED, "block_hashes": [1.5]})],
    "token ids that are text": [_events({**_STORED, "token_ids": ["a"] * 16})],
    "a block size that is text": [_events({**_STORED, "block_size": "16"})],
    "a block size of 0": [_events({**_STORED, "block_size": 0})],
    "a parent that is a map": [_events({**_STORED, "parent_block_hash": {}})],
    "extra keys not one per block": [_events({**_STORED, "extra_keys": [None, None]})],
    "a removal without hashes": [_events({"type": "BlockRemoved"})],
    "a rank that is text": [msgpack.packb({"events": [], "data_parallel_rank": "0"})],
    "two frames": [b"kv-events", _VALID],
    "a sequence of 4 bytes": [b"kv-events", b"\x00\x00\x00\x01", _VALID],
    "a payload that is text": ["not bytes"],
}


@pytest.mark.parametrize("frames", list(MALFORMED.values()), ids=list(MALFORMED))
def test_whatever_a_publisher_sends_raises_one_error_type(frames: list[bytes]) -> None:
    index = KVEventIndex(2, block_size=BLOCK)
    index.feed(1, [_VALID])
    index.feed(1, _message(0, _stored([b"h2"], b"h1", PROMPT[16:32])))
    with pytest.raises(BackendError) as caught:
        index.feed(1, frames)
    error = caught.value
    assert type(error) is KVEventError and not error.retriable and error.replica == 1
    assert "replica 1 is malformed" in str(error) and "--kv-events-config" in str(error)
    assert index.matched_tokens(1, PROMPT) == 0  # cleared: its events are lost
    assert index.feed(1, _message(9, _stored([b"h1"], None, PROMPT[:16]))) == 1
    assert index.matched_tokens(1, PROMPT) == 16 and index.num_gaps(1) == 0
    with pytest.raises(KVEventError):  # the decoded form is checked alike
        index.apply(0, [{"type": "BlockStored", "block_hashes": None}])
    with pytest.raises(ConfigError, match="replica must be an index from 0 to 1"):
        index.feed(2, [_VALID])


def test_the_index_keeps_at_most_max_blocks_dropping_the_oldest() -> None:
    assert KVEventIndex(1, block_size=BLOCK).max_blocks == DEFAULT_MAX_BLOCKS == 131_072
    with pytest.raises(ConfigError, match="max_blocks"):
        KVEventIndex(1, block_size=BLOCK, max_blocks=0)
    index = KVEventIndex(1, block_size=2, max_blocks=3)
    prompts = [[n, n] for n in range(5)]  # one block each, stored in turn
    for n, tokens in enumerate(prompts):
        index.feed(0, [_batch(_stored([b"p%d" % n], None, tokens, block_size=2))])
    assert index.num_blocks(0) == 3
    assert [index.matched_tokens(0, tokens) for tokens in prompts] == [0, 0, 2, 2, 2]
    # never-removed blocks, many: the index stays at its cap
    tokens = list(range(20_000))
    hashes = [b"c%d" % n for n in range(10_000)]
    index.feed(0, [_batch(_stored(hashes, None, tokens, block_size=2))])
    assert index.num_blocks(0) == 3


def test_a_sequence_gap_clears_the_replicas_index_and_is_counted() -> None:
    index = KVEventIndex(2, block_size=BLOCK)
    index.feed(0, _message(0, _stored([b"h1"], None, PROMPT[:16])))
    index.feed(0, _message(1, _stored([b"h2"], b"h1", PROMPT[16:32])))
    index.feed(1, _message(7, _stored([b"h1"], None, PROMPT[:16])))  # its own numbers
    assert index.matched_tokens(0, PROMPT) == 32 and index.num_gaps(0) == 0
    # message 2 was lost (it may have removed h1); 3 stores a block chained to h2
    index.feed(0, _message(3, _stored([b"h3"], b"h2", PROMPT[32:])))
    assert index.num_gaps(0) == 1
    assert index.matched_tokens(0, PROMPT) == 0  # stale rather than wrong
    assert (index.matched_tokens(1, PROMPT), index.num_gaps(1)) == (16, 0)
    index.feed(0, _message(4, _stored([b"h1"], None, PROMPT[:16])))
    assert (index.matched_tokens(0, PROMPT), index.num_gaps(0)) == (16, 1)
    # data-parallel ranks number their messages each on their own
    index.feed(0, _message(0, _stored([b"r1"], None, list(range(16))), rank=1))
    index.feed(0, _message(5, rank=0))
    index.feed(0, _message(1, rank=1))
    assert index.num_gaps(0) == 1 and index.matched_tokens(0, list(range(16))) == 16
    # a publisher that started again numbers from 0: what it held is unknown too
    index.feed(0, _message(0, rank=0))
    assert index.num_gaps(0) == 2 and index.matched_tokens(0, PROMPT) == 0


def test_keys_are_blake2_so_ids_that_collide_under_python_hash_match_nothing() -> None:
    huge = 5 + 2**61 - 1
    assert hash(huge) == hash(5)  # Python hashes an int modulo 2**61 - 1
    index = KVEventIndex(1, block_size=2)
    index.feed(0, [_batch(_stored([b"x"], None, [huge, 7], block_size=2))])
    assert index.matched_tokens(0, [huge, 7]) == 2
    assert index.matched_tokens(0, [5, 7]) == 0


def test_a_tenants_prompt_matches_only_blocks_stored_under_its_own_salt() -> None:
    index = KVEventIndex(1, block_size=BLOCK)
    index.feed(0, [_batch(_stored([b"a1", b"a2", b"a3"], None, PROMPT, salt="acme-salt"))])
    assert index.matched_tokens(0, PROMPT, cache_salt="acme-salt") == 48
    assert index.matched_tokens(0, PROMPT, cache_salt="globex-salt") == 0
    assert index.matched_tokens(0, PROMPT) == 0
    index.feed(0, [_batch(_stored([b"u1"], None, PROMPT[:16]))])  # no salt said: unsalted
    assert index.matched_tokens(0, PROMPT) == 16
    assert index.matched_tokens(0, PROMPT, cache_salt="globex-salt") == 0
    lora = {**_stored([b"l1"], None, PROMPT[:16]), "extra_keys": [["my-adapter"]]}
    older_lora = {**_stored([b"l2"], None, PROMPT[:16]), "lora_id": 3}
    index.feed(0, [_batch(lora, older_lora, {"type": "AllBlocksCleared"})])
    index.feed(0, [_batch(lora, older_lora)])
    assert index.num_blocks(0) == 1  # the adapter's, under its extra keys; none of the older
    assert index.matched_tokens(0, PROMPT) == 0


def test_multi_backend_routes_a_tenants_token_prompt_only_by_its_own_blocks() -> None:
    key = b"one key for the deployment"
    acme = engine_cache_salt("acme", key=key)  # what vLLM is sent, and says in its events
    index = KVEventIndex(2, block_size=BLOCK)
    index.feed(1, [_batch(_stored([b"a", b"b", b"c"], None, PROMPT, salt=acme))])
    fakes = [FakeEngine("vllm"), FakeEngine("vllm")]
    with serving(fakes[0]) as first, serving(fakes[1]) as second:
        replicas = [VLLMBackend(url, model="m", salt_key=key) for url in (first, second)]
        multi = MultiBackend(replicas, kv_events=index)
        try:
            for tenant in ("acme", "globex"):
                request = GenerationRequest(prompt=[*PROMPT, 5], max_tokens=1, cache_salt=tenant)
                multi.generate(request)
        finally:
            multi.close()
    # acme's prompt went where vLLM holds it under acme's salt (by free blocks alone it
    # would go to the first); globex's copy of it matched nothing there, and went to the
    # replica caching the least text
    assert [len(fake.requests) for fake in fakes] == [1, 1]
    assert fakes[1].requests[0]["cache_salt"] == acme
    assert fakes[0].requests[0]["cache_salt"] == engine_cache_salt("globex", key=key)
