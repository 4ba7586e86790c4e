"""Where each request's time went on the twin, from its arrival to its finish.

Every instant a request spends in the engine is counted once, in one of five parts:

- ``queue_s``: in the engine but not in the step being computed (waiting for blocks or
  a batch slot, preempted, swapped out, or the engine idle between steps);
- ``prefill_s`` and ``recompute_s``: in a step that computes its prompt, split by the
  share of the step's prefill tokens for it that the engine had computed before and
  thrown away (``PrefillCounter.count``: recompute after preemption, or an agent's
  context evicted while it waited on a tool);
- ``decode_s``: in a step that computes its next token;
- ``swap_s``: the part of a step it is in that waits on host-link copies beyond the
  step's compute (``TwinEngine._step_end``): every request in the step waits for them.

A step's whole time counts for every request in it, its own work and the batch's alike:
it is the request's latency, as its caller sees it. Steps of a decode run
(``engine.decode_run``) follow one another with no gap, so the run is counted at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["TimeLedger", "TimeSplit"]


@dataclass(slots=True)
class TimeSplit:
    """One request's seconds, by what it was doing (see the module docstring)."""

    queue_s: float = 0.0
    prefill_s: float = 0.0
    recompute_s: float = 0.0
    swap_s: float = 0.0
    decode_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.queue_s + self.prefill_s + self.recompute_s + self.swap_s + self.decode_s


@dataclass(slots=True)
class _Open:
    mark: float  # counted up to here
    split: TimeSplit


@dataclass(slots=True)
class TimeLedger:
    """Each request's ``TimeSplit``, kept up to the end of the latest step."""

    splits: dict[str, TimeSplit] = field(default_factory=dict)  # every request seen
    _open: dict[str, _Open] = field(default_factory=dict)  # not finished yet

    def arrived(self, request_id: str, at: float) -> None:
        split = TimeSplit()
        self.splits[request_id] = split
        self._open[request_id] = _Open(at, split)

    def step(
        self, start: float, end: float, stall_s: float, work: Mapping[str, tuple[int, int]]
    ) -> None:
        """A step from ``start`` to ``end`` (``stall_s`` of it waiting on copies) computed
        ``work``: request id -> (tokens it prefilled, of which recomputed); (0, 0) for a
        decode."""
        for request_id, entry in self._open.items():
            split = entry.split
            tokens = work.get(request_id)
            if tokens is None:
                split.queue_s += max(0.0, end - entry.mark)
            else:
                began = max(start, entry.mark)
                split.queue_s += max(0.0, began - entry.mark)
                span = max(0.0, end - began)
                stall = min(stall_s, span)
                split.swap_s += stall
                compute = span - stall
                prefilled, recomputed = tokens
                if prefilled:
                    split.recompute_s += compute * recomputed / prefilled
                    split.prefill_s += compute * (prefilled - recomputed) / prefilled
                else:
                    split.decode_s += compute
            entry.mark = max(entry.mark, end)

    def decode_run(
        self, start: float, end: float, stall_s: float, request_ids: Iterable[str]
    ) -> None:
        """Consecutive decode steps of ``request_ids`` from ``start`` to ``end``, waiting
        ``stall_s`` in all on copies: the same as each step counted alone."""
        decoding = set(request_ids)
        for request_id, entry in self._open.items():
            split = entry.split
            if request_id not in decoding:
                split.queue_s += max(0.0, end - entry.mark)
            else:
                split.queue_s += max(0.0, start - entry.mark)
                split.swap_s += stall_s
                split.decode_s += end - start - stall_s
            entry.mark = max(entry.mark, end)

    def finished(self, request_id: str, at: float) -> None:
        """The request ended at ``at`` (its last step's end, or an abort): any time since
        the last step it was counted in was spent queued."""
        entry = self._open.pop(request_id, None)
        if entry is not None:
            entry.split.queue_s += max(0.0, at - entry.mark)
