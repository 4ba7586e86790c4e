"""What the demo measures in each run, from the governor's events and the engine.

``RunStats`` subscribes to a governor's events (thread-safe: they arrive from the event
loop, tool threads and the deadline thread) and a sampler thread polls the backend's
block counts, so the peak is seen even between events. Reserved KV is what the run's
scheme sets aside: under reserve-for-max admission each active agent's whole ceiling;
paged, the blocks in use. Live KV is the tokens whose K/V the engine holds. Waste is
averaged over the samples: one minus live over reserved.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from governor import Backend, BackendError, Governor, GovernorEvent

__all__ = ["RunStats"]

_SAMPLE_S = 0.02


@dataclass(slots=True)
class _Lease:
    agent: str
    ceiling: int
    tokens: int = 0
    active: bool = False
    peak_tokens: int = 0


@dataclass(slots=True)
class RunStats:
    bytes_per_token: int
    bytes_per_block: int
    paged: bool  # how reserved KV is counted
    leases: dict[str, _Lease] = field(default_factory=dict)
    peak_active: int = 0
    peak_reserved_bytes: int = 0
    peak_live_bytes: int = 0
    peak_blocks: int = 0
    reserved_sum: int = 0  # over the samples
    live_sum: int = 0
    snapshot: dict[str, int] = field(default_factory=dict)  # lease tokens at the live peak
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
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- events -------------------------------------------------------------------------
    def on_event(self, event: GovernorEvent) -> None:
        with self._lock:
            self._on_event(event)

    def _on_event(self, event: GovernorEvent) -> None:
        kind, attributes = event.kind, event.attributes
        lease = self.leases.get(event.lease_id or "")
        if kind == "requested":
            self.leases[event.lease_id or ""] = _Lease(
                str(event.agent), int(attributes["ceiling_tokens"])
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
            if kind == "released":
                lease.tokens = 0
        elif kind == "call.finished":
            self.model_calls += 1
            lease.tokens = int(attributes["tokens_in_context"])
            lease.peak_tokens = max(lease.peak_tokens, lease.tokens)
        elif kind == "compacted":
            self.compactions += 1
            self.tokens_compacted += event.record.tokens_saved
        elif kind == "summarized":
            self.tokens_summarized += event.record.tokens_saved
        elif kind == "offloaded":
            self.offloads += 1
        self.peak_active = max(self.peak_active, sum(1 for x in self.leases.values() if x.active))

    def _on_sample(self, blocks: int, tokens: int) -> None:
        with self._lock:
            if self.paged:
                reserved = blocks * self.bytes_per_block
            else:
                active = (lease.ceiling for lease in self.leases.values() if lease.active)
                reserved = sum(active) * self.bytes_per_token
            live = tokens * self.bytes_per_token
            self.peak_blocks = max(self.peak_blocks, blocks)
            self.peak_reserved_bytes = max(self.peak_reserved_bytes, reserved)
            if live > self.peak_live_bytes:
                self.peak_live_bytes = live
                self.snapshot = {
                    lease_id: lease.tokens
                    for lease_id, lease in self.leases.items()
                    if lease.tokens
                }
            if reserved:
                self.reserved_sum += reserved
                self.live_sum += min(live, reserved)

    @property
    def waste(self) -> float:
        return 1 - self.live_sum / self.reserved_sum if self.reserved_sum else 0.0

    def watch(self, governor: Governor) -> _Watch:
        """Subscribe and sample until the returned handle is stopped."""
        return _Watch(self, governor)


class _Watch:
    def __init__(self, stats: RunStats, governor: Governor) -> None:
        self._stats = stats
        self._backend: Backend = governor.backend
        self._preempted = self._backend.metrics().num_preemptions
        self._unsubscribe = governor.subscribe(stats.on_event)
        self._stop = threading.Event()
        self._started = time.perf_counter()
        self._thread = threading.Thread(target=self._sample, name="kvgov-demo-sampler")
        self._thread.daemon = True
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(_SAMPLE_S):
            try:
                self._take_sample()
            except BackendError:  # the backend closed under us: the run is over
                return

    def _take_sample(self) -> None:
        metrics = self._backend.metrics()
        self._stats._on_sample(metrics.num_blocks_in_use, metrics.num_tokens_in_use)

    def stop(self) -> None:
        self._stats.wall_s = time.perf_counter() - self._started
        self._stop.set()
        self._thread.join()
        self._unsubscribe()
        self._stats.preemptions = self._backend.metrics().num_preemptions - self._preempted
