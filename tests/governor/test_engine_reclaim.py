"""A hold the engine gives up itself is counted and reported by the governor.

When a running request needs the blocks a parked agent's held context occupies, the
bundled engine moves that hold to host memory (or ends it when the host has no room)
before it preempts anyone. The governor used not to hear of it: its ledger kept counting
the hold as resident and no event said where the blocks went. ``held_contexts`` says
which holds the engine has and where, and the governor reads it at its pressure checks
once the engine's count of such moves (``num_holds_reclaimed``) changed. On the bundled
engine (tiny-random, real forward passes), in process and behind a kvgov serve process."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from backends import LocalBackend
from backends.remote.backend import RemoteBackend
from governor import AdmissionMode, AgentSpec, Governor, GovernorConfig, GovernorEvent

# The governor never offloads on its own (pressure_watermark 1.0): every move is the
# engine's. Parked at once, held for longer than the test.
CONFIG = GovernorConfig(
    mode=AdmissionMode.OVERCOMMIT, park_after_s=0.0, retain_s=60.0, pressure_watermark=1.0
)


def _task(name: str, words: int) -> list[dict[str, str]]:
    text = " ".join(f"{name}{i}" for i in range(words))
    return [{"role": "user", "content": f"Read this log and name the failing step: {text}"}]


@dataclass(frozen=True, slots=True)
class Pool:
    backend: LocalBackend | RemoteBackend
    host_room: bool
    words: int  # of a's and b's tasks: together they do not fit the pool
    ceiling: int


@pytest.fixture(params=["local", "local-no-host-room", "remote"])
def pool(request: pytest.FixtureRequest) -> Iterator[Pool]:
    """40 blocks of 16 tokens in process (25 blocks a task), with 64 MiB of host memory
    or none; or the kvgov serve process's 64 blocks (35 blocks a task)."""
    if request.param == "remote":
        server = request.getfixturevalue("kvgov_server")
        assert server.config == {"num_blocks": 64, "block_size": 16}
        made: LocalBackend | RemoteBackend = RemoteBackend(server.base_url)
        yield Pool(made, True, 260, 640)
    else:
        host = 0 if request.param.endswith("no-host-room") else 64 << 20
        made = LocalBackend(config={"num_blocks": 40, "block_size": 16,
                                    "swap_space_bytes": host})  # fmt: skip
        yield Pool(made, host > 0, 180, 512)
    made.close()


def test_a_hold_the_engine_moves_or_ends_is_reported_and_leaves_the_ledger(pool: Pool) -> None:
    backend, host_room, words = pool.backend, pool.host_room, pool.words
    agents = [AgentSpec(name=name, ceiling_tokens=pool.ceiling) for name in ("a", "b")]
    reads: list[int] = []  # the governor's reads of the holds
    original = backend.held_contexts
    backend.held_contexts = lambda: reads.append(1) or original()  # type: ignore[method-assign]
    governor = Governor(backend, config=CONFIG, agents=agents)
    holds = type(backend).held_contexts.__get__(backend)  # the test's own reads
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)
    moves = ("offloaded", "dropped", "restored")
    with governor.lease("a") as a:
        governor.complete(a, _task("a", words), max_tokens=4)
        with governor.tool_call(a, "pytest", expected_s=0.01):
            held = a.num_retained_blocks
            assert held > 0 and holds().get(a.budget) is False
            assert governor.admission.ledger()[2] == held  # counted while a is parked
            with governor.lease("b") as b:
                # b's prompt needs the blocks a's hold sits on: the engine gives them up.
                governor.complete(b, _task("b", words), max_tokens=4)
                assert holds().get(a.budget) is (True if host_room else None)
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
        governor.complete(a, _task("a", words), max_tokens=4)
    restored = [e.kind for e in events if e.kind == "restored" and e.agent == "a"]
    assert restored == (["restored"] if host_room else [])  # before a's next call
    # ... by the call itself (restores_at_call), with no round trip to the engine
    # first: the context came back whole from the host.
    assert restores == []
    last = [e for e in events if e.kind == "call.finished" and e.agent == "a"][-1]
    assert not host_room or last.attributes["cached_tokens"] >= held * 16
    m = backend.metrics()
    assert (m.num_blocks_in_use, m.num_blocks_swapped) == (m.num_blocks_pinned, 0)
    # Read only once the engine's count of its own moves changed: once here (and on the
    # server the earlier tests used, maybe once more at the first check).
    assert m.num_holds_reclaimed >= 1
    assert len(reads) == 1 or (len(reads) == 2 and isinstance(backend, RemoteBackend))
