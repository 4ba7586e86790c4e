"""``FakeBackend``: scripted output, real block accounting, waiting, offload, threads."""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import aclosing

import pytest

from governor.backend import GenerationRequest
from governor.errors import BackendError, ConfigError
from governor.testing import FakeBackend
from governor.tokens import TokenCounter


def _ids(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def test_the_default_reply_is_filler_of_max_tokens_tokens() -> None:
    backend = FakeBackend()
    result = backend.generate(GenerationRequest(prompt="hi", max_tokens=4))
    assert (result.text, result.finish_reason, result.completion_tokens) == (
        " hello" * 4,
        "length",
        4,
    )


def test_an_empty_reply_finishes_at_once() -> None:
    backend = FakeBackend(responder=lambda request: "")
    result = backend.generate(GenerationRequest(prompt="ping", max_tokens=5))
    assert (result.text, result.token_ids, result.finish_reason) == ("", (), "stop")
    assert result.completion_tokens == 0
    assert backend.metrics().num_blocks_in_use == 0


def test_a_responder_scripts_the_reply_and_every_call_is_recorded() -> None:
    backend = FakeBackend(responder=lambda request: f"Échoing {request.prompt}. Done.")
    first = GenerationRequest(prompt="ping", max_tokens=50)
    result = backend.generate(first)
    assert (result.text, result.finish_reason) == ("Échoing ping. Done.", "stop")
    assert result.completion_tokens == TokenCounter().count("Échoing ping. Done.")
    cut = backend.generate(GenerationRequest(prompt="pong", max_tokens=50, stop=(". D",)))
    assert (cut.text, cut.finish_reason) == ("Échoing pong", "stop")
    with pytest.raises(BackendError):
        backend.generate(GenerationRequest(prompt="x", ceiling_tokens=1))
    assert [r.prompt for r in backend.calls] == ["ping", "pong", "x"]


def test_stream_chunks_join_to_the_text_even_across_split_characters() -> None:
    backend = FakeBackend(responder=lambda request: "naïve café 🚀 ok")

    async def main() -> list[str]:
        return [c.text async for c in backend.astream(GenerationRequest(prompt="go"))]

    pieces = asyncio.run(main())
    assert "".join(pieces) == "naïve café 🚀 ok"
    assert "\ufffd" not in "".join(pieces)


def test_chat_messages_are_counted_with_the_token_counter() -> None:
    messages = [{"role": "user", "content": "What is a KV block?"}]
    backend = FakeBackend()
    result = backend.generate(GenerationRequest(messages=messages, max_tokens=1))
    assert result.prompt_tokens == TokenCounter().count_messages(messages)
    assert result.cached_tokens == 0


def test_a_call_holds_the_blocks_of_every_token_but_the_newest() -> None:
    backend = FakeBackend(num_blocks=8, block_size=16)
    # 20 prompt + 13 output = 33 tokens; K/V for 32 of them: exactly 2 blocks.
    backend.generate(GenerationRequest(prompt=_ids(1, 20), max_tokens=13))
    assert backend.peak_blocks_in_use == 2
    backend.generate(GenerationRequest(prompt=_ids(1, 20), max_tokens=14))
    assert backend.peak_blocks_in_use == 3
    assert backend.metrics().num_blocks_in_use == 0


def test_the_whole_pool_acts_as_a_budget_for_a_call_alone() -> None:
    backend = FakeBackend(num_blocks=2, block_size=16)
    result = backend.generate(GenerationRequest(prompt=_ids(1, 10), max_tokens=100))
    assert (result.finish_reason, result.completion_tokens) == ("budget", 2 * 16 + 1 - 10)


def test_pins_share_blocks_and_hold_them_until_unpinned() -> None:
    backend = FakeBackend(num_blocks=8)
    prefix = _ids(100, 48)
    first = backend.pin_prefix(prefix)
    second = backend.pin_prefix(prefix[:32])  # its blocks are the first two of the first
    assert backend.capacity().num_pinned_blocks == 3
    backend.unpin_prefix(first)
    assert backend.capacity().num_pinned_blocks == 2
    result = backend.generate(GenerationRequest(prompt=[*prefix, 1], max_tokens=1))
    assert result.cached_tokens == 32
    backend.unpin_prefix(second)
    assert backend.capacity().num_pinned_blocks == 0
    with pytest.raises(BackendError, match="free block"):
        backend.pin_prefix(_ids(1, 16 * 9))


def test_an_unpinned_block_stays_in_use_while_calls_share_it() -> None:
    backend = FakeBackend(num_blocks=8)
    handle = backend.pin_prefix(_ids(100, 32))

    async def main() -> None:
        request = GenerationRequest(prompt=_ids(100, 40), max_tokens=4)
        async with aclosing(backend.astream(request)) as chunks:
            await anext(chunks)
            assert backend.metrics().num_blocks_in_use == 3  # 2 shared + 1 of its own
            backend.unpin_prefix(handle)
            m = backend.metrics()
            assert (m.num_blocks_in_use, m.num_blocks_pinned) == (3, 0)

    asyncio.run(main())
    assert backend.metrics().num_blocks_in_use == 0


def test_a_prompt_equal_to_a_pinned_prefix_still_computes_its_last_token() -> None:
    backend = FakeBackend()
    backend.pin_prefix(_ids(100, 32))
    result = backend.generate(GenerationRequest(prompt=_ids(100, 32), max_tokens=1))
    assert result.cached_tokens == 16  # as the engine: at least one prompt token is computed


def test_async_calls_wait_for_blocks_instead_of_failing() -> None:
    backend = FakeBackend(num_blocks=4, block_size=16, latency_s=0.002)
    request = GenerationRequest(prompt=_ids(1, 20), max_tokens=20)  # 39 tokens: 3 blocks

    async def main() -> None:
        results = await asyncio.gather(*(backend.agenerate(request) for _ in range(4)))
        assert {r.finish_reason for r in results} == {"length"}

    asyncio.run(main())
    assert backend.peak_blocks_in_use == 3
    assert backend.metrics().num_blocks_in_use == 0


def test_threads_wait_for_blocks_too() -> None:
    backend = FakeBackend(num_blocks=4, block_size=16, latency_s=0.002)
    request = GenerationRequest(prompt=_ids(1, 20), max_tokens=20)
    results = []

    def worker() -> None:
        results.append(backend.generate(request))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert [r.finish_reason for r in results] == ["length"] * 4
    assert backend.peak_blocks_in_use == 3


def test_a_blocking_call_on_the_event_loop_that_holds_the_blocks_raises() -> None:
    backend = FakeBackend(num_blocks=4, block_size=16)
    request = GenerationRequest(prompt=_ids(1, 20), max_tokens=20)

    async def main() -> None:
        async with aclosing(backend.astream(request)) as chunks:
            await anext(chunks)
            with pytest.raises(BackendError, match="use await agenerate"):
                backend.generate(request)

    asyncio.run(main())


def test_budget_siblings_queue_for_their_budget() -> None:
    backend = FakeBackend(latency_s=0.002)
    backend.open_budget("lease", max_blocks=3)
    request = GenerationRequest(prompt=_ids(1, 20), max_tokens=20, budget="lease")

    async def main() -> None:
        results = await asyncio.gather(*(backend.agenerate(request) for _ in range(3)))
        assert {r.finish_reason for r in results} == {"length"}

    asyncio.run(main())
    assert backend.peak_blocks_in_use == 3
    backend.close_budget("lease")


def test_offloaded_calls_pause_until_restored() -> None:
    backend = FakeBackend(num_blocks=8, num_host_blocks=2)
    backend.open_budget("parked", max_blocks=8)
    backend.open_budget("big", max_blocks=8)

    async def main() -> None:
        small = GenerationRequest(prompt=_ids(1, 20), max_tokens=5, budget="parked")
        big = GenerationRequest(prompt=_ids(1, 40), max_tokens=5, budget="big")
        async with (
            aclosing(backend.astream(small)) as chunks,
            aclosing(backend.astream(big)) as others,
        ):
            await anext(chunks)
            await anext(others)
            with pytest.raises(BackendError, match="host block"):
                backend.offload(budget="big")  # 3 blocks, 2 host blocks: nothing moves
            backend.offload(budget="parked")
            assert backend.metrics().num_blocks_swapped == 2
            paused = asyncio.ensure_future(anext(chunks))
            await asyncio.sleep(0.01)
            assert not paused.done()
            backend.restore(budget="parked")
            assert (await paused).text == " hello"
            assert backend.metrics().num_blocks_swapped == 0

    asyncio.run(main())


def test_close_aborts_calls_in_flight() -> None:
    backend = FakeBackend(latency_s=0.01)
    results = []
    thread = threading.Thread(
        target=lambda: results.append(backend.generate(GenerationRequest(prompt="x")))
    )
    thread.start()
    time.sleep(0.05)
    backend.close()
    thread.join(timeout=10)
    assert results[0].finish_reason == "abort"
    assert 0 < results[0].completion_tokens < 256


def test_latency_is_spent_per_token() -> None:
    backend = FakeBackend(latency_s=0.01)
    start = time.perf_counter()
    backend.generate(GenerationRequest(prompt="x", max_tokens=5))
    assert time.perf_counter() - start >= 0.05


def test_many_threads_and_budgets_leave_nothing_behind() -> None:
    backend = FakeBackend(num_blocks=16, block_size=4)
    for i in range(4):
        backend.open_budget(f"lease-{i}", max_blocks=6)

    reasons: list[str] = []

    def worker(i: int) -> None:
        for n in range(1, 25):  # prompts of up to 6 blocks: each fits its budget
            budget = f"lease-{i % 4}"
            request = GenerationRequest(prompt=_ids(n, n), max_tokens=n % 7 + 1, budget=budget)
            reasons.append(backend.generate(request).finish_reason)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    m = backend.metrics()
    assert (m.num_blocks_in_use, m.num_requests_running, m.num_requests_waiting) == (0, 0, 0)
    assert backend.peak_blocks_in_use <= 16
    assert len(backend.calls) == len(reasons) == 8 * 24
    assert set(reasons) <= {"length", "budget"}
    for i in range(4):
        backend.close_budget(f"lease-{i}")


@pytest.mark.parametrize(
    ("settings", "setting"),
    [
        ({"num_blocks": 0}, "num_blocks"),
        ({"block_size": True}, "block_size"),
        ({"latency_s": -1}, "latency_s"),
        ({"responder": "hello"}, "responder"),
        ({"num_host_blocks": -1}, "num_host_blocks"),
    ],
)
def test_bad_settings_fail_at_construction(settings: dict[str, object], setting: str) -> None:
    with pytest.raises(ConfigError) as caught:
        FakeBackend(**settings)  # type: ignore[arg-type]
    assert caught.value.setting == setting
