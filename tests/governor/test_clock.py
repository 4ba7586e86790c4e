"""The governor reads time only from the clock it is given (``governor.clock``).

A manual clock, moved by the test, drives a real ``Governor`` over ``FakeBackend``: these
are the governor's own times and deadlines, which need no model. Nothing here sleeps to
make a deadline fire; a deadline fires when the test moves the clock past it.
"""

from __future__ import annotations

import ast
import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from governor import (
    SYSTEM_CLOCK,
    AgentSpec,
    Clock,
    ConfigError,
    Governor,
    GovernorConfig,
    GovernorEvent,
    Lease,
    LeaseState,
    Policies,
    SystemClock,
)
from governor.testing import FakeBackend

AGENT = AgentSpec(name="agent", ceiling_tokens=800, tool_output_tokens=8)
TASK = [{"role": "user", "content": "Find the failing test and explain it in one line."}]
GOVERNOR_DIR = Path(__file__).resolve().parents[2] / "governor"


@dataclass(slots=True, eq=False)
class _Armed:
    due: float
    seconds: float
    fn: Callable[..., None]
    args: tuple[object, ...]
    cancelled: bool = False
    done: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass(slots=True)
class ManualClock:
    """A ``governor.Clock`` the test moves by hand: ``now()`` reads ``at``, ``wall()``
    reads ``wall_at``; ``call_later`` records each callback with its due time, and
    ``advance_to`` runs those that come due, in time order (ties in arming order), on the
    test's thread. The governor arms timers from worker threads too: hence the lock."""

    at: float = 1000.0
    wall_at: float = 5e9
    armed: list[_Armed] = field(default_factory=list)  # every call_later, in arming order
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def now(self) -> float:
        return self.at

    def wall(self) -> float:
        return self.wall_at

    def call_later(self, seconds: float, fn: Callable[..., None], *args: object) -> _Armed:
        with self._lock:
            armed = _Armed(self.at + seconds, seconds, fn, args)
            self.armed.append(armed)
        return armed

    def pending(self) -> list[tuple[float, str]]:
        """The callbacks armed and neither run nor cancelled: (seconds, function name)."""
        with self._lock:
            return [
                (a.seconds, a.fn.__name__) for a in self.armed if not a.done and not a.cancelled
            ]

    def advance_to(self, target: float) -> None:
        while True:
            with self._lock:
                due = [a for a in self.armed if not a.done and a.due <= target]
                if not due:
                    break
                first = min(due, key=lambda a: a.due)  # the first armed of equal times
                first.done = True
            self.at = max(self.at, first.due)
            if not first.cancelled:
                first.fn(*first.args)
        self.at = target

    def advance(self, seconds: float) -> None:
        self.advance_to(self.at + seconds)


def _recorder(governor: Governor) -> list[GovernorEvent]:
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)
    return events


def _only(events: list[GovernorEvent], kind: str) -> list[GovernorEvent]:
    return [e for e in events if e.kind == kind]


async def _until(condition: Callable[[], bool]) -> None:
    """Let the other tasks run until ``condition`` holds (a lease queued: no clock moves)."""
    for _ in range(1_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the queue never got there")


def test_the_manual_clock_is_a_clock_and_a_governor_keeps_the_one_it_is_given() -> None:
    clock = ManualClock()
    assert isinstance(clock, Clock)
    assert Governor(FakeBackend(), clock=clock).clock is clock
    assert Governor(FakeBackend()).clock is SYSTEM_CLOCK


def test_a_governor_refuses_a_clock_that_is_not_one() -> None:
    with pytest.raises(ConfigError, match=r"now\(\), wall\(\) and call_later") as raised:
        Governor(FakeBackend(), clock=time.monotonic)  # type: ignore[arg-type]
    assert raised.value.setting == "clock"


def test_a_tool_calls_park_and_hold_deadlines_are_armed_on_the_clock_and_fire_as_it_moves() -> None:
    clock = ManualClock()
    config = GovernorConfig(park_after_s=0.05, retain_s=0.1)
    backend = FakeBackend()
    governor = Governor(backend, config=config, agents=[AGENT], clock=clock)
    events = _recorder(governor)
    fired = threading.Event()  # set by any deadline the clock did not run
    governor.subscribe(lambda e: fired.set() if e.kind in ("parked", "offloaded") else None)
    start = clock.at
    with governor.lease("agent") as lease:
        governor.complete(lease, TASK, max_tokens=4)  # a context to hold between calls
        assert clock.pending() == [] and backend.metrics().num_blocks_in_use == 0
        with governor.tool_call(lease, "run_tests"):
            assert clock.pending() == [(0.05, "_park_idle"), (0.1, "_expire")]
            assert lease.num_retained_tokens > 0 and lease.state is LeaseState.ACTIVE
            held = backend.metrics().num_blocks_in_use
            assert held > 0
            # Real time runs past both deadlines; the governor's clock does not move.
            assert not fired.wait(0.3)
            assert lease.state is LeaseState.ACTIVE and lease.num_retained_tokens > 0
            clock.advance_to(start + 0.04)
            assert lease.state is LeaseState.ACTIVE
            clock.advance_to(start + 0.05)
            assert lease.state is LeaseState.PARKED
            assert lease.num_retained_tokens > 0
            assert backend.metrics().num_blocks_in_use == held
            clock.advance_to(start + 0.1)
            assert lease.num_retained_tokens > 0 and lease.kv_offloaded
            assert backend.metrics().num_blocks_in_use == 0  # the hold went to host
        assert [e.attributes["reason"] for e in _only(events, "parked")] == ["tool"]
        assert [e.attributes["reason"] for e in _only(events, "offloaded")] == [
            "held for retain_s=0.1 s"
        ]
        # A tool that returns before its deadlines cancels them: moving on runs nothing.
        governor.complete(lease, TASK, max_tokens=4)
        with governor.tool_call(lease, "quick"):
            armed = [a for a in clock.armed if not a.done]
            assert [(a.seconds, a.fn.__name__) for a in armed] == [
                (0.05, "_park_idle"),
                (0.1, "_expire"),
            ]
        assert all(a.cancelled for a in armed if a.fn.__name__ == "_park_idle")
        clock.advance(0.06)
        assert lease.state is LeaseState.ACTIVE
        assert len(_only(events, "parked")) == 1
    assert {"retained", "parked", "offloaded"} <= {e.kind for e in events}
    # Admitted, and resumed after parking, with the clock standing still: no wait.
    waits = [e.attributes["wait_s"] for e in events if e.kind in ("admitted", "resumed")]
    assert waits == [0.0, 0.0]
    assert (lease.requested_at, lease.released_at) == (start, clock.at)
    assert {e.at for e in events} == {clock.wall_at}  # the idle keeper's events too


def test_lease_times_queue_aging_order_time_elapsed_times_and_event_times_are_the_clocks() -> None:
    clock = ManualClock(at=1000.0, wall_at=5e9)

    def respond(request: object) -> str:
        clock.at += 2.0  # the model call takes 2 s on the governor's clock
        return "ok"

    backend = FakeBackend(responder=respond)
    # admission_timeout_s: a real-time bound on the asyncio waits, so that a governor that
    # admits in the wrong order fails here instead of waiting for ever.
    config = GovernorConfig(
        max_concurrent=1, aging_s=10.0, park_after_s=60.0, retain_s=0.0, admission_timeout_s=60.0
    )
    governor = Governor(backend, config=config, agents=[AGENT], clock=clock)
    events = _recorder(governor)

    def waiting() -> int:
        return governor.admission.counts()[1]

    async def scenario() -> tuple[Lease, Lease, Lease]:
        async with governor.run("triage"):
            async with governor.lease("agent") as holder:  # admitted at once, at 1000
                first = governor.lease("agent", priority=0)  # requested at 1000
                first_in = asyncio.create_task(first.__aenter__())
                await _until(lambda: waiting() == 1)
                clock.advance(25.0)
                second = governor.lease("agent", priority=2)  # requested at 1025
                second_in = asyncio.create_task(second.__aenter__())
                await _until(lambda: waiting() == 2)
                clock.advance(5.0)  # the holder leaves at 1030
            # Aged 3 levels by 1030 against the second's 2 + 0.5: the first goes first.
            assert first.lease.state is LeaseState.ACTIVE
            assert second.lease.state is LeaseState.WAITING
            a = await first_in
            await governor.acomplete(a, TASK, max_tokens=4)  # 1030 to 1032
            async with governor.tool_call(a, "grep"):
                assert a.tool_started_at == 1032.0
                clock.advance(3.0)  # 1035
            reduced = governor.tool_call(a, "cat").reduce("line of output\n" * 200)
            assert reduced.changed and reduced.elapsed_s == 0.0  # the clock did not move
            _, compaction = governor.compact(a, TASK)
            assert compaction.elapsed_s == 0.0
            await first.__aexit__(None, None, None)  # 1035: the second is admitted
            b = await second_in
            clock.advance(1.0)
            await second.__aexit__(None, None, None)  # 1036
            return holder, a, b

    holder, a, b = asyncio.run(scenario())
    assert (holder.requested_at, holder.admitted_at, holder.released_at) == (1000, 1000, 1030)
    assert (a.requested_at, a.queued_at, a.admitted_at, a.released_at) == (1000, 1000, 1030, 1035)
    assert (b.requested_at, b.queued_at, b.admitted_at, b.released_at) == (1025, 1025, 1035, 1036)
    assert a.wait_s == 30.0 and b.wait_s == 10.0
    assert [call.order_time for call in backend.calls] == [1000.0]  # its lease tree's start
    assert [e.attributes["wait_s"] for e in _only(events, "admitted")] == [0.0, 30.0, 10.0]
    assert [e.attributes["elapsed_s"] for e in _only(events, "call.finished")] == [2.0]
    assert [e.attributes["elapsed_s"] for e in _only(events, "tool.finished")] == [3.0]
    assert [e.attributes["elapsed_s"] for e in _only(events, "run.finished")] == [36.0]
    kinds = {e.kind for e in events}
    assert {"requested", "admitted", "call.started", "tool.started", "released"} <= kinds
    assert {e.at for e in events} == {5e9}


def test_the_admission_policy_is_given_the_clocks_now() -> None:
    clock = ManualClock(at=1000.0)
    seen: list[float] = []

    class Recording:
        def order(self, waiting: list[Lease], *, active: object, now: float) -> list[Lease]:
            seen.append(now)
            return list(waiting)

    config = GovernorConfig(max_concurrent=1, admission_timeout_s=60.0)
    governor = Governor(
        FakeBackend(),
        config=config,
        agents=[AGENT],
        clock=clock,
        policies=Policies(admission=Recording()),
    )

    async def scenario() -> None:
        async with governor.lease("agent"):
            clock.advance(7.5)
            waiting = asyncio.create_task(governor.lease("agent").__aenter__())
            await _until(lambda: governor.admission.counts()[1] == 1)
            clock.advance(1.0)
        lease = await waiting
        await governor.arelease(lease)

    asyncio.run(scenario())
    assert seen == [1000.0, 1007.5, 1008.5]  # each lease queued, then the holder's release


def test_the_default_pressure_policy_reads_when_a_tool_is_due_back_on_the_clock() -> None:
    clock = ManualClock(at=1004.0)
    governor = Governor(FakeBackend(), agents=[AGENT], clock=clock)
    parked = Lease(
        lease_id="7",
        agent=AGENT,
        ceiling_tokens=800,
        priority=0,
        block_size=16,
        arrival=7,
        requested_at=990.0,
        state=LeaseState.PARKED,
        tool="build",
        tool_started_at=1000.0,  # expected to take 10 s; 4 s in, it is due back in 6
        tool_expected_s=10.0,
        num_retained_tokens=64,
    )
    (choice,) = governor.idle.pressure.choose([parked], num_blocks_needed=1)
    assert "due back in 6.00 s" in choice.reason


def test_the_system_clock_is_real_time_and_runs_callbacks_on_its_thread_unless_cancelled() -> None:
    clock = SystemClock()
    assert isinstance(clock, Clock)
    before = time.monotonic()
    assert before <= clock.now() <= time.monotonic()
    assert abs(clock.wall() - time.time()) < 60
    fired: list[str] = []
    done = threading.Event()
    clock.call_later(0.05, fired.append, "cancelled").cancel()
    clock.call_later(0.01, lambda: fired.append(threading.current_thread().name))
    clock.call_later(0.1, done.set)  # after both others' times
    assert done.wait(30)
    assert fired == ["kvgov-deadlines"]


# -- the governor reads no other clock ---------------------------------------------------
_REAL_TIME = {
    "monotonic",
    "monotonic_ns",
    "perf_counter",
    "perf_counter_ns",
    "time",
    "time_ns",
    "sleep",
    "process_time",
    "thread_time",
}
_REAL_DATE = {"now", "utcnow", "today"}
_ALLOWED = {"clock.py", "deadlines.py"}  # the system clock, and the thread it runs on


def _real_time_reads(source: str) -> list[tuple[int, str]]:
    """Where a module reads real time or sleeps: ``time.<clock>`` by any name ``time`` is
    imported as, a name imported from ``time``, and ``datetime``'s ``now``/``today``."""
    tree = ast.parse(source)
    modules: set[str] = set()  # the names the module ``time`` is bound to
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {alias.asname or alias.name for alias in node.names if alias.name == "time"}
        elif isinstance(node, ast.ImportFrom) and node.module == "time":
            found += [(node.lineno, f"from time import {a.name}") for a in node.names]
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not isinstance(node.value, ast.Name):
            continue
        reads_time = node.value.id in modules and node.attr in _REAL_TIME
        reads_date = node.value.id in ("datetime", "date") and node.attr in _REAL_DATE
        if reads_time or reads_date:
            found.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return sorted(found)


def test_no_governor_module_but_the_clock_reads_real_time() -> None:
    modules = sorted(p for p in GOVERNOR_DIR.glob("*.py") if p.name not in _ALLOWED)
    assert len(modules) > 20
    reads = {
        p.name: hits for p in modules if (hits := _real_time_reads(p.read_text(encoding="utf-8")))
    }
    assert reads == {}, (
        f"governor modules read real time: {reads}; read the governor's clock instead "
        "(self.clock.now() for durations and order, self.clock.wall() for an event's time, "
        "self.clock.call_later for a deadline: governor.clock), so the hardware twin's "
        "virtual clock drives them"
    )


def test_the_source_check_sees_each_way_of_reading_real_time() -> None:
    source = (
        "import time\nimport time as t\nfrom time import perf_counter\n"
        "from datetime import datetime\n"
        "a = time.monotonic()\nb = t.sleep(1)\nc = datetime.now()\nd = time.time\n"
        "e = time.strftime('%Y')\n# time.monotonic() in a comment\n"
    )
    assert _real_time_reads(source) == [
        (3, "from time import perf_counter"),
        (5, "time.monotonic"),
        (6, "t.sleep"),
        (7, "datetime.now"),
        (8, "time.time"),
    ]
