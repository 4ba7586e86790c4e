"""``KVEventIndex`` on KV-event batches in vLLM's encoding, and ``MultiBackend`` routing
calls of token ids by it.

No vLLM runs here: the batches are written as vLLM's publisher encodes them (msgspec's
msgpack encoder over ``KVEventBatch``, ``vllm/distributed/kv_events.py`` at vllm-project/
vllm 0181ea3: maps with the ``type`` tag, defaults omitted, block hashes as bytes), and
in the array form of the releases whose structs were ``array_like``.
"""

from __future__ import annotations

import msgpack

from governor import FakeBackend, GenerationRequest
from integrations import MultiBackend
from integrations.kv_events import KVEventIndex, decode_batch

BLOCK = 16
PROMPT = list(range(1000, 1000 + 3 * BLOCK))  # three full blocks


def _stored(hashes: list[bytes], parent: bytes | None, tokens: list[int]) -> dict[str, object]:
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": BLOCK,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }


def _batch(*events: dict[str, object]) -> bytes:
    return msgpack.packb({"ts": 1_733_000_000.5, "events": list(events), "data_parallel_rank": 0})


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
