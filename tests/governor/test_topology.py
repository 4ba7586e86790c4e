"""governor.topology: exact arithmetic on small budgets, CONTRIBUTING.md's reference swarm, and
suggestions that are the largest values that fit (checked by asking again)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governor.backend import BackendCapacity
from governor.errors import ConfigError, TopologyError
from governor.sizing import KVShape
from governor.topology import TopologyFit, check_topology

# Exactly 0.14 MB per token: CONTRIBUTING.md's round figure (2 x 35 x 8 x 125 x 2 bytes).
DESIGN_SHAPE = KVShape(layers=35, kv_heads=8, head_dim=125, dtype_bytes=2)
DESIGN_BLOCKS = 10 * 10**9 // DESIGN_SHAPE.bytes_per_block(16)  # 10 GB of KV
SMALL = {"available_blocks": 100, "block_size": 10, "safety_factor": 1.0}


def design(**overrides: object):  # type: ignore[no-untyped-def]
    args = {
        "available_blocks": DESIGN_BLOCKS,
        "block_size": 16,
        "planner_ceiling": 16_000,
        "worker_ceiling": 16_000,
        "num_workers": 8,
        **overrides,
    }
    return check_topology(**args)  # type: ignore[arg-type]


def summary(row: TopologyFit) -> tuple[bool, int, int, int, bool]:
    return (row.fits, row.max_workers, row.blocks_needed, row.blocks_available, row.deadlocks)


def test_small_numbers_exactly() -> None:
    # planner 200 tokens = 20 blocks, worker 100 tokens = 10 blocks, 100 blocks usable
    report = check_topology(
        planner_ceiling=200, worker_ceiling=100, num_workers=10, max_fanout=5, **SMALL
    )
    assert summary(report.guaranteed) == (True, 10, 50, 100, False)  # max(20, 5 x 10)
    assert summary(report.guaranteed_unparked) == (True, 8, 70, 100, False)  # 20 + 5 x 10
    assert report.guaranteed.reason is None and report.guaranteed.suggestion is None
    report.raise_if_unfit()
    report.raise_if_unfit(parking=False)

    wide = check_topology(
        planner_ceiling=200, worker_ceiling=100, num_workers=10, max_fanout=10, **SMALL
    )
    assert summary(wide.guaranteed) == (True, 10, 100, 100, False)
    row = wide.guaranteed_unparked
    assert summary(row) == (False, 8, 120, 100, False)  # throttled to 8, not stuck
    assert (row.workers_wanted, row.workers_at_once) == (10, 8)
    assert (row.largest_fanout, row.largest_worker_ceiling) == (8, 80)
    assert "only 8 can run at once" in str(row.reason)
    assert "max_fanout=8" in str(row.suggestion)
    assert "at most 80 tokens at max_fanout 10" in str(row.suggestion)
    assert "parking the planners while their workers run" in str(row.suggestion)


def test_overcommit_counts_the_expected_share_of_each_ceiling() -> None:
    report = check_topology(
        planner_ceiling=200,
        worker_ceiling=100,
        num_workers=30,
        max_fanout=30,
        expected_use=0.5,
        **SMALL,
    )
    # planner 100 tokens = 10 blocks, worker 50 tokens = 5 blocks
    row = report.overcommit_unparked
    assert (row.planner_blocks, row.worker_blocks) == (10, 5)
    assert summary(row) == (False, 18, 160, 100, False)
    assert (row.largest_fanout, row.largest_worker_ceiling) == (18, 60)  # 3 blocks = 30 live tokens
    assert summary(report.overcommit) == (False, 20, 150, 100, False)
    assert summary(report.guaranteed) == (False, 10, 300, 100, False)


def test_planners_that_fill_the_budget_deadlock_without_parking() -> None:
    report = check_topology(
        planner_ceiling=200, worker_ceiling=100, num_workers=10, max_fanout=10, planners=5, **SMALL
    )
    row = report.guaranteed_unparked
    assert summary(row) == (False, 0, 600, 100, True)
    assert "deadlocks" in str(row.reason)
    assert "parking the planners with max_fanout=2" in str(row.suggestion)
    parked = report.guaranteed
    assert summary(parked) == (False, 10, 500, 100, False)
    assert parked.largest_fanout == 2
    with pytest.raises(TopologyError) as caught:
        report.raise_if_unfit(parking=False)
    assert "deadlocks" in caught.value.reason and "max_fanout=2" in caught.value.suggestion


def test_a_lease_too_big_for_the_whole_budget_is_named() -> None:
    report = check_topology(
        planner_ceiling=2_000, worker_ceiling=100, num_workers=2, max_fanout=2, **SMALL
    )
    assert not report.guaranteed.fits and not report.guaranteed.deadlocks
    assert "planner ceilings of at most 1,000 tokens" in str(report.guaranteed.suggestion)
    report = check_topology(
        planner_ceiling=100, worker_ceiling=1_500, num_workers=2, max_fanout=2, **SMALL
    )
    assert "worker ceilings of at most 1,000 tokens" in str(report.guaranteed_unparked.suggestion)
    assert not report.guaranteed_unparked.deadlocks  # the worker is refused, not stuck


def test_the_design_reference_swarm() -> None:
    assert DESIGN_SHAPE.bytes_per_token == 140_000 and DESIGN_BLOCKS == 4_464
    # A planner + 8 workers at 16k in guaranteed mode, nothing capping the fan-out:
    # 9,000 blocks against floor(4,464 x 0.9) = 4,017; only 3 workers fit beside the planner.
    report = design(max_fanout=8)
    assert summary(report.guaranteed_unparked) == (False, 3, 9_000, 4_017, False)
    assert summary(report.guaranteed) == (False, 4, 8_000, 4_017, False)
    assert report.guaranteed_unparked.largest_fanout == 3
    assert report.guaranteed_unparked.largest_worker_ceiling == 6_032  # 377 blocks
    assert report.guaranteed.largest_fanout == 4
    assert report.guaranteed.largest_worker_ceiling == 8_032  # 502 blocks
    with pytest.raises(TopologyError, match="max_fanout=4"):
        report.raise_if_unfit()
    # Overcommit at 3.2k of 16k (200 blocks each): all 8 run, planner kept or parked.
    assert summary(report.overcommit_unparked) == (True, 19, 1_800, 4_017, False)

    # Capping the fan-out at 3 with parking fits: at worst 3 workers, 3,000 blocks.
    capped = design(max_fanout=3)
    assert summary(capped.guaranteed) == (True, 4, 3_000, 4_017, False)
    capped.raise_if_unfit()

    # The 8 agents of the reference each planning at once: 4 planners fill 4,000 blocks,
    # leaving 17 for workers that need 1,000 each, so without parking it deadlocks.
    swarm = design(max_fanout=3, planners=8)
    assert swarm.guaranteed_unparked.deadlocks
    assert not swarm.guaranteed.deadlocks
    with pytest.raises(TopologyError, match="deadlocks"):
        swarm.raise_if_unfit(parking=False)


def test_a_shared_prefix_is_counted_once_as_admission_counts_it() -> None:
    # worker 100 tokens = 10 blocks, 3 of them a pinned prefix: 7 of its own
    args = {"planner_ceiling": 200, "worker_ceiling": 100, "num_workers": 10, **SMALL}
    whole = check_topology(max_fanout=10, **args).guaranteed_unparked
    shared = check_topology(max_fanout=10, worker_prefix_blocks=3, **args).guaranteed_unparked
    assert summary(whole) == (False, 8, 120, 100, False)  # 20 + 10 x 10
    assert summary(shared) == (True, 11, 90, 100, False)  # 20 + 10 x 7
    assert shared.worker_blocks == 7 and shared.reason is None
    # The largest worker ceiling at fan-out 10: 8 own blocks + 3 pinned = 110 tokens.
    assert shared.largest_worker_ceiling == 110
    # A prefix longer than the ceiling's blocks leaves the one block a lease is charged.
    tiny = check_topology(max_fanout=10, planner_prefix_blocks=50, **args).guaranteed_unparked
    assert tiny.planner_blocks == 1
    text = str(check_topology(max_fanout=10, worker_prefix_blocks=3, **args))
    assert "shared prefixes pinned once, not counted per agent: worker 3 blocks" in text
    with pytest.raises(ConfigError) as caught:
        check_topology(max_fanout=10, worker_prefix_blocks=-1, **args)
    assert caught.value.setting == "worker_prefix_blocks"


def test_capacity_excludes_pinned_prefixes_and_the_table_reads() -> None:
    capacity = BackendCapacity(
        block_size=16,
        num_blocks=DESIGN_BLOCKS + 100,
        num_free_blocks=DESIGN_BLOCKS + 100,
        num_pinned_blocks=100,
        bytes_per_block=DESIGN_SHAPE.bytes_per_block(16),
        max_model_len=32_768,
    )
    report = check_topology(
        capacity=capacity,
        planner_ceiling=16_000,
        worker_ceiling=16_000,
        num_workers=8,
        max_fanout=3,
    )
    assert report == design(max_fanout=3)
    text = str(report)
    assert "4,017 of 4,464 blocks usable" in text
    assert "guaranteed  yes      yes   3 of 3" in text
    unfit = str(design(max_fanout=8))
    assert "guaranteed, unparked: 8 workers at once" in unfit and "fits with: max_fanout=3" in unfit
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.max_fanout = 4  # type: ignore[misc]


@pytest.mark.parametrize(
    ("overrides", "setting"),
    [
        ({"max_fanout": 0}, "max_fanout"),
        ({"num_workers": 0}, "num_workers"),
        ({"planners": 0}, "planners"),
        ({"expected_use": 0.0}, "expected_use"),
        ({"expected_use": 1.5}, "expected_use"),
        ({"safety_factor": 1.2}, "safety_factor"),
        ({"worker_ceiling": 0}, "worker_ceiling"),
        ({"block_size": 0}, "block_size"),
        ({"block_size": None}, "capacity"),
    ],
)
def test_bad_input_is_refused(overrides: dict[str, object], setting: str) -> None:
    with pytest.raises(ConfigError) as caught:
        design(**{"max_fanout": 3, **overrides})
    assert caught.value.setting == setting


def test_mode_names_are_checked() -> None:
    with pytest.raises(ConfigError, match="'guaranteed' or 'overcommit'"):
        design(max_fanout=3).fit("optimistic")


@settings(max_examples=150, deadline=None)
@given(
    available=st.integers(0, 400),
    block_size=st.sampled_from([1, 4, 16]),
    planner=st.integers(1, 800),
    worker=st.integers(1, 800),
    num_workers=st.integers(1, 12),
    max_fanout=st.integers(1, 12),
    planners=st.integers(1, 3),
    use=st.sampled_from([0.1, 0.25, 1.0]),
    prefixes=st.tuples(st.integers(0, 30), st.integers(0, 30)),
)
def test_suggestions_are_the_largest_values_that_fit(
    available: int,
    block_size: int,
    planner: int,
    worker: int,
    num_workers: int,
    max_fanout: int,
    planners: int,
    use: float,
    prefixes: tuple[int, int],
) -> None:
    args = {
        "available_blocks": available,
        "block_size": block_size,
        "planner_ceiling": planner,
        "worker_ceiling": worker,
        "num_workers": num_workers,
        "planners": planners,
        "expected_use": use,
        "planner_prefix_blocks": prefixes[0],
        "worker_prefix_blocks": prefixes[1],
    }
    report = check_topology(max_fanout=max_fanout, **args)  # type: ignore[arg-type]
    for row in report.rows:
        assert row.fits == (row.reason is None)
        assert row.workers_at_once <= row.workers_wanted
        if row.parking:
            assert not row.deadlocks

        def again(row: TopologyFit = row, **changes: int) -> TopologyFit:
            merged = {**args, "max_fanout": max_fanout, **changes}
            return check_topology(**merged).fit(row.mode, parking=row.parking)  # type: ignore[arg-type]

        if row.largest_fanout >= 1:
            assert again(max_fanout=row.largest_fanout).fits
        if row.largest_fanout < num_workers:
            assert not again(max_fanout=row.largest_fanout + 1).fits
        if row.largest_worker_ceiling >= 1:
            assert again(worker_ceiling=row.largest_worker_ceiling).fits
            assert not again(worker_ceiling=row.largest_worker_ceiling + 1).fits
