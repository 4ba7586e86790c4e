"""``LocalBackend`` on the tiny-random preset: real threads, real event loops, real blocks."""

from __future__ import annotations

import asyncio
import pickle
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from backends.local.backend import LocalBackend
from engine.config import EngineConfig
from engine.engine import Engine
from engine.engine_loop import EngineLoop
from engine.errors import BudgetExceededError, DuplicateBudgetError, EngineError
from governor.backend import Backend, GenerationRequest
from governor.errors import BackendError, ConfigError

SYSTEM = "You are a careful planner. Break every task into steps and name the files you touch."


@pytest.fixture(scope="module")
def backend() -> Iterator[LocalBackend]:
    with LocalBackend(config={"num_blocks": 256}) as made:
        yield made


def _settled(backend: LocalBackend) -> Callable[[], bool]:
    def check() -> bool:
        m = backend.metrics()
        return m.num_blocks_in_use == m.num_blocks_pinned and m.num_requests_running == 0

    return check


def _wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the engine to settle"
        time.sleep(0.01)


def test_it_wraps_an_engine_or_a_loop_and_owns_what_it_is_given() -> None:
    engine = Engine(EngineConfig(num_blocks=32))
    with LocalBackend(engine) as first:
        assert isinstance(first, Backend)
        assert (first.name, first.model) == ("local", "tiny-random")
        first.open_budget("kept", max_blocks=2)
    loop = EngineLoop(engine)
    second = LocalBackend(loop)
    with pytest.raises(DuplicateBudgetError):  # the engine's state outlives a backend
        second.open_budget("kept", max_blocks=2)
    second.close()
    with pytest.raises(EngineError):  # closing the backend closed the loop it was given
        loop.call(engine.capacity)
    with pytest.raises(ConfigError, match="not both"):
        LocalBackend(engine, config={"num_blocks": 8})
    with LocalBackend(engine) as third:  # one backend's loop drives the engine at a time
        with pytest.raises(ConfigError, match="another EngineLoop already drives this engine"):
            LocalBackend(engine)
        assert third.generate(GenerationRequest(prompt=[1, 2, 3], max_tokens=2)).completion_tokens


def test_bad_configuration_fails_at_construction() -> None:
    with pytest.raises(ConfigError, match=r"unknown engine setting.*'num_blockz'"):
        LocalBackend(config={"num_blockz": 8})
    with pytest.raises(ConfigError, match="cannot build the engine"):
        LocalBackend(config={"model": "/no/such/model"})
    with pytest.raises(ConfigError, match=r"takes an engine\.Engine"):
        LocalBackend("tiny-random")  # type: ignore[arg-type]


def test_engine_errors_are_backend_errors_with_their_fields(backend: LocalBackend) -> None:
    backend.open_budget("tiny", max_blocks=1)
    try:
        with pytest.raises(BudgetExceededError) as caught:
            backend.generate(GenerationRequest(prompt=list(range(1, 41)), budget="tiny"))
    finally:
        backend.close_budget("tiny")
    error = caught.value
    assert isinstance(error, BackendError)
    assert (error.needed, error.available, error.name) == (3, 1, "tiny")
    assert isinstance(error.__cause__, BudgetExceededError)
    assert not isinstance(error.__cause__, BackendError)
    assert str(error) == str(error.__cause__) == error.problem
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert (copy.needed, copy.available, str(copy)) == (3, 1, str(error))


def test_health_names_the_model_and_the_device(backend: LocalBackend) -> None:
    health = backend.health()
    assert health.ok
    assert "tiny-random" in health.detail and "cpu" in health.detail


def test_a_result_carries_the_engines_own_time_within_the_call(backend: LocalBackend) -> None:
    started = time.perf_counter()
    result = backend.generate(GenerationRequest(prompt=list(range(900, 920)), max_tokens=3))
    whole = time.perf_counter() - started
    assert result.engine_s is not None and 0 < result.engine_s < whole


def test_asyncio_and_threads_share_the_engine_at_once(backend: LocalBackend) -> None:
    requests = [
        GenerationRequest(prompt=f"Agent {i} reports: step {i * 7} of the plan", max_tokens=8)
        for i in range(12)
    ]
    expected = [backend.generate(r).token_ids for r in requests]
    results: dict[int, tuple[int, ...]] = {}
    go = threading.Event()

    def worker(i: int) -> None:
        go.wait()
        results[i] = backend.generate(requests[i]).token_ids

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8, 12)]
    for thread in threads:
        thread.start()

    async def main() -> None:
        go.set()
        done = await asyncio.gather(*(backend.agenerate(r) for r in requests[:8]))
        results.update({i: result.token_ids for i, result in enumerate(done)})

    asyncio.run(main())
    for thread in threads:
        thread.join(timeout=60)
    assert [results[i] for i in range(12)] == expected
    _wait_until(_settled(backend))


def test_a_cancelled_consumer_frees_its_blocks(backend: LocalBackend) -> None:
    async def main() -> None:
        first = asyncio.Event()

        async def consume() -> None:
            request = GenerationRequest(prompt="Write a very long story.", max_tokens=2000)
            async for _ in backend.astream(request):
                first.set()

        task = asyncio.create_task(consume())
        await first.wait()
        assert backend.metrics().num_blocks_in_use > 0
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    _wait_until(_settled(backend), timeout_s=5)


def test_a_call_cancelled_while_it_is_being_queued_is_aborted(backend: LocalBackend) -> None:
    async def main() -> None:
        request = GenerationRequest(prompt="Count to a thousand.", max_tokens=2000)
        task = asyncio.create_task(backend.agenerate(request))
        await asyncio.sleep(0)  # it is now waiting on the engine thread to queue it
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    _wait_until(_settled(backend), timeout_s=5)  # 2000 tokens would take far longer


def test_a_pinned_text_prefix_serves_a_later_prompt(backend: LocalBackend) -> None:
    handle = backend.pin_prefix(SYSTEM)
    try:
        assert handle.num_tokens == backend.count_tokens(SYSTEM)
        assert handle.num_pinned_tokens == handle.num_blocks * 16 > 0
        result = backend.generate(GenerationRequest(prompt=SYSTEM + " Plan it.", max_tokens=2))
        assert result.cached_tokens == handle.num_pinned_tokens
    finally:
        backend.unpin_prefix(handle)


def test_count_messages_is_the_prompt_a_chat_call_prefills(backend: LocalBackend) -> None:
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Rename utils.py to helpers.py everywhere."},
        {"role": "assistant", "content": "Step 1: find the imports."},
        {"role": "user", "content": "Go on."},
    ]
    result = backend.generate(GenerationRequest(messages=messages, max_tokens=3))
    assert result.prompt_tokens == backend.count_messages(messages)
    assert backend.count_messages(messages) > sum(
        backend.count_tokens(m["content"]) for m in messages
    )


def test_the_engine_thread_outlives_event_loops_that_close_mid_stream(
    backend: LocalBackend,
) -> None:
    async def first_chunk_only() -> None:
        async for _ in backend.astream(GenerationRequest(prompt="Keep going", max_tokens=64)):
            break

    for _ in range(3):
        asyncio.run(first_chunk_only())
    _wait_until(_settled(backend))
    assert backend.generate(GenerationRequest(prompt="still here", max_tokens=2)).completion_tokens


def test_a_consumer_that_fell_behind_gets_the_steps_it_missed_in_one_chunk(
    backend: LocalBackend,
) -> None:
    """A reader that keeps up gets a chunk per step; one that fell behind (a server
    writing to a slow socket) gets what it missed merged, and nothing is lost."""
    request = GenerationRequest(prompt="Keep going", max_tokens=24)

    async def main() -> tuple[list[tuple[int, ...]], tuple[int, ...]]:
        chunks: list[tuple[int, ...]] = []
        stream = backend.astream(request)
        first = await anext(stream)
        chunks.append(first.token_ids)
        # Behind: the engine finishes the call while nobody reads (off the event loop,
        # so the engine thread's outputs queue up here).
        await asyncio.to_thread(_wait_until, _settled(backend))
        async for chunk in stream:
            if chunk.result is not None:
                return chunks, chunk.result.token_ids
            chunks.append(chunk.token_ids)
        raise AssertionError("the stream ended without its result")

    chunks, token_ids = asyncio.run(main())
    assert sum(chunks, ()) == token_ids and len(token_ids) == 24
    assert len(chunks) == 2  # the first step's token, then the 23 it missed in one


def test_capacity_reports_the_weights_memory() -> None:
    with LocalBackend(config={"num_blocks": 16}) as backend:
        cap = backend.capacity()
    assert cap.weights_bytes == 29_474_304 * 4  # tiny-random's parameters in float32


@pytest.mark.parametrize("prompt_chars", [16, 8_000], ids=["engine-thread", "worker-thread"])
def test_a_call_cancelled_while_its_prompt_is_tokenized_leaves_nothing_running(
    backend: LocalBackend, monkeypatch: pytest.MonkeyPatch, prompt_chars: int
) -> None:
    """The caller is cancelled while its prompt is still being tokenized (a short one on
    the engine thread as it is added, a long one on a worker thread before): what the
    caller does next (its lease released, the budget closed) must reach the engine after
    the request's abort, never between the request and it, and no request may be left
    running with nobody listening."""
    prompt_of = backend._prompt_of
    tokenized_on: list[str] = []

    def slow_prompt_of(request: GenerationRequest) -> Any:
        tokenized_on.append(threading.current_thread().name)
        time.sleep(0.3)  # tokenizing a long prompt on a loaded host
        return prompt_of(request)

    monkeypatch.setattr(backend, "_prompt_of", slow_prompt_of)
    backend.open_budget("cancelled-agent", max_blocks=64)
    text = ("Plan the work. " * (prompt_chars // 15 + 1))[:prompt_chars]
    request = GenerationRequest(
        messages=[{"role": "user", "content": text}], max_tokens=200, budget="cancelled-agent"
    )

    async def main() -> None:
        call = asyncio.ensure_future(backend.agenerate(request))
        await asyncio.sleep(0.05)  # the prompt is being tokenized
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        backend.close_budget("cancelled-agent")  # as a released lease does: no error

    asyncio.run(main())
    assert len(tokenized_on) == 1
    assert (tokenized_on[0] == "kvgov-engine") == (prompt_chars <= 4096)
    _wait_until(_settled(backend))


def test_agenerate_makes_one_hand_off_each_way(backend: LocalBackend) -> None:
    """A non-streamed call from an event loop (kvgov serve's) is queued on the engine
    thread without a worker thread's hop (each costs a wake-up and a GIL hand-off on a
    loaded server), its short prompt tokenized there, and wakes the loop once, at its
    end, however many tokens it makes. The loop's default executor refuses work here, so
    a hop through the thread pool fails the call."""

    class NoWorkers(ThreadPoolExecutor):
        def submit(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("agenerate handed work to a worker thread")

    chat = [{"role": "user", "content": "Count the files."}]

    async def hops(max_tokens: int) -> tuple[int, tuple[int, ...]]:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(NoWorkers(max_workers=1))
        counted = [0]
        schedule = loop.call_soon_threadsafe

        def counting(*args: Any, **kwargs: Any) -> Any:
            counted[0] += 1
            return schedule(*args, **kwargs)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        result = await backend.agenerate(GenerationRequest(messages=chat, max_tokens=max_tokens))
        assert result.completion_tokens == max_tokens
        return counted[0], result.token_ids

    short, _ = asyncio.run(hops(2))
    long, token_ids = asyncio.run(hops(32))
    assert long == short == 1  # the request's end, nothing else
    assert token_ids == backend.generate(GenerationRequest(messages=chat, max_tokens=32)).token_ids


def test_agenerate_cancelled_mid_call_frees_its_blocks(backend: LocalBackend) -> None:
    async def main() -> None:
        request = GenerationRequest(prompt="Write a very long story.", max_tokens=2000)
        task = asyncio.create_task(backend.agenerate(request))
        deadline = time.monotonic() + 10
        while backend.metrics().num_requests_running == 0:
            assert time.monotonic() < deadline, "the call never started"
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    _wait_until(_settled(backend), timeout_s=5)  # 2000 tokens would take far longer
