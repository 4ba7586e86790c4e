"""Overcommit admission of a parked lease that comes back with its context still held on
the device: it is charged only what it holds beyond the hold. Refusing it would free
none of the hold's blocks; it would only keep them idle while the agent waits (the
swarm benchmark's workers waited seconds at a tight budget for exactly that)."""

from __future__ import annotations

from governor import AdmissionMode, AgentSpec, Governor, GovernorConfig, LeaseState
from governor.testing import FakeBackend

TASK = [{"role": "user", "content": "word " * 640}]  # about 40 blocks of 16


def test_a_lease_resuming_onto_its_held_context_is_not_charged_it_again() -> None:
    # Limit: 100 blocks x 0.9 = 90; live use x 1.25 must fit, so at most 72 blocks live.
    backend = FakeBackend(num_blocks=100, block_size=16)
    agent = AgentSpec(name="agent", ceiling_tokens=1_440)
    config = GovernorConfig(
        mode=AdmissionMode.OVERCOMMIT, park_after_s=0, retain_s=30, admission_timeout_s=1.0
    )
    governor = Governor(backend, config=config, agents=[agent])
    with governor.lease("agent") as first:
        governor.complete(first, TASK, max_tokens=8)
        with governor.lease("agent") as second:
            with governor.tool_call(first, "build"):
                assert first.state is LeaseState.PARKED
                held = first.num_retained_blocks
                assert held == first.blocks_live - 1  # its full blocks; the tail is not held
                governor.complete(second, TASK, max_tokens=8)
                assert second.blocks_live == first.blocks_live >= 40
            # Both contexts whole: 2 x 41 x 1.25 > 90. Its hold is 40 of its 41 blocks,
            # so resuming adds 1: (41 + 1) x 1.25 fits, and it runs at once.
            governor.complete(first, TASK, max_tokens=8)
            assert first.state is LeaseState.ACTIVE and second.state is LeaseState.ACTIVE
    assert governor.admission.ledger() == (0, 0, 0, 0)
    assert backend.metrics().num_blocks_in_use == 0
