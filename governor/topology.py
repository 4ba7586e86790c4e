"""``check_topology``: does a planner + N workers topology fit the KV budget?

Asked before a run, in both admission modes and with and without parking, using the
admission formulas (``blocks_per_seq``; usable = floor(available_blocks * safety_factor)):

- ``guaranteed`` counts every active lease at its ceiling; ``overcommit`` counts it at
  ``expected_use`` of its ceiling (its live use plus whatever headroom that includes).
- A topology wants ``planners * min(max_fanout, num_workers)`` workers at once.
- Without parking the planners keep their blocks while their workers run:
  needed = planners * planner + wanted * worker. With parking a planner stops counting
  while its children run, and the worst moment is all planners or all workers:
  needed = max(planners * planner, wanted * worker).
- It deadlocks without parking when the planners that can be admitted leave room for
  no worker: they wait on children that wait on them. Fewer free blocks than the full
  fan-out only throttles it (fewer workers at once), which ``fits`` reports as False.

A shared prefix (a system prompt registered once, ``Governor.register_prefix``) is
counted as admission counts it: its pinned blocks are out of the available blocks
already, so each planner and worker counts only its own blocks beyond them (at least
one), and a team sharing a long system prompt is not refused for blocks pinned once.

A row that does not fit says why, the largest ``max_fanout`` that fits at the given
worker ceiling, and the largest worker ceiling that fits at the given fan-out.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from governor.backend import BackendCapacity
from governor.errors import ConfigError, TopologyError
from governor.sizing import DEFAULT_SAFETY_FACTOR, blocks_per_seq, max_ceiling_tokens

__all__ = ["DEFAULT_EXPECTED_USE", "TopologyFit", "TopologyReport", "check_topology"]

DEFAULT_EXPECTED_USE = 0.2  # about 3k of a 16k ceiling, CONTRIBUTING.md's average
_MODES = ("guaranteed", "overcommit")


@dataclass(frozen=True, slots=True, kw_only=True)
class TopologyFit:
    """The topology under one admission mode, with or without parking."""

    mode: str  # "guaranteed" or "overcommit"
    parking: bool  # planners stop counting while their workers run
    planner_blocks: int  # what one planner is counted at in this mode
    worker_blocks: int  # what one worker is counted at in this mode
    workers_wanted: int  # planners * min(max_fanout, num_workers)
    max_workers: int  # workers the budget holds at once beside what the planners count
    blocks_needed: int  # at the worst moment of the full fan-out
    blocks_available: int  # floor(available_blocks * safety_factor)
    deadlocks: bool
    largest_fanout: int  # per planner, at the given worker ceiling; 0: none fits
    largest_worker_ceiling: int  # tokens, at the given fan-out; 0: none fits
    reason: str | None  # None when it fits
    suggestion: str | None

    @property
    def fits(self) -> bool:
        return self.blocks_needed <= self.blocks_available

    @property
    def workers_at_once(self) -> int:
        return min(self.workers_wanted, self.max_workers)


@dataclass(frozen=True, slots=True, kw_only=True)
class TopologyReport:
    """``check_topology``'s answer: the inputs and one ``TopologyFit`` per mode."""

    planner_ceiling: int
    worker_ceiling: int
    num_workers: int  # per planner
    max_fanout: int
    planners: int  # planners running at once, each with its own workers
    block_size: int
    available_blocks: int
    safety_factor: float
    expected_use: float
    planner_prefix_blocks: int = 0  # a shared prefix's pinned blocks, counted once
    worker_prefix_blocks: int = 0
    guaranteed: TopologyFit
    guaranteed_unparked: TopologyFit
    overcommit: TopologyFit
    overcommit_unparked: TopologyFit

    @property
    def rows(self) -> tuple[TopologyFit, TopologyFit, TopologyFit, TopologyFit]:
        return (
            self.guaranteed,
            self.guaranteed_unparked,
            self.overcommit,
            self.overcommit_unparked,
        )

    def fit(self, mode: str = "guaranteed", *, parking: bool = True) -> TopologyFit:
        if mode not in _MODES:
            raise ConfigError(
                f"mode must be 'guaranteed' or 'overcommit', got {mode!r}", setting="mode"
            )
        return next(r for r in self.rows if r.mode == mode and r.parking == parking)

    def raise_if_unfit(self, mode: str = "guaranteed", *, parking: bool = True) -> None:
        """Raise ``TopologyError`` unless the topology fits in ``mode``."""
        row = self.fit(mode, parking=parking)
        if row.reason is not None:
            assert row.suggestion is not None
            raise TopologyError(f"{row.mode} mode: {row.reason}", row.suggestion)

    def __str__(self) -> str:
        s = "" if self.planners == 1 else "s"
        lines = [
            f"{self.planners} planner{s} at {self.planner_ceiling:,} tokens, each with "
            f"{self.num_workers} workers at {self.worker_ceiling:,} tokens, max_fanout "
            f"{self.max_fanout}",
            f"{self._budget_line()}; overcommit counts {self.expected_use:.0%} of each ceiling",
            *self._prefix_lines(),
            "",
            f"{'mode':<11} {'parking':<8} {'fits':<5} {'workers at once':<16} "
            f"{'blocks needed':<20} deadlock",
        ]
        for r in self.rows:
            lines.append(
                f"{r.mode:<11} {_yes(r.parking):<8} {_yes(r.fits):<5} "
                f"{f'{r.workers_at_once} of {r.workers_wanted}':<16} "
                f"{f'{r.blocks_needed:,} / {r.blocks_available:,}':<20} {_yes(r.deadlocks)}"
            )
        for r in self.rows:
            if r.reason is not None:
                parked = "parked" if r.parking else "unparked"
                lines += ["", f"{r.mode}, {parked}: {r.reason}", f"  fits with: {r.suggestion}"]
        return "\n".join(lines)

    def _prefix_lines(self) -> list[str]:
        shared = [
            f"{role} {blocks:,}"
            for role, blocks in (
                ("planner", self.planner_prefix_blocks),
                ("worker", self.worker_prefix_blocks),
            )
            if blocks
        ]
        if not shared:
            return []
        return [f"shared prefixes pinned once, not counted per agent: {', '.join(shared)} blocks"]

    def _budget_line(self) -> str:
        usable = self.guaranteed.blocks_available
        return (
            f"{usable:,} of {self.available_blocks:,} blocks usable ({self.block_size} "
            f"tokens each, safety factor {self.safety_factor:g})"
        )


def check_topology(
    *,
    planner_ceiling: int,
    worker_ceiling: int,
    num_workers: int,
    max_fanout: int,
    capacity: BackendCapacity | None = None,
    available_blocks: int | None = None,
    block_size: int | None = None,
    safety_factor: float = DEFAULT_SAFETY_FACTOR,
    planners: int = 1,
    expected_use: float = DEFAULT_EXPECTED_USE,
    planner_prefix_blocks: int = 0,
    worker_prefix_blocks: int = 0,
) -> TopologyReport:
    """Whether ``planners`` planners, each fanning out to ``num_workers`` workers at most
    ``max_fanout`` at a time, fit the budget: pass the backend's ``capacity`` (sized
    from its available blocks, pinned prefixes excluded), or ``available_blocks`` and
    ``block_size``. ``planner_prefix_blocks`` and ``worker_prefix_blocks`` are the pinned
    blocks of the shared prefix each starts with (``Governor.check_topology`` passes
    those of the agents' registered prefixes)."""
    if capacity is not None and (available_blocks is not None or block_size is not None):
        raise ConfigError(
            "pass either capacity or available_blocks and block_size, not both",
            setting="capacity",
        )
    if capacity is not None:
        available_blocks, block_size = capacity.num_available_blocks, capacity.block_size
    if available_blocks is None or block_size is None:
        raise ConfigError(
            "pass capacity=backend.capacity(), or both available_blocks and block_size",
            setting="capacity",
        )
    for name, value in (
        ("planner_ceiling", planner_ceiling),
        ("worker_ceiling", worker_ceiling),
        ("num_workers", num_workers),
        ("max_fanout", max_fanout),
        ("planners", planners),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError.below_minimum(name, value, 1)
    for name, value in (
        ("planner_prefix_blocks", planner_prefix_blocks),
        ("worker_prefix_blocks", worker_prefix_blocks),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError.below_minimum(name, value, 0)
    if isinstance(expected_use, bool) or not isinstance(expected_use, (int, float)):
        raise _expected_use_error(expected_use)
    if not 0 < expected_use <= 1:  # also refuses NaN
        raise _expected_use_error(expected_use)
    # Validates available_blocks and safety_factor: floor(available * safety).
    usable = max_ceiling_tokens(available_blocks, 1, safety_factor)
    blocks_per_seq(1, block_size)  # validates block_size

    def row(mode: str, parking: bool) -> TopologyFit:
        use = Fraction(1) if mode == "guaranteed" else Fraction(str(expected_use))
        return _fit(
            mode=mode,
            parking=parking,
            use=use,
            usable=usable,
            block_size=block_size,
            planner_ceiling=planner_ceiling,
            worker_ceiling=worker_ceiling,
            num_workers=num_workers,
            max_fanout=max_fanout,
            planners=planners,
            prefixes=(planner_prefix_blocks, worker_prefix_blocks),
        )

    return TopologyReport(
        planner_ceiling=planner_ceiling,
        worker_ceiling=worker_ceiling,
        num_workers=num_workers,
        max_fanout=max_fanout,
        planners=planners,
        block_size=block_size,
        available_blocks=available_blocks,
        safety_factor=float(safety_factor),
        expected_use=float(expected_use),
        planner_prefix_blocks=planner_prefix_blocks,
        worker_prefix_blocks=worker_prefix_blocks,
        guaranteed=row("guaranteed", True),
        guaranteed_unparked=row("guaranteed", False),
        overcommit=row("overcommit", True),
        overcommit_unparked=row("overcommit", False),
    )


def _fit(
    *,
    mode: str,
    parking: bool,
    use: Fraction,
    usable: int,
    block_size: int,
    planner_ceiling: int,
    worker_ceiling: int,
    num_workers: int,
    max_fanout: int,
    planners: int,
    prefixes: tuple[int, int],
) -> TopologyFit:
    planner_prefix, worker_prefix = prefixes

    def counted(ceiling: int, prefix: int) -> int:
        # As ``Lease.own_blocks_reserved``: the blocks beyond the pinned prefix, at least 1.
        return max(1, blocks_per_seq(math.ceil(ceiling * use), block_size) - prefix)

    def ceiling_within(blocks: int, prefix: int) -> int:
        # The largest ceiling c with counted(c, prefix) <= blocks: none when blocks < 1,
        # else ceil(c * use) <= (blocks + prefix) * size.
        return math.floor((blocks + prefix) * block_size / use) if blocks >= 1 else 0

    planner = counted(planner_ceiling, planner_prefix)
    worker = counted(worker_ceiling, worker_prefix)
    fanout = min(max_fanout, num_workers)
    wanted = planners * fanout
    planners_total = planners * planner
    if parking:
        needed = max(planners_total, wanted * worker)
        room = usable if planners_total <= usable else 0
    else:
        needed = planners_total + wanted * worker
        room = max(0, usable - planners_total)
    max_workers = room // worker
    # Admitted planners hold their blocks while waiting; none of their workers fits.
    admitted = min(planners, usable // planner)
    deadlocks = (
        not parking and admitted >= 1 and worker <= usable and usable - admitted * planner < worker
    )
    largest_fanout = min(num_workers, room // (planners * worker))
    largest_worker_ceiling = ceiling_within(room // wanted, worker_prefix)

    reason = suggestion = None
    if needed > usable:
        reason, suggestion = _explain(
            parking=parking,
            usable=usable,
            planner_within=lambda blocks: ceiling_within(blocks, planner_prefix),
            worker_within=lambda blocks: ceiling_within(blocks, worker_prefix),
            planner_ceiling=planner_ceiling,
            worker_ceiling=worker_ceiling,
            planners=planners,
            planners_total=planners_total,
            worker=worker,
            wanted=wanted,
            fanout=fanout,
            needed=needed,
            max_workers=max_workers,
            deadlocks=deadlocks,
            largest_fanout=largest_fanout,
            largest_worker_ceiling=largest_worker_ceiling,
            parked_fanout=min(num_workers, usable // (planners * worker))
            if planners_total <= usable
            else 0,
        )
    return TopologyFit(
        mode=mode,
        parking=parking,
        planner_blocks=planner,
        worker_blocks=worker,
        workers_wanted=wanted,
        max_workers=max_workers,
        blocks_needed=needed,
        blocks_available=usable,
        deadlocks=deadlocks,
        largest_fanout=largest_fanout,
        largest_worker_ceiling=largest_worker_ceiling,
        reason=reason,
        suggestion=suggestion,
    )


def _explain(
    *,
    parking: bool,
    usable: int,
    planner_within: Callable[[int], int],
    worker_within: Callable[[int], int],
    planner_ceiling: int,
    worker_ceiling: int,
    planners: int,
    planners_total: int,
    worker: int,
    wanted: int,
    fanout: int,
    needed: int,
    max_workers: int,
    deadlocks: bool,
    largest_fanout: int,
    largest_worker_ceiling: int,
    parked_fanout: int,
) -> tuple[str, str]:
    more = "give the engine more KV blocks"
    if planners_total > usable:
        who = "a planner" if planners == 1 else f"{planners} planners"
        largest = planner_within(usable // planners)
        stuck = ", and it deadlocks: admitted planners hold the blocks their workers wait for"
        return (
            f"{who} at {planner_ceiling:,} tokens {'needs' if planners == 1 else 'need'} "
            f"{planners_total:,} blocks, more than "
            f"the {usable:,} usable{stuck if deadlocks else ''}",
            f"planner ceilings of at most {largest:,} tokens, fewer planners at once, {more}",
        )
    if worker > usable:
        return (
            f"one worker at {worker_ceiling:,} tokens needs {worker:,} blocks, more than the "
            f"{usable:,} usable",
            f"worker ceilings of at most {worker_within(usable):,} tokens, {more}",
        )
    beside = "" if parking else f" beside the planners' {planners_total:,} ({needed:,} in all)"
    reason = (
        f"{wanted} workers at once at {worker_ceiling:,} tokens need {wanted * worker:,} "
        f"blocks{beside}, {usable:,} usable: only {max_workers} can run at once"
    )
    if deadlocks:
        reason += ", and it deadlocks: admitted planners hold the blocks their workers wait for"
    options = []
    if largest_fanout >= 1:
        options.append(f"max_fanout={largest_fanout} at {worker_ceiling:,}-token workers")
    if largest_worker_ceiling >= 1:
        options.append(
            f"worker ceilings of at most {largest_worker_ceiling:,} tokens at max_fanout {fanout}"
        )
    if not parking and parked_fanout >= fanout:
        options.append("parking the planners while their workers run")
    elif not parking and parked_fanout >= 1:
        options.append(f"parking the planners with max_fanout={parked_fanout}")
    options.append(more)
    return reason, ", or ".join(options)


def _expected_use_error(value: object) -> ConfigError:
    return ConfigError(
        f"expected_use must be a fraction in (0, 1], got {value!r}; pass the share of a "
        "ceiling an agent holds on average, e.g. 0.2 for 3k of 16k tokens",
        setting="expected_use",
    )


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"
