"""Engine steps run on one thread while the host is contended, on the caller's otherwise.

The contended host is simulated by a clock: a step's time depends on how many threads it
ran on, as measured on the 2-core machine (``engine.step_threads``). The engine test then
checks the premise the module rests on: one thread computes the same tokens as two."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.errors import InvalidRequestError
from engine.sampling import SamplingParams
from engine.step_threads import StepThreads

QUIET = {2: 5e-3, 1: 7e-3}  # seconds a decode step takes on 2 threads and on 1
CONTENDED = {2: 40e-3, 1: 8e-3}  # another process holds a core: 2 threads wait


@pytest.fixture
def two_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


class Host:
    """A clock that a step advances by its time on the threads it runs on."""

    def __init__(self) -> None:
        self.now = 0.0
        self.times = QUIET
        self.threads_seen: list[int] = []

    def clock(self) -> float:
        return self.now

    def step(self) -> int:
        threads = torch.get_num_threads()
        self.threads_seen.append(threads)
        self.now += self.times[threads]
        return threads


def _decode(runner: StepThreads, host: Host, steps: int, batch: int = 8) -> list[int]:
    return [runner.run(host.step, batch=batch) for _ in range(steps)]


def test_a_quiet_host_keeps_the_callers_threads_and_probes_less_and_less(two_threads: None) -> None:
    host = Host()
    runner = StepThreads(clock=host.clock)
    threads = _decode(runner, host, 400)
    assert not runner.narrow
    assert torch.get_num_threads() == 2  # put back after every step
    probes = [i for i, (a, b) in enumerate(zip([2, *threads], threads, strict=False)) if b < a]
    # A probe after 16 decode steps, then 32, 64, ...: each found one thread slower.
    assert probes[:4] == [16, 16 + 3 + 32, 16 + 3 + 32 + 3 + 64, 16 + 3 + 32 + 3 + 64 + 3 + 128]
    assert threads.count(1) == 3 * len(probes)
    assert (runner.steps, runner.narrow_steps) == (400, threads.count(1))


def test_a_contended_host_moves_steps_to_one_thread_and_back_when_it_quietens(
    two_threads: None,
) -> None:
    host = Host()
    runner = StepThreads(clock=host.clock)
    _decode(runner, host, 200)
    host.times = CONTENDED
    threads = _decode(runner, host, 40)
    # The first slow step (4x the fastest recent one) brings a probe forward: two more
    # steps on two threads, three on one, then the steps run on one thread.
    assert threads[:7] == [2, 2, 2, 1, 1, 1, 1]
    assert runner.narrow
    assert threads[5:].count(2) <= 2 * 3  # probes of two threads, 16 then 32 steps apart
    assert torch.get_num_threads() == 2  # the caller's count is untouched between steps
    host.times = QUIET
    threads = _decode(runner, host, 60)
    assert not runner.narrow
    assert threads[-10:] == [2] * 10


def test_other_steps_run_on_the_count_in_force_and_are_not_timed(two_threads: None) -> None:
    host = Host()
    runner = StepThreads(clock=host.clock)
    host.times = CONTENDED
    prefills = [runner.run(host.step, batch=None) for _ in range(50)]
    assert prefills == [2] * 50  # nothing compared them: no probe, no switch
    assert not runner.narrow


def test_one_caller_thread_is_left_alone() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        host = Host()
        host.times = {1: 1e-3}
        runner = StepThreads(clock=host.clock)
        assert _decode(runner, host, 100) == [1] * 100
    finally:
        torch.set_num_threads(before)


def test_one_thread_computes_the_tokens_two_do(two_threads: None) -> None:
    """The premise of switching mid-request: the model's kernels split rows and heads
    across threads, never a sum, so the tokens cannot depend on the count."""
    engine = Engine(EngineConfig(num_blocks=256, seed=0, adapt_cpu_threads=False))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 100_000, (n,), generator=g).tolist() for n in (40, 129, 7, 300)]
    greedy = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    two = [c.token_ids for c in engine.generate(prompts, greedy)]
    engine.reset_prefix_cache()
    torch.set_num_threads(1)
    one = [c.token_ids for c in engine.generate(prompts, greedy)]
    assert one == two


def test_the_engine_adapts_on_the_cpu_and_leaves_the_callers_count(two_threads: None) -> None:
    engine = Engine(EngineConfig(num_blocks=256, seed=0))
    assert isinstance(engine.runner.threads, StepThreads)
    greedy = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    engine.generate([[1, 2, 3]] * 4, greedy)
    assert torch.get_num_threads() == 2
    off = Engine(EngineConfig(num_blocks=256, seed=0, adapt_cpu_threads=False))
    assert off.runner.threads is None
    with pytest.raises(InvalidRequestError, match="adapt_cpu_threads"):
        EngineConfig(adapt_cpu_threads="yes")  # type: ignore[arg-type]


def test_one_slow_step_is_noise_not_a_switch(two_threads: None) -> None:
    host = Host()
    runner = StepThreads(clock=host.clock)
    _decode(runner, host, 200)
    host.times = CONTENDED
    _decode(runner, host, 1)
    host.times = QUIET
    threads = _decode(runner, host, 20)
    assert threads[:5] == [2, 2, 1, 1, 1]  # the probe, brought forward, found no gain
    assert not runner.narrow
    assert threads[5:] == [2] * 15
