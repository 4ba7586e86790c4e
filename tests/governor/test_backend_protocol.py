"""The contract every ``Backend`` keeps, run against ``FakeBackend``, ``LocalBackend`` and
``RemoteBackend`` (the bundled engine behind a real ``kvgov serve`` process).

They must agree wherever the protocol says something: the same errors for the same
misuse, the same finish reasons at the same token counts for ceilings and budgets, the
same block accounting for pins, and every block back when calls end.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import aclosing

import pytest

from backends.local.backend import LocalBackend
from backends.remote.backend import RemoteBackend
from governor.backend import Backend, GenerationChunk, GenerationRequest, GenerationResult
from governor.errors import BackendError
from governor.testing import FakeBackend
from tests.serve_process import ServerProcess

NUM_BLOCKS = 64
BLOCK_SIZE = 16
MESSAGES = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "List three prime numbers."},
]


def _make(kind: str, request: pytest.FixtureRequest | None = None) -> Backend:
    if kind == "fake":
        return FakeBackend(num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE)
    if kind == "remote":
        assert request is not None
        server: ServerProcess = request.getfixturevalue("kvgov_server")
        assert server.config == {"num_blocks": NUM_BLOCKS, "block_size": BLOCK_SIZE}
        return RemoteBackend(server.base_url)
    return LocalBackend(config={"num_blocks": NUM_BLOCKS, "block_size": BLOCK_SIZE})


@pytest.fixture(scope="module", params=["fake", "local", "remote"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    made = _make(request.param, request)
    yield made
    made.close()


@pytest.fixture
def clean(backend: Backend) -> Iterator[Backend]:
    """The shared backend, checked to hold no call's blocks after each test."""
    yield backend
    _wait_until(lambda: _idle(backend))


def _idle(backend: Backend) -> bool:
    m = backend.metrics()
    return (
        m.num_blocks_in_use == m.num_blocks_pinned
        and m.num_requests_running == 0
        and m.num_requests_waiting == 0
    )


def _wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Aborts reach the engine thread a moment after the consumer goes away."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the backend to settle"
        time.sleep(0.01)


def _ids(start: int, n: int) -> list[int]:
    """Token ids no other test uses, so no prefix-cache hit comes from elsewhere."""
    return list(range(start, start + n))


def test_both_satisfy_the_protocol(backend: Backend) -> None:
    assert isinstance(backend, Backend)
    assert backend.name in ("fake", "local", "remote")
    assert backend.model
    assert backend.health().ok
    cap = backend.capacity()
    assert (cap.block_size, cap.num_blocks) == (BLOCK_SIZE, NUM_BLOCKS)
    assert cap.bytes_per_block > 0
    assert cap.max_model_len > 0


def test_budgets_open_resize_close(clean: Backend) -> None:
    clean.open_budget("contract-a", max_blocks=4)
    with pytest.raises(BackendError, match="already open"):
        clean.open_budget("contract-a", max_blocks=4)
    clean.resize_budget("contract-a", max_blocks=8)
    clean.close_budget("contract-a")
    for misuse in (
        lambda: clean.close_budget("contract-a"),
        lambda: clean.resize_budget("contract-a", max_blocks=2),
        lambda: clean.generate(GenerationRequest(prompt=_ids(100, 4), budget="contract-a")),
        lambda: clean.offload(budget="contract-a"),
        lambda: clean.retain(budget="contract-a"),
    ):
        with pytest.raises(BackendError, match="no budget named"):
            misuse()


def test_a_budget_with_a_call_in_flight_cannot_close(clean: Backend) -> None:
    clean.open_budget("contract-busy", max_blocks=8)

    async def main() -> None:
        request = GenerationRequest(prompt=_ids(200, 5), max_tokens=40, budget="contract-busy")
        async with aclosing(clean.astream(request)) as chunks:
            await anext(chunks)
            with pytest.raises(BackendError):
                clean.close_budget("contract-busy")

    asyncio.run(main())
    _wait_until(lambda: _idle(clean))
    clean.close_budget("contract-busy")


def test_pins_hold_blocks_and_serve_later_prompts(clean: Backend) -> None:
    before = clean.capacity()
    prefix = _ids(300, 40)
    handle = clean.pin_prefix(prefix)
    assert (handle.num_tokens, handle.num_pinned_tokens, handle.num_blocks) == (40, 32, 2)
    after = clean.capacity()
    assert after.num_pinned_blocks == before.num_pinned_blocks + 2
    assert after.num_available_blocks == before.num_available_blocks - 2
    result = clean.generate(GenerationRequest(prompt=[*prefix, 7, 8, 9], max_tokens=2))
    assert result.cached_tokens == 32
    salted = GenerationRequest(prompt=[*prefix, 7, 8, 9], max_tokens=2, cache_salt="tenant-b")
    assert clean.generate(salted).cached_tokens == 0  # no hits across tenants
    clean.unpin_prefix(handle)
    assert clean.capacity().num_pinned_blocks == before.num_pinned_blocks
    with pytest.raises(BackendError, match="not pinned"):
        clean.unpin_prefix(handle)


def test_a_shared_pin_serves_every_salt_and_nothing_past_it(clean: Backend) -> None:
    prefix, private = _ids(4000, 40), _ids(4100, 3 * BLOCK_SIZE)
    handle = clean.pin_prefix(prefix, shared=True)
    try:
        assert handle.shared and (handle.num_pinned_tokens, handle.num_blocks) == (32, 2)
        prompt = [*prefix[:32], *private]

        def cached(salt: str) -> int:
            request = GenerationRequest(prompt=prompt, max_tokens=1, cache_salt=salt)
            return clean.generate(request).cached_tokens

        assert cached("tenant-a") == 32  # the shared blocks, none of A's own yet
        assert cached("tenant-b") == 32  # A's blocks past the pin are cached: B misses them
    finally:
        clean.unpin_prefix(handle)
    with pytest.raises(BackendError):
        clean.pin_prefix(prefix, cache_salt="tenant-a", shared=True)


def test_a_prefix_shorter_than_a_block_cannot_be_pinned(clean: Backend) -> None:
    with pytest.raises(BackendError):
        clean.pin_prefix(_ids(400, BLOCK_SIZE - 1))


def test_generate_agenerate_and_astream_agree(clean: Backend) -> None:
    request = GenerationRequest(prompt="The quick brown fox", max_tokens=6)
    blocking = clean.generate(request)

    async def main() -> tuple[GenerationResult, list[GenerationChunk]]:
        return await clean.agenerate(request), [c async for c in clean.astream(request)]

    awaited, chunks = asyncio.run(main())
    streamed = chunks[-1].result
    assert streamed is not None and all(c.result is None for c in chunks[:-1])
    assert chunks[-1].text == "" and chunks[-1].token_ids == ()
    for result in (awaited, streamed):
        assert _essentials(result) == _essentials(blocking)
    assert "".join(c.text for c in chunks) == blocking.text
    assert tuple(t for c in chunks for t in c.token_ids) == blocking.token_ids
    assert blocking.completion_tokens == len(blocking.token_ids) <= 6
    assert blocking.prompt_tokens == clean.count_tokens("The quick brown fox")


def _essentials(result: GenerationResult) -> tuple[object, ...]:
    """All but cached_tokens, which a repeated prompt earns from the prefix cache."""
    return (
        result.text,
        result.token_ids,
        result.finish_reason,
        result.prompt_tokens,
        result.completion_tokens,
    )


def test_the_ceiling_ends_a_call_when_prompt_plus_output_reach_it(clean: Backend) -> None:
    request = GenerationRequest(prompt=_ids(500, 10), max_tokens=30, ceiling_tokens=20)
    result = clean.generate(request)
    assert (result.finish_reason, result.completion_tokens) == ("ceiling", 10)


def test_the_budget_ends_a_call_when_its_next_block_would_not_fit(clean: Backend) -> None:
    clean.open_budget("contract-one-block", max_blocks=1)
    try:
        request = GenerationRequest(
            prompt=_ids(600, 10), max_tokens=30, budget="contract-one-block"
        )
        result = clean.generate(request)
        # 16 tokens of K/V fit one block; the 17th token is sampled but never written.
        assert (result.finish_reason, result.completion_tokens) == ("budget", BLOCK_SIZE + 1 - 10)
        too_long = GenerationRequest(prompt=_ids(700, 40), budget="contract-one-block")
        with pytest.raises(BackendError):
            clean.generate(too_long)
    finally:
        clean.close_budget("contract-one-block")


def test_calls_that_can_never_fit_are_refused_up_front(clean: Backend) -> None:
    with pytest.raises(BackendError):
        clean.generate(GenerationRequest(prompt=_ids(800, 10), ceiling_tokens=10))
    with pytest.raises(BackendError):
        clean.generate(GenerationRequest(prompt=_ids(800, (NUM_BLOCKS + 1) * BLOCK_SIZE)))


def test_counts_match_what_a_call_prefills(clean: Backend) -> None:
    assert clean.count_tokens("hello world") == 2
    result = clean.generate(GenerationRequest(messages=MESSAGES, max_tokens=1))
    assert result.prompt_tokens == clean.count_messages(MESSAGES)


def test_a_consumer_that_stops_returns_the_blocks(clean: Backend) -> None:
    async def main() -> None:
        request = GenerationRequest(prompt=_ids(900, 30), max_tokens=200)
        async with aclosing(clean.astream(request)) as chunks:
            await anext(chunks)
            assert clean.metrics().num_blocks_in_use > clean.metrics().num_blocks_pinned

    asyncio.run(main())
    _wait_until(lambda: _idle(clean))


def test_offload_moves_a_budget_to_host_until_restore(clean: Backend) -> None:
    clean.open_budget("contract-parked", max_blocks=16)

    async def main() -> GenerationResult:
        request = GenerationRequest(prompt=_ids(1000, 30), max_tokens=48, budget="contract-parked")
        result = None
        async with aclosing(clean.astream(request)) as chunks:
            await anext(chunks)
            clean.offload(budget="contract-parked")
            m = clean.metrics()
            assert m.num_blocks_swapped > 0 and m.num_requests_running == 0
            assert m.num_blocks_in_use == m.num_blocks_pinned
            clean.restore(budget="contract-parked")
            async for chunk in chunks:
                result = chunk.result
        assert result is not None
        return result

    try:
        assert asyncio.run(main()).finish_reason == "length"
        assert clean.metrics().num_blocks_swapped == 0
    finally:
        clean.close_budget("contract-parked")


def test_a_retained_context_holds_blocks_until_the_next_call(clean: Backend) -> None:
    clean.open_budget("contract-retained", max_blocks=16)
    try:
        assert clean.retain(budget="contract-retained") == 0  # nothing finished yet
        first = clean.generate(
            GenerationRequest(prompt=_ids(2000, 40), max_tokens=9, budget="contract-retained")
        )
        held = clean.retain(budget="contract-retained")
        assert held == 48  # 40 + 9 tokens, 48 with K/V: three full blocks
        in_use = clean.metrics().num_blocks_in_use
        assert in_use == clean.metrics().num_blocks_pinned + 3
        clean.offload(budget="contract-retained")
        assert clean.metrics().num_blocks_swapped == 3
        assert clean.metrics().num_blocks_in_use == in_use - 3
        clean.restore(budget="contract-retained")
        assert clean.metrics().num_blocks_in_use == in_use
        context = [*_ids(2000, 40), *first.token_ids, *_ids(3000, 5)]
        clean.generate(GenerationRequest(prompt=context, max_tokens=4, budget="contract-retained"))
        m = clean.metrics()  # the call took the hold over and returned it
        assert (m.num_blocks_in_use, m.num_blocks_swapped) == (m.num_blocks_pinned, 0)
        clean.retain(budget="contract-retained")
        clean.release_retained(budget="contract-retained")
        assert clean.metrics().num_blocks_in_use == clean.metrics().num_blocks_pinned
        clean.retain(budget="contract-retained")
        clean.offload(budget="contract-retained")
    finally:
        clean.close_budget("contract-retained")  # drops a hold, even an offloaded one
    m = clean.metrics()
    assert (m.num_blocks_in_use, m.num_blocks_swapped) == (m.num_blocks_pinned, 0)


def test_metrics_add_up(clean: Backend) -> None:
    m = clean.metrics()
    cap = clean.capacity()
    assert m.num_blocks_in_use + m.num_blocks_free == cap.num_blocks
    assert m.num_blocks_free == cap.num_free_blocks
    assert m.num_blocks_pinned == cap.num_pinned_blocks
    assert m.prefix_cache_hits <= m.prefix_cache_queries


@pytest.mark.parametrize("kind", ["fake", "local", "remote"])
def test_close_is_idempotent_and_final(kind: str, request: pytest.FixtureRequest) -> None:
    with _make(kind, request) as made:
        assert made.health().ok
    made.close()
    assert not made.health().ok
    with pytest.raises(BackendError, match="closed"):
        made.generate(GenerationRequest(prompt="hi"))
    with pytest.raises(BackendError, match="closed"):
        made.open_budget("late", max_blocks=1)
