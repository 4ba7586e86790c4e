"""The host link: copies queue one behind another, each taking latency + bytes over the
profile's bandwidth; an idle link starts a copy at once; each direction's totals apart."""

from __future__ import annotations

import dataclasses

import pytest

from engine.twin import get_profile
from engine.twin.link import Direction, HostLink, LinkError, LinkTotals

# Round figures, so the expected times are exact in binary floating point.
PROFILE = dataclasses.replace(
    get_profile("rx9070xt"), host_link_bandwidth_bytes_s=1024.0, host_link_latency_s=0.5
)


def test_an_idle_link_starts_a_copy_at_once() -> None:
    link = HostLink(profile=PROFILE)
    assert link.charge(2048, at=10.0, direction=Direction.OFFLOAD) == 10.0 + 0.5 + 2.0
    # Idle again by 12.5: a copy at 20.0 does not wait for anything.
    assert link.charge(1024, at=20.0, direction=Direction.RESTORE) == 20.0 + 0.5 + 1.0


def test_back_to_back_copies_queue_behind_each_other() -> None:
    link = HostLink(profile=PROFILE)
    first = link.charge(1024, at=0.0, direction=Direction.OFFLOAD)
    second = link.charge(3072, at=0.25, direction=Direction.RESTORE)  # link busy until 1.5
    third = link.charge(512, at=0.25, direction=Direction.OFFLOAD)
    assert first == 1.5
    assert second == first + 0.5 + 3.0
    assert third == second + 0.5 + 0.5
    assert link.free_at == third


def test_totals_per_direction() -> None:
    link = HostLink(profile=PROFILE)
    assert link.totals(Direction.OFFLOAD) == LinkTotals()
    link.charge(1024, at=0.0, direction=Direction.OFFLOAD)
    link.charge(2048, at=0.0, direction=Direction.OFFLOAD)
    link.charge(4096, at=0.0, direction=Direction.RESTORE)
    assert link.totals(Direction.OFFLOAD) == LinkTotals(
        num_copies=2, num_bytes=3072, busy_s=(0.5 + 1.0) + (0.5 + 2.0)
    )
    assert link.totals(Direction.RESTORE) == LinkTotals(num_copies=1, num_bytes=4096, busy_s=4.5)


def test_a_copy_of_no_bytes_costs_nothing() -> None:
    link = HostLink(profile=PROFILE)
    assert link.charge(0, at=3.0, direction=Direction.OFFLOAD) == 3.0
    assert link.free_at == 0.0
    assert link.totals(Direction.OFFLOAD) == LinkTotals()


@pytest.mark.parametrize(
    ("num_bytes", "at", "direction", "message"),
    [
        (-1, 0.0, Direction.OFFLOAD, "int >= 0 of bytes"),
        (1.5, 0.0, Direction.OFFLOAD, "int >= 0 of bytes"),
        (1, float("nan"), Direction.OFFLOAD, "finite time"),
        (1, 0.0, "offload", "Direction"),
    ],
)
def test_bad_copies_are_refused_and_charge_nothing(num_bytes, at, direction, message) -> None:
    link = HostLink(profile=PROFILE)
    with pytest.raises(LinkError, match=message):
        link.charge(num_bytes, at=at, direction=direction)
    assert link.free_at == 0.0
