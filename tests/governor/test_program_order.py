"""The governor's use of what it knows about an agent's program: its calls are ordered
by when the program (the top of its lease tree) started, and under pressure the held
KV expected back last is moved first. On the bundled engine (tiny-random, real forward
passes) where a backend is needed."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import pytest

from backends import LocalBackend
from governor import (
    AdmissionMode,
    AgentSpec,
    ConfigError,
    GenerationRequest,
    GenerationResult,
    Governor,
    GovernorConfig,
    GovernorEvent,
    LeaseState,
)
from governor.lease import Lease
from governor.pressure import PressureOrder

PLANNER = AgentSpec(name="planner", ceiling_tokens=800, max_fanout=2)
AGENT = AgentSpec(name="agent", ceiling_tokens=800)


class RecordingBackend(LocalBackend):
    """The real LocalBackend; it also keeps every request it was sent."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.sent: list[GenerationRequest] = []

    def generate(self, request: GenerationRequest) -> GenerationResult:
        self.sent.append(request)
        return super().generate(request)


@pytest.fixture(scope="module")
def backend() -> Iterator[RecordingBackend]:
    made = RecordingBackend(config={"num_blocks": 64, "block_size": 16})
    yield made
    made.close()


def _ask(words: int, tag: str = "w") -> list[dict[str, str]]:
    return [{"role": "user", "content": " ".join(f"{tag}{i}" for i in range(words))}]


def test_a_childs_calls_are_ordered_by_its_programs_start(backend: RecordingBackend) -> None:
    governor = Governor(backend, config=GovernorConfig(admission_timeout_s=10),
                        agents=[PLANNER, AGENT])  # fmt: skip
    backend.sent.clear()
    with governor.lease("planner") as planner:
        governor.complete(planner, _ask(5), max_tokens=2)
        with governor.child(planner, "agent") as child:
            governor.complete(child, _ask(5), max_tokens=2)
        assert child.requested_at > planner.requested_at
        assert child.root_requested_at == planner.requested_at
    with governor.lease("agent") as alone:
        governor.complete(alone, _ask(5), max_tokens=2)
    assert [r.order_time for r in backend.sent] == [planner.requested_at] * 2 + [alone.requested_at]


def _lease(number: int, *, ran_s: float | None, expected_s: float | None, tokens: int) -> Lease:
    lease = Lease(lease_id=str(number), agent=AGENT, ceiling_tokens=800, priority=0,
                  block_size=16, arrival=number, requested_at=0.0)  # fmt: skip
    lease.state = LeaseState.PARKED
    lease.num_retained_tokens = tokens
    if ran_s is not None:  # in a tool that started ran_s ago
        lease.tool_started_at, lease.tool_expected_s = time.monotonic() - ran_s, expected_s
    return lease


def test_pressure_moves_what_is_expected_back_last_first() -> None:
    leases = [
        _lease(0, ran_s=1.0, expected_s=100.0, tokens=320),
        _lease(1, ran_s=None, expected_s=None, tokens=160),  # on its children
        _lease(2, ran_s=1.0, expected_s=200.0, tokens=160),
        _lease(3, ran_s=1.0, expected_s=100.0, tokens=480),  # as due as 0, more blocks
        _lease(4, ran_s=1.0, expected_s=None, tokens=160),  # a tool of unknown length
        # Past its expected 10 s by far: a heavy tail, expected back after 2 x 150 s.
        _lease(5, ran_s=150.0, expected_s=10.0, tokens=160),
    ]
    chosen = PressureOrder().choose(leases, num_blocks_needed=10_000)
    assert [c.lease.lease_id for c in chosen] == [
        "4",
        "1",
        "2",
        "5",
        "3",
        "0",
    ]  # 4 and 1: newest first
    assert "due back" not in chosen[0].reason
    assert "due back in 199" in chosen[2].reason and "due back in 150" in chosen[3].reason
    leases[2].state = LeaseState.ACTIVE  # between calls: its tool no longer counts
    chosen = PressureOrder().choose(leases, num_blocks_needed=10_000)
    assert [c.lease.lease_id for c in chosen] == ["4", "1", "5", "3", "0", "2"]


def test_under_pressure_the_tool_expected_back_later_is_offloaded(
    backend: RecordingBackend,
) -> None:
    """Two held contexts (13 and 6 blocks of a 64-block pool), the larger one due back
    soon: above 16 blocks in use pressure needs a few, and the smaller one, whose tool
    runs longer, is the one moved to host memory (most blocks first would move the
    other)."""
    config = GovernorConfig(mode=AdmissionMode.OVERCOMMIT, admission_timeout_s=10,
                            park_after_s=0, retain_s=30, pressure_watermark=0.25)  # fmt: skip
    governor = Governor(backend, config=config, agents=[AGENT])
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)
    with governor.lease("agent") as soon, governor.lease("agent") as later:
        governor.complete(soon, _ask(100), max_tokens=2)
        with governor.tool_call(soon, "grep", expected_s=0.5):
            assert soon.tool_expected_s == 0.5 and soon.tool_started_at is not None
            governor.complete(later, _ask(40, "v"), max_tokens=2)
            with governor.tool_call(later, "pytest", expected_s=4.0):
                offloaded = [e.lease_id for e in events if e.kind == "offloaded"]
                assert offloaded == [later.lease_id]
                assert later.kv_offloaded and not soon.kv_offloaded
        assert soon.tool_started_at is None and later.tool_started_at is None
        governor.complete(later, _ask(40, "v"), max_tokens=2)  # restored, then reused
    m = backend.metrics()
    assert (m.num_blocks_in_use, m.num_blocks_swapped) == (m.num_blocks_pinned, 0)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, "3", True])
def test_a_bad_expected_s_is_refused_before_the_tool_starts(bad: object) -> None:
    from governor.testing import FakeBackend

    governor = Governor(FakeBackend(), agents=[AGENT])
    with governor.lease("agent") as lease:
        with pytest.raises(ConfigError, match="expected_s must be the seconds"):
            governor.tool_call(lease, "pytest", expected_s=bad)  # type: ignore[arg-type]
        assert lease.tool is None and lease.state is LeaseState.ACTIVE


def test_a_tool_without_expected_s_is_expected_to_take_its_mean_so_far() -> None:
    """Continuum's per-tool history: what the pressure policy expects of a tool call the
    runtime gave no duration for. Calls that raised are not counted."""
    from governor.testing import FakeBackend

    governor = Governor(FakeBackend(), agents=[AGENT])
    with governor.lease("agent") as lease:
        with governor.tool_call(lease, "grep"):
            assert lease.tool_expected_s is None  # never seen to end
            time.sleep(0.05)
        first = governor.tool_durations.mean("grep")
        assert first is not None and 0.05 <= first < 1.0
        with governor.tool_call(lease, "grep", expected_s=3.0):
            assert lease.tool_expected_s == 3.0  # the runtime's word comes first
        both = governor.tool_durations.mean("grep")
        assert both is not None and first / 2 <= both < first  # the second took ~0 s
        with pytest.raises(TimeoutError), governor.tool_call(lease, "grep"):
            assert lease.tool_expected_s == both
            time.sleep(0.3)
            raise TimeoutError
        assert governor.tool_durations.mean("grep") == both
        assert governor.tool_durations.mean("pytest") is None
        assert lease.tool_started_at is None and lease.tool_expected_s is None


def test_a_tool_that_mostly_outlasts_retain_s_is_held_on_host_not_on_the_device() -> None:
    """Without ``expected_s``, the median of the tool's last calls decides the hold: a
    tool whose calls mostly outlast ``retain_s`` would hold device blocks other agents
    need, so its context goes to host memory at once, while one slow call among quick
    ones (a heavy tail) still holds on the device."""
    from governor.testing import FakeBackend

    config = GovernorConfig(retain_s=1.0, park_after_s=0)
    governor = Governor(FakeBackend(), agents=[AGENT], config=config)
    for seconds in (3.0, 2.5, 0.2, 4.0):
        governor.tool_durations.record("pytest", seconds)
    for seconds in (0.01, 0.02, 30.0):
        governor.tool_durations.record("grep", seconds)
    assert governor.tool_durations.median("pytest") == 2.75
    assert governor.tool_durations.median("grep") == 0.02
    ask = [{"role": "user", "content": "Why is the build red?"}]
    held: dict[str, tuple[bool, bool]] = {}  # (held, on host)
    with governor.lease("agent") as lease:
        for tool, expected_s in (("pytest", None), ("grep", None), ("pytest", 0.5), ("ls", None)):
            governor.complete(lease, ask, max_tokens=4)
            with governor.tool_call(lease, tool, expected_s=expected_s):
                held[f"{tool}:{expected_s}"] = lease.num_retained_tokens > 0, lease.kv_offloaded
    assert held["pytest:None"] == (True, True)  # mostly back after retain_s: on host
    assert held["grep:None"] == (True, False)  # its mean (10 s) is a tail, its median 0.02 s
    assert held["pytest:0.5"] == (True, False)  # the runtime's word comes first
    assert held["ls:None"] == (True, False)  # never seen: held on the device, as before
