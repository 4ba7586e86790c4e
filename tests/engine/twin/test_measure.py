"""Measuring a step-time grid on the real engine (tiny-random on the CPU): each sample's
batch is one the model runner really computed, times are real and grow with the work, and
the engine is left as it was found (no request, block or wrapper left behind)."""

from __future__ import annotations

import json
import logging
import math
import socket
import time
from collections import Counter

import pytest

from engine import Engine
from engine.scheduler import ScheduledChunk
from engine.twin import SequenceWork, StepBatch
from engine.twin import measure as measure_module
from engine.twin.measure import (
    MAX_TRIES_PER_REPEAT,
    GridPoint,
    default_points,
    grid_engine_config,
    measure_grid,
    quiet_switches,
    recorded_here,
)

SMALL = GridPoint(num_decode_seqs=1, num_decode_context_tokens=16)
DECODE = GridPoint(num_decode_seqs=4, num_decode_context_tokens=64)
LARGE = GridPoint(num_decode_seqs=16, num_decode_context_tokens=1024)
PREFILL = GridPoint(num_prefill_tokens=32)
CACHED = GridPoint(num_prefill_tokens=32, num_prefill_context_tokens=64)
MIXED = GridPoint(num_decode_seqs=4, num_decode_context_tokens=64, num_prefill_tokens=32)
POINTS = (SMALL, DECODE, LARGE, PREFILL, CACHED, MIXED)
REPEATS = 3


@pytest.fixture(scope="module")
def measured() -> tuple[Engine, list[StepBatch], list]:
    """One measurement of ``POINTS``, with every batch the runner computed, read by a spy
    on the runner's ``execute`` installed before the measurement's own recorder."""
    config = grid_engine_config(model="tiny-random", device="cpu", points=POINTS, repeats=REPEATS)
    engine = Engine(config)
    computed: list[StepBatch] = []
    execute = engine.runner.execute

    def spy(chunks: list[ScheduledChunk]) -> list[int | None]:
        computed.append(
            StepBatch(
                tuple(SequenceWork(c.num_tokens, c.request.num_computed_tokens) for c in chunks)
            )
        )
        return execute(chunks)

    engine.runner.execute = spy
    samples = measure_grid(engine, device="cpu-here", points=POINTS, repeats=REPEATS)
    assert engine.runner.execute is spy  # the measurement's recorder is gone again
    del engine.runner.execute
    return engine, computed, samples


def test_each_sample_is_a_batch_the_runner_computed(measured) -> None:
    _, computed, samples = measured
    assert [s.device for s in samples] == ["cpu-here"] * len(POINTS)
    for sample in samples:
        assert sample.batch in computed, sample.batch


def test_only_the_warm_up_and_the_points_steps_run_the_model(measured) -> None:
    # Setting a point up (its contexts prefilled, its requests run to their end) runs no
    # model: no step of it is timed. So the model runs the 64-token warm-up prefill and
    # its decodes, and each point's own steps: decodes and the 32-token prefills, never
    # LARGE's 16 contexts of 1,024 tokens or CACHED's 64-token context.
    _, computed, _ = measured
    chunks = Counter(s.num_new_tokens for batch in computed for s in batch.sequences)
    assert set(chunks) == {1, 32, 64}, chunks
    assert chunks[64] == 1, chunks


def test_a_decode_point_records_the_contexts_the_engine_had(measured) -> None:
    _, _, samples = measured
    decode = samples[POINTS.index(DECODE)].batch
    assert decode.num_sequences == 4
    assert all(s.num_new_tokens == 1 for s in decode.sequences)
    # A warm-up step and the tries before the median one have each added a token: the
    # engine's real contexts, not the 64 asked for.
    contexts = {s.num_context_tokens for s in decode.sequences}
    most = 64 + 2 + len(POINTS) * (1 + MAX_TRIES_PER_REPEAT * REPEATS)
    assert all(64 < c <= most for c in contexts), contexts


def test_prefill_and_mixed_points_record_their_chunks(measured) -> None:
    _, _, samples = measured
    assert samples[POINTS.index(PREFILL)].batch == StepBatch((SequenceWork(32, 0),))
    # The 64-token context came from the prefix cache: only the new 32 tokens ran.
    assert samples[POINTS.index(CACHED)].batch == StepBatch((SequenceWork(32, 64),))
    mixed = samples[POINTS.index(MIXED)].batch.sequences
    assert [s.num_new_tokens for s in mixed] == [1, 1, 1, 1, 32]
    assert mixed[-1].num_context_tokens == 0 and all(s.num_context_tokens > 64 for s in mixed[:4])


def test_times_are_real_and_grow_with_the_work(measured) -> None:
    _, _, samples = measured
    assert all(math.isfinite(s.seconds) and s.seconds > 0 for s in samples)
    small, large = samples[POINTS.index(SMALL)], samples[POINTS.index(LARGE)]
    assert large.batch.num_sequences == 16
    # 16 x 1,024 tokens of context against 1 x 16: attention over 1,000 times the KV and
    # 16 rows of the LM head; a wide margin for a shared, loaded host.
    assert large.seconds > 1.5 * small.seconds, (small.seconds, large.seconds)


def test_the_engine_is_left_as_it_was_found(measured) -> None:
    engine, _, samples = measured
    assert not engine.has_unfinished()
    assert engine.metrics().num_blocks_in_use == 0
    assert not engine._requests  # every request the measurement added is forgotten
    assert {s.model.name for s in samples} == {"tiny-random"}
    assert samples[0].model.num_layers == engine.model_config.num_layers
    assert samples[0].model.activation_bits == 32 and samples[0].attention == "paged"


def test_recorded_says_where_but_not_which_host(measured) -> None:
    engine, _, _ = measured
    recorded = recorded_here(engine)
    assert recorded["device_type"] == "cpu" and recorded["dtype"] == "float32"
    assert recorded["attention"] == "paged" and recorded["torch"]
    assert socket.gethostname() not in json.dumps(recorded)


def test_the_default_grids_cover_decode_prefill_and_mixed_batches() -> None:
    for quick in (True, False):
        points = default_points(quick=quick)
        assert any(p.num_decode_seqs and not p.num_prefill_tokens for p in points)
        assert any(p.num_prefill_context_tokens for p in points)
        assert any(p.num_decode_seqs and p.num_prefill_tokens for p in points)
    assert len(default_points(quick=True)) < len(default_points())


@pytest.mark.parametrize(
    "fields",
    [{}, {"num_decode_seqs": 2}, {"num_prefill_tokens": -1}, {"num_decode_seqs": True}],
)
def test_a_point_that_asks_for_no_work_is_refused(fields) -> None:
    with pytest.raises(ValueError, match="GridPoint"):
        GridPoint(**fields)


class Contention:
    """Another process holding a core, faked: this host cannot be made to preempt the
    engine on cue. Inside a timed step (between the measurement's two reads of the switch
    counter), the 2nd to ``1 + num_disturbed``-th step of each batch shape (the 1st is its
    point's warm-up) stalls ``STALL_S`` in the runner, and the counter reports
    ``SWITCHES`` preemptions: more than any step of a few seconds is allowed, so whatever
    the real load on the test's host adds to a step's time, a disturbed one never reads
    as quiet."""

    STALL_S = 0.05
    SWITCHES = 1000

    def __init__(self, engine: Engine, *, num_disturbed: int) -> None:
        self.num_disturbed = num_disturbed
        self.execute = engine.runner.execute
        self.switches = 0
        self.timing = False
        self.seen: Counter[tuple[int, ...]] = Counter()  # timed steps per batch shape
        self.disturbed: list[StepBatch] = []

    def count(self) -> int:
        self.timing = not self.timing  # the first read opens a timed step, the next closes it
        return self.switches

    def step(self, chunks: list[ScheduledChunk]) -> list[int | None]:
        if self.timing:
            shape = tuple(c.num_tokens for c in chunks)
            self.seen[shape] += 1
            if 2 <= self.seen[shape] <= 1 + self.num_disturbed:
                works = (SequenceWork(c.num_tokens, c.request.num_computed_tokens) for c in chunks)
                self.disturbed.append(StepBatch(tuple(works)))
                time.sleep(self.STALL_S)
                self.switches += self.SWITCHES
        return self.execute(chunks)


CONTENDED = (
    GridPoint(num_decode_seqs=1, num_decode_context_tokens=16),
    GridPoint(num_prefill_tokens=16),
)


def measure_contended(
    monkeypatch: pytest.MonkeyPatch, *, num_disturbed: int
) -> tuple[Contention, list]:
    config = grid_engine_config(
        model="tiny-random", device="cpu", points=CONTENDED, repeats=REPEATS
    )
    engine = Engine(config)
    contention = Contention(engine, num_disturbed=num_disturbed)
    monkeypatch.setattr(measure_module, "_involuntary_switches", contention.count)
    engine.runner.execute = contention.step
    samples = measure_grid(engine, device="cpu-here", points=CONTENDED, repeats=REPEATS)
    assert not engine.has_unfinished() and engine.metrics().num_blocks_in_use == 0
    return contention, samples


def test_a_step_another_process_preempted_is_timed_again_and_never_chosen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Four of each point's tries are disturbed, more than its three repeats: a median over
    # every try, or over the first three, would be a stalled step's.
    contention, samples = measure_contended(monkeypatch, num_disturbed=4)
    # Each shape: its warm-up, four disturbed tries, then the three quiet repeats asked for.
    assert contention.seen == {(1,): 1 + 4 + REPEATS, (16,): 1 + 4 + REPEATS}
    decode, prefill = samples
    # Each decode try adds a token to the context, so its batch names the try it was.
    assert decode.batch not in contention.disturbed
    assert len(contention.disturbed) == 8
    assert prefill.batch == StepBatch((SequenceWork(16, 0),))


def test_a_point_that_never_runs_quiet_keeps_its_fastest_try_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="engine.twin.measure"):
        contention, samples = measure_contended(monkeypatch, num_disturbed=100)
    tries = MAX_TRIES_PER_REPEAT * REPEATS
    assert contention.seen == {(1,): 1 + tries, (16,): 1 + tries}  # bounded, not endless
    assert samples[0].batch in contention.disturbed
    assert "2 of 2 step-time grid points never ran quiet" in caplog.text
    assert "quieter host" in caplog.text


def test_a_point_keeps_its_quiet_median_or_else_its_fastest_try() -> None:
    batch = StepBatch((SequenceWork(1, 16),))
    disturbed = [measure_module._Timed(s, batch, 1000) for s in (0.3, 0.004, 0.2)]
    quiet = [measure_module._Timed(s, batch, 0) for s in (0.05, 0.01, 0.03, 0.02)]
    assert measure_module._pick(disturbed + quiet).seconds == 0.02  # the lower median
    assert measure_module._pick(disturbed).seconds == 0.004  # the least disturbed


def test_a_quiet_step_may_be_preempted_a_few_times_but_not_by_a_busy_process() -> None:
    # Kernel threads and timers preempt a quiet step now and then, the longer it runs the
    # more often; another busy process about every 4 ms of the time it stalls the step.
    assert quiet_switches(0.006) >= 1
    assert quiet_switches(0.3) > quiet_switches(0.006)
    for stalled_s in (0.012, 0.05, 0.3, 1.0):  # a step that spent ~3/4 of its time stalled
        assert quiet_switches(stalled_s) < 0.75 * stalled_s / 0.004
