"""Step-time noise: a seeded, mean-one scatter on the twin's modelled steps, measured
from real steps timed in order beside their predictions."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence

import pytest

from engine.config import EngineConfig
from engine.engine import Engine
from engine.sampling import SamplingParams
from engine.scheduler import ScheduledChunk
from engine.twin import ModelShape, NoiseError, StepBatch, StepNoise, StepTimeModel, get_profile
from engine.twin.twin_engine import attach_twin


def test_the_same_seed_draws_the_same_factors_and_another_seed_others() -> None:
    a, b, c = StepNoise(0.1, seed=3), StepNoise(0.1, seed=3), StepNoise(0.1, seed=4)
    first = [a.factor() for _ in range(50)]
    assert first == [b.factor() for _ in range(50)]
    assert first != [c.factor() for _ in range(50)]
    # fresh() starts over from its seed, whatever was drawn before
    assert [a.fresh(3).factor() for _ in range(1)] == first[:1]


def test_the_factor_is_mean_one_with_the_asked_spread() -> None:
    noise = StepNoise(0.2, seed=0)
    factors = [noise.factor() for _ in range(40_000)]
    assert statistics.fmean(factors) == pytest.approx(1.0, abs=0.01)
    assert statistics.pstdev(math.log(f) for f in factors) == pytest.approx(0.2, rel=0.03)
    assert all(StepNoise(0.0).factor() == 1.0 for _ in range(3))


def test_measured_reads_the_step_to_step_noise_not_the_models_error_or_a_drift() -> None:
    # Steps whose model is 30% off for one kind of batch and whose host slows by half
    # over the run, with 8% noise on top: the measured sigma is the 8%, not the rest.
    rng = random.Random(1)
    steps = []
    for i in range(4000):
        predicted = 0.010 if i % 400 < 200 else 0.020  # two kinds of batch, in runs
        bias = 1.3 if predicted == 0.020 else 1.0
        drift = 1 + 0.5 * i / 4000
        steps.append((predicted * bias * drift * rng.lognormvariate(0, 0.08), predicted))
    assert StepNoise.measured(steps).sigma == pytest.approx(0.08, rel=0.1)


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([(0.1, 0.1), (0.1, 0.1)], "at least 3"),
        ([(0.1, 0.1), (0.0, 0.1), (0.1, 0.1)], "some time"),
        ([(0.1, 0.1), (0.1, -1.0), (0.1, 0.1)], "some time"),
    ],
)
def test_measured_refuses_what_it_cannot_read(
    steps: list[tuple[float, float]], message: str
) -> None:
    with pytest.raises(NoiseError, match=message):
        StepNoise.measured(steps)


@pytest.mark.parametrize("sigma", [-0.1, math.inf, math.nan])
def test_a_sigma_that_is_no_spread_is_refused(sigma: float) -> None:
    with pytest.raises(NoiseError, match="finite number >= 0"):
        StepNoise(sigma)


def test_the_twin_scales_each_steps_modelled_compute_by_the_next_factor() -> None:
    profile = get_profile("rx9070xt")
    engine = Engine(EngineConfig(model="tiny-random", device="cpu", num_blocks=24))
    shape = ModelShape.from_config(engine.model_config, name="tiny-random", activation_bits=32)
    sampling = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    batches: list[StepBatch] = []
    execute = engine.runner.execute

    def spy(chunks: Sequence[ScheduledChunk]) -> list[int | None]:
        batches.append(StepBatch.of_chunks(chunks))
        return execute(chunks)

    engine.runner.execute = spy  # type: ignore[method-assign]

    def compute(noise: StepNoise | None) -> float:
        engine.reset_prefix_cache()
        batches.clear()
        twin = attach_twin(engine, profile=profile, model_shape=shape, noise=noise)
        try:
            engine.generate(list(range(1, 40)), sampling)
        finally:
            twin.detach()
        assert twin.num_steps == len(batches) == 6
        return twin.compute_s

    model = StepTimeModel(profile)
    assert compute(None) == pytest.approx(sum(model.seconds(shape, b) for b in batches))
    noisy = compute(StepNoise(0.3, seed=5))
    draws = StepNoise(0.3, seed=5)
    expected = sum(model.seconds(shape, b) * draws.factor() for b in batches)
    assert noisy == pytest.approx(expected, rel=1e-12)
    assert compute(StepNoise(0.3, seed=5)) == noisy
    assert compute(StepNoise(0.3, seed=6)) != noisy
