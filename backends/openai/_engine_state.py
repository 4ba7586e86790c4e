"""``EngineState``: the latest ``EngineReading`` of an external engine, read at most once per
interval, with the one-time warnings and the restart marks it implies.

A probe's reading is cached for ``interval_s`` (capacity and metrics are asked for on
every admission decision; the engine is asked far less). Each field an engine does not
expose is logged once, as a warning on the ``kvgov`` logger, never raised: the backend
falls back to what the user declared, or says it does not know.

A restart shows as a new ``instance`` or as a counter going down (llama-server says no
start time, but its token counters start again from 0). A reading cached from before
this client's last calls may already be 0 too, so the counters are also held to a floor:
``prefix_cache_queries`` counts every prompt token the engine served, at least those of
this client's calls since the last restart (``served``); after a call failed to reach
the engine (``suspect``), a reading below that is a new engine. (Only then: a reading
taken as a call ends may not count it yet.) ``instance_of`` folds both into
one id, which the backend's ``Session.observe`` compares, as it compares
``kvgov serve``'s instance ids.

Thread-safe; ``_lock`` is a leaf (the probe reads outside it).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import fields

from backends.http.probe import EngineProbe, EngineReading, ProbeHTTP

__all__ = ["EngineState"]

_log = logging.getLogger("kvgov")
_COUNTERS = ("num_preemptions", "prefix_cache_queries", "prefix_cache_hits")


class EngineState:
    def __init__(self, probe: EngineProbe, http: ProbeHTTP, *, interval_s: float) -> None:
        self.probe = probe
        self._http = http
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._reading: EngineReading | None = None
        self._read_at = 0.0
        self._warned: set[str] = set()
        self._epoch = 0  # counters went down this many times: restarts without a new id
        self._floor = 0  # prompt tokens this client's calls were served since then

    def read(self, *, fresh: bool = False, suspect: bool = False) -> EngineReading:
        """The latest reading; ``fresh``: read the engine now (raises while it is away);
        ``suspect``: it was away, so hold its counters to the floor."""
        with self._lock:
            stale = time.monotonic() - self._read_at >= self.interval_s
            if not fresh and not stale and self._reading is not None:
                return self._reading
        reading = self.probe.read(self._http)  # outside the lock: a few round trips
        with self._lock:
            previous, self._reading, self._read_at = self._reading, reading, time.monotonic()
            queries = reading.prefix_cache_queries
            below = suspect and queries is not None and queries < self._floor
            if below or (previous is not None and _went_down(previous, reading)):
                self._epoch += 1
                self._floor = 0
            new = [item for item in reading.missing if item not in self._warned]
            self._warned.update(new)
        for item in new:
            _log.warning(
                "%s at %s does not expose %s; kvgov uses what was declared, or what its "
                "own calls reserved, instead",
                self.probe.engine,
                getattr(self._http, "base_url", "the engine"),
                item,
            )
        return reading

    def served(self, prompt_tokens: int) -> None:
        """A call of this client was served ``prompt_tokens`` prompt tokens."""
        with self._lock:
            self._floor += prompt_tokens

    def instance_of(self, reading: EngineReading) -> str:
        with self._lock:
            return f"{reading.instance or self.probe.engine}#{self._epoch}"


def _went_down(before: EngineReading, after: EngineReading) -> bool:
    names = {f.name for f in fields(EngineReading)}
    for name in _COUNTERS:
        assert name in names
        old, new = getattr(before, name), getattr(after, name)
        if old is not None and new is not None and new < old:
            return True
    return False
