"""Measuring a step-time grid on the real engine (tiny-random on the CPU): each sample's
batch is one the model runner really computed, times are real and grow with the work, and
the engine is left as it was found (no request, block or wrapper left behind)."""

from __future__ import annotations

import json
import math
import socket

import pytest

from engine import Engine
from engine.scheduler import ScheduledChunk
from engine.twin import SequenceWork, StepBatch
from engine.twin.measure import (
    GridPoint,
    default_points,
    grid_engine_config,
    measure_grid,
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


def test_a_decode_point_records_the_contexts_the_engine_had(measured) -> None:
    _, _, samples = measured
    decode = samples[POINTS.index(DECODE)].batch
    assert decode.num_sequences == 4
    assert all(s.num_new_tokens == 1 for s in decode.sequences)
    # A warm-up step and the repeats before the median one have each added a token: the
    # engine's real contexts, not the 64 asked for.
    contexts = {s.num_context_tokens for s in decode.sequences}
    assert all(64 < c <= 64 + 2 + len(POINTS) * (1 + REPEATS) for c in contexts), contexts


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
