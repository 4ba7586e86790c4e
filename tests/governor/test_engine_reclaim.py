"""A hold the engine gives up itself is counted and reported by the governor.

When a running request needs the blocks a parked agent's held context occupies, the
bundled engine moves that hold to host memory (or ends it when the host has no room)
before it preempts anyone. The governor used not to hear of it: its ledger kept counting
the hold as resident and no event said where the blocks went. ``LocalBackend.held_contexts``
says which holds the engine has and where, and the governor reads it whenever it checks
for pressure. On the bundled engine (tiny-random, real forward passes)."""

from __future__ import annotations

import pytest

from governor import AdmissionMode, AgentSpec, Governor, GovernorConfig, GovernorEvent, LocalBackend

# The governor never offloads on its own (pressure_watermark 1.0): every move is the
# engine's. Parked at once, held for longer than the test.
CONFIG = GovernorConfig(
    mode=AdmissionMode.OVERCOMMIT, park_after_s=0.0, retain_s=60.0, pressure_watermark=1.0
)
AGENTS = [AgentSpec(name="a", ceiling_tokens=512), AgentSpec(name="b", ceiling_tokens=512)]


def _task(name: str, words: int) -> list[dict[str, str]]:
    text = " ".join(f"{name}{i}" for i in range(words))
    return [{"role": "user", "content": f"Read this log and name the failing step: {text}"}]


@pytest.mark.parametrize("host_room", [True, False], ids=["host-room", "no-host-room"])
def test_a_hold_the_engine_moves_or_ends_is_reported_and_leaves_the_ledger(
    host_room: bool,
) -> None:
    # 40 blocks of 16 tokens: a's context and b's prompt (25 blocks each) do not fit at once.
    backend = LocalBackend(config={"num_blocks": 40, "block_size": 16,
                                   "swap_space_bytes": (64 << 20) if host_room else 0})  # fmt: skip
    governor = Governor(backend, config=CONFIG, agents=AGENTS)
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)
    moves = ("offloaded", "dropped", "restored")
    try:
        with governor.lease("a") as a:
            governor.complete(a, _task("a", 180), max_tokens=4)
            with governor.tool_call(a, "pytest", expected_s=0.01):
                held = a.num_retained_blocks
                assert held > 0 and dict(backend.held_contexts()) == {a.budget: False}
                assert governor.admission.ledger()[2] == held  # counted while a is parked
                with governor.lease("b") as b:
                    # b's prompt needs the blocks a's hold sits on: the engine gives them up.
                    governor.complete(b, _task("b", 180), max_tokens=4)
                    assert backend.held_contexts().get(a.budget) is (True if host_room else None)
                    assert not [e for e in events if e.kind in moves]  # not heard of yet
                    # The governor reads it at its next check: b's next call.
                    governor.complete(b, _task("b", 100), max_tokens=4)
                moved = [e for e in events if e.kind in moves]
                kind = "offloaded" if host_room else "dropped"
                assert [(e.kind, e.agent) for e in moved] == [(kind, "a")]
                assert moved[0].attributes["blocks"] == held
                assert moved[0].attributes["reason"].startswith("by the engine")
                assert governor.admission.ledger()[2] == 0  # nothing of a's on the device
                assert a.kv_offloaded is host_room
                assert (a.num_retained_tokens > 0) is host_room  # on the host, or gone
            restores: list[str] = []
            backend.restore = lambda *, budget: restores.append(budget)  # type: ignore[method-assign]
            governor.complete(a, _task("a", 180), max_tokens=4)
        restored = [e.kind for e in events if e.kind == "restored" and e.agent == "a"]
        assert restored == (["restored"] if host_room else [])  # before a's next call
        # ... by the call itself (restores_at_call), with no round trip to the engine
        # first: the context came back whole from the host.
        assert restores == []
        last = [e for e in events if e.kind == "call.finished" and e.agent == "a"][-1]
        assert not host_room or last.attributes["cached_tokens"] >= held * 16
        m = backend.metrics()
        assert (m.num_blocks_in_use, m.num_blocks_swapped) == (m.num_blocks_pinned, 0)
    finally:
        backend.close()
