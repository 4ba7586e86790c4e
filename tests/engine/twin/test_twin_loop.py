"""The real engine, through the real ``LocalBackend``, stepped by ``TwinEngineLoop`` on a
virtual-time event loop: agents are tasks, every step costs its modelled time, and the
same program gives the same times to the last bit."""

from __future__ import annotations

import asyncio

import pytest

from backends import LocalBackend
from engine.config import EngineConfig
from engine.engine import Engine
from engine.engine_loop import EngineInUseError
from engine.presets import get_preset
from engine.sampling import SamplingParams
from engine.twin import ModelShape, get_profile
from engine.twin.clock import VirtualClock
from engine.twin.event_loop import run_virtual
from engine.twin.twin_engine import TwinEngine, TwinError, attach_twin
from engine.twin.twin_loop import TwinEngineLoop
from governor.backend import GenerationRequest

TARGET = ModelShape.from_config(
    get_preset("llama-8b-random").config,
    name="llama-8b-random",
    activation_bits=16,
    weight_bits=4,
)
PROFILE = get_profile("rx9070xt")


def twin_engine(**options: bool) -> TwinEngine:
    engine = Engine(EngineConfig(model="tiny-random", device="cpu", num_blocks=48))
    return attach_twin(engine, profile=PROFILE, model_shape=TARGET, advance=False, **options)


def prompt(agent: int) -> list[int]:
    return [(t * 7 + agent * 13) % 400 + 1 for t in range(40 + 9 * agent)]


async def swarm(twin: TwinEngine) -> dict[int, tuple[float, tuple[int, ...]]]:
    """Four agents: each arrives, thinks on a 'tool' for a while, then calls the model."""
    loop = asyncio.get_running_loop()
    backend = LocalBackend(TwinEngineLoop(twin))
    ended: dict[int, tuple[float, tuple[int, ...]]] = {}

    async def agent(index: int) -> None:
        await asyncio.sleep(0.013 * index)
        request = GenerationRequest(prompt=prompt(index), max_tokens=6, temperature=0.0)
        result = await backend.agenerate(request)
        ended[index] = (loop.time(), tuple(result.token_ids))

    try:
        await asyncio.gather(*(agent(i) for i in range(4)))
    finally:
        backend.close()
    return ended


def test_agents_get_the_engines_own_tokens_at_the_modelled_times_and_bit_for_bit_twice() -> None:
    first, second = twin_engine(), twin_engine()
    ended = run_virtual(swarm(first), clock=first.clock)
    again = run_virtual(swarm(second), clock=second.clock)
    assert ended == again  # same times to the last bit, same tokens

    real = Engine(EngineConfig(model="tiny-random", device="cpu", num_blocks=48))
    for index, (at, tokens) in ended.items():
        [expected] = real.generate(prompt(index), SamplingParams(max_tokens=6, temperature=0.0))
        assert tokens == expected.token_ids  # the twin changes no token
        request_times = [t for t in first.times.values() if t.finish_s == at]
        assert request_times, "each agent hears back at the end of the step that finished it"
    # Time passed only as the twin charged it: the last answer came at the last step's end.
    assert max(at for at, _ in ended.values()) == first.busy_until == first.clock.now()
    assert first.compute_s > 0 and first.num_steps >= 6


def test_a_request_made_during_a_step_waits_for_the_next_one() -> None:
    twin = twin_engine()

    async def main() -> tuple[float, float, float]:
        loop = asyncio.get_running_loop()
        backend = LocalBackend(TwinEngineLoop(twin))
        try:
            first = asyncio.create_task(
                backend.agenerate(GenerationRequest(prompt=prompt(3), max_tokens=1))
            )
            await asyncio.sleep(0)  # the driver takes the first request and starts a step
            await asyncio.sleep(0)
            step_end = twin.busy_until
            await asyncio.sleep(step_end / 2)  # mid-step
            arrived = loop.time()
            await backend.agenerate(GenerationRequest(prompt=prompt(1), max_tokens=1))
            await first
            return step_end, arrived, loop.time()
        finally:
            backend.close()

    step_end, arrived, done = run_virtual(main(), clock=twin.clock)
    assert 0 < arrived < step_end < done  # it ran after the step in progress ended


def test_a_worker_threads_commands_hear_back_between_steps_one_at_a_time() -> None:
    """On the real loop a worker thread's command (the governor's hold, restore, release)
    is answered between the engine's steps, and the next one it sends waits for the step
    after; an idle engine answers at once."""
    twin = twin_engine()

    async def main() -> tuple[float, float, float, float, float, float]:
        loop = asyncio.get_running_loop()
        engine_loop = TwinEngineLoop(twin)
        backend = LocalBackend(engine_loop)
        try:
            idle_at = loop.time()
            await asyncio.to_thread(engine_loop.call, twin.engine.metrics)
            idle_answered = loop.time()
            running = asyncio.create_task(
                backend.agenerate(GenerationRequest(prompt=prompt(3), max_tokens=40))
            )
            await asyncio.sleep(0.001)  # mid-step
            sent, step_end, step_s = loop.time(), twin.busy_until, twin.last_step_s

            def twice() -> None:
                engine_loop.call(twin.engine.metrics)
                engine_loop.call(twin.engine.metrics)

            await asyncio.to_thread(twice)
            answered = loop.time()
            await running
            return idle_at, idle_answered, sent, step_end, answered, step_s
        finally:
            backend.close()

    idle_at, idle_answered, sent, step_end, answered, step_s = run_virtual(main(), clock=twin.clock)
    assert idle_answered == idle_at  # nothing running: answered at once
    assert sent < step_end
    # The first command waited for the step in progress, the second for one more step
    # (the twin charges the next step as long as the last, not knowing it yet).
    assert answered == pytest.approx(step_end + step_s)
    assert step_s > 0


def test_a_cancelled_call_and_close_return_every_block() -> None:
    twin = twin_engine()

    async def main() -> None:
        backend = LocalBackend(TwinEngineLoop(twin))
        call = asyncio.create_task(
            backend.agenerate(GenerationRequest(prompt=prompt(2), max_tokens=400))
        )
        await asyncio.sleep(0.2)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert twin.engine.block_manager.pool.num_in_use == 0
        running = asyncio.create_task(
            backend.agenerate(GenerationRequest(prompt=prompt(1), max_tokens=400))
        )
        await asyncio.sleep(0.2)
        assert twin.engine.has_unfinished()
        backend.close()  # aborts what runs, and gives the engine back
        assert not twin.engine.has_unfinished()
        assert twin.engine.block_manager.pool.num_in_use == 0
        assert (await running).finish_reason == "abort"  # as the engine thread's close

    run_virtual(main(), clock=twin.clock)
    LocalBackend(Engine(EngineConfig(model="tiny-random", num_blocks=8))).close()


def test_what_cannot_drive_a_twin_is_refused_with_what_to_do() -> None:
    twin = twin_engine()
    with pytest.raises(TwinError, match="inside the coroutine that run_virtual runs"):
        TwinEngineLoop(twin)
    advancing = attach_twin(
        Engine(EngineConfig(model="tiny-random", num_blocks=8)),
        profile=PROFILE,
        model_shape=TARGET,
    )

    async def main() -> None:
        with pytest.raises(TwinError, match="advance=False"):
            TwinEngineLoop(advancing)
        loop = TwinEngineLoop(twin)
        with pytest.raises(EngineInUseError):
            TwinEngineLoop(twin)
        loop.close()
        TwinEngineLoop(twin).close()  # given back: another loop may drive it

    run_virtual(main(), clock=VirtualClock())
