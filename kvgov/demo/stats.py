"""What the demo measures in each run, from the governor's events and the engine.

``RunStats`` subscribes to a governor's events (thread-safe: they arrive from the event
loop, tool threads and the deadline thread) and a sampler thread reads the engine's
``kv_snapshot`` every few milliseconds: each budget's blocks on the device (running and
waiting requests, prompts being computed, held contexts) and offloaded to the host, all
read at one instant between two engine steps.

Reserved KV is what the run's scheme sets aside: under reserve-for-max, each admitted
agent's whole ceiling (its slot); paged, the blocks in use. Live KV is the tokens whose
K/V sits on the device: under reserve-for-max the context resident in each slot (a
contiguous cache keeps an agent's context in its slot between calls, and shares nothing),
paged the tokens the blocks in use hold (a shared prefix once). Waste is averaged over
the samples: one minus live over reserved.

The kvgov run's memory map is drawn from the snapshot taken when its blocks in use
peaked (``peak``), so every agent's figure in it comes from the same instant.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from backends import LocalBackend
from governor import BackendError, Governor, GovernorEvent

__all__ = ["KVSnapshot", "LeaseInfo", "PeakSnapshot", "RunStats", "budget_of"]

_SAMPLE_S = 0.01


class BudgetBlocks(Protocol):
    """The part of ``engine.BudgetBlocks`` the demo reads (integrations/ never import the
    engine; ``LocalBackend.kv_snapshot`` hands these over)."""

    @property
    def device_block_ids(self) -> frozenset[int]: ...
    @property
    def num_device_tokens(self) -> int: ...
    @property
    def num_host_blocks(self) -> int: ...


class KVSnapshot(Protocol):
    """The part of ``engine.KVSnapshot`` the demo reads."""

    @property
    def budgets(self) -> Mapping[str, BudgetBlocks]: ...
    @property
    def pinned_block_ids(self) -> frozenset[int]: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def num_blocks_in_use(self) -> int: ...
    @property
    def num_tokens_in_use(self) -> int: ...


def budget_of(lease_id: str) -> str:
    """The engine budget a lease owns (``Lease.budget``)."""
    return f"lease-{lease_id}"


@dataclass(slots=True)
class LeaseInfo:
    agent: str
    ceiling: int
    active: bool = False
    requested_at: float = 0.0  # GovernorEvent.at: seconds since the epoch


@dataclass(frozen=True, slots=True)
class PeakSnapshot:
    """The engine's snapshot at the run's peak of blocks in use, and the leases then."""

    kv: KVSnapshot
    leases: dict[str, LeaseInfo]  # by budget name


@dataclass(slots=True)
class RunStats:
    bytes_per_token: int
    bytes_per_block: int
    paged: bool  # how reserved and live KV are counted
    leases: dict[str, LeaseInfo] = field(default_factory=dict)  # by lease id
    peak_active: int = 0
    peak_reserved_bytes: int = 0
    peak_live_bytes: int = 0
    peak_blocks: int = 0
    peak: PeakSnapshot | None = None
    num_samples: int = 0
    reserved_sum: int = 0  # over the samples
    live_sum: int = 0
    waits: list[float] = field(default_factory=list)
    compactions: int = 0
    tokens_compacted: int = 0
    tokens_summarized: int = 0
    model_calls: int = 0
    offloads: int = 0
    preemptions: int = 0
    wall_s: float = 0.0
    failures: list[str] = field(default_factory=list)
    oom_failures: int = 0
    jct_s: list[float] = field(default_factory=list)  # each job's: a worker lease's life
    job_agent: str = "worker"  # the agent whose leases are the swarm's jobs
    recomputed_tokens: int = 0  # the engine's prefill counter, over the run
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- events -------------------------------------------------------------------------
    def on_event(self, event: GovernorEvent) -> None:
        with self._lock:
            self._on_event(event)

    def _on_event(self, event: GovernorEvent) -> None:
        kind, attributes = event.kind, event.attributes
        lease = self.leases.get(event.lease_id or "")
        if kind == "requested":
            self.leases[event.lease_id or ""] = LeaseInfo(
                str(event.agent), int(attributes["ceiling_tokens"]), requested_at=event.at
            )
            return
        if lease is None:
            return
        if kind in ("admitted", "resumed"):
            lease.active = True
            if float(attributes["wait_s"]) > 0.001:
                self.waits.append(float(attributes["wait_s"]))
        elif kind in ("parked", "released"):
            lease.active = False
            if kind == "released" and lease.agent == self.job_agent:
                self.jct_s.append(event.at - lease.requested_at)
        elif kind == "call.finished":
            self.model_calls += 1
        elif kind == "compacted":
            self.compactions += 1
            self.tokens_compacted += event.record.tokens_saved
        elif kind == "summarized":
            self.tokens_summarized += event.record.tokens_saved
        elif kind == "offloaded":
            self.offloads += 1
        self.peak_active = max(self.peak_active, sum(1 for x in self.leases.values() if x.active))

    # -- samples ------------------------------------------------------------------------
    def on_sample(self, kv: KVSnapshot) -> None:
        with self._lock:
            if self.paged:
                reserved = kv.num_blocks_in_use * self.bytes_per_block
                live = kv.num_tokens_in_use * self.bytes_per_token
            else:
                reserved, live = self._slots(kv)
            self.num_samples += 1
            self.peak_reserved_bytes = max(self.peak_reserved_bytes, reserved)
            self.peak_live_bytes = max(self.peak_live_bytes, live)
            if kv.num_blocks_in_use > self.peak_blocks or self.peak is None:
                self.peak_blocks = kv.num_blocks_in_use
                self.peak = PeakSnapshot(
                    kv,
                    {
                        budget_of(lease_id): LeaseInfo(lease.agent, lease.ceiling, lease.active)
                        for lease_id, lease in self.leases.items()
                    },
                )
            if reserved:
                self.reserved_sum += reserved
                self.live_sum += live

    def _slots(self, kv: KVSnapshot) -> tuple[int, int]:
        """Reserve-for-max: each admitted lease's ceiling is its slot; the context resident
        in a slot is what its budget holds on the device (never more than the slot)."""
        reserved = live = 0
        for lease_id, lease in self.leases.items():
            if not lease.active:
                continue
            reserved += lease.ceiling
            held = kv.budgets.get(budget_of(lease_id))
            if held is not None:
                live += min(held.num_device_tokens, lease.ceiling)
        return reserved * self.bytes_per_token, live * self.bytes_per_token

    @property
    def jct_mean_s(self) -> float:
        """Mean job completion time: a worker lease's, from its request to its release."""
        return sum(self.jct_s) / len(self.jct_s) if self.jct_s else 0.0

    @property
    def waste(self) -> float:
        return 1 - self.live_sum / self.reserved_sum if self.reserved_sum else 0.0

    def watch(self, governor: Governor, backend: LocalBackend) -> _Watch:
        """Subscribe and sample until the returned handle is stopped."""
        return _Watch(self, governor, backend)


class _Watch:
    def __init__(self, stats: RunStats, governor: Governor, backend: LocalBackend) -> None:
        self._stats = stats
        self._backend = backend
        self._preempted = backend.metrics().num_preemptions
        self._recomputed = backend.live_snapshot().metrics.num_recomputed_tokens
        self._unsubscribe = governor.subscribe(stats.on_event)
        self._stop = threading.Event()
        self._started = time.perf_counter()
        stats.on_sample(backend.kv_snapshot())  # the pool before the run: never no sample
        self._thread = threading.Thread(target=self._sample, name="kvgov-demo-sampler")
        self._thread.daemon = True
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(_SAMPLE_S):
            try:
                self._stats.on_sample(self._backend.kv_snapshot())
            except BackendError:  # the backend closed under us: the run is over
                return

    def stop(self) -> None:
        self._stats.wall_s = time.perf_counter() - self._started
        self._stop.set()
        self._thread.join()
        self._unsubscribe()
        self._stats.preemptions = self._backend.metrics().num_preemptions - self._preempted
        recomputed = self._backend.live_snapshot().metrics.num_recomputed_tokens
        self._stats.recomputed_tokens = recomputed - self._recomputed
