"""Where a job's time went: its agent's tools, its workers, waiting, and the engine's work
for its calls, on the hardware twin.

A job (one agent's run, ``RunResult.jct_s``) is its calls and the gaps between them. Each
call's time in the engine, from its arrival to its finish, comes from the twin's ledger
(``engine.twin.time_ledger``): queued in the engine, prefill, recompute, swap stall and
decode. Each gap after a call is the tool the call ended in (its drawn duration: the
agent waits that long), or for a planner's fan-out the wait for its team's last worker
to finish. What is left of the job's time is ``admission_s``: the agent waited before
its call reached the engine, for admission by the policy (kvgov's governor admits,
parks and restores agents before their calls go out; a baseline sends each call when
it is due), or on its runtime. The parts add up to the job's time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

from engine.twin.time_ledger import TimeSplit
from engine.twin.twin_engine import RequestTimes
from kvgov.benchmarks.swarm.workload import AgentScript

__all__ = ["PARTS", "JobTime", "job_times"]


@dataclass(frozen=True, slots=True)
class JobTime:
    """One job's seconds by where they went (the module docstring)."""

    tool_s: float = 0.0
    workers_s: float = 0.0  # a planner waiting on its team's workers
    admission_s: float = 0.0  # waiting before a call reached the engine
    queue_s: float = 0.0  # in the engine, not in the step being computed
    prefill_s: float = 0.0
    recompute_s: float = 0.0
    swap_s: float = 0.0  # steps waiting on host-link copies beyond their compute
    decode_s: float = 0.0

    @property
    def total_s(self) -> float:
        return sum(getattr(self, name) for name in _FIELDS)

    def part(self, name: str) -> float:
        """The seconds of part ``name`` (one of ``PARTS``)."""
        return float(getattr(self, f"{name}_s"))


_FIELDS = tuple(f.name for f in fields(JobTime))
PARTS = tuple(name.removesuffix("_s") for name in _FIELDS)


def job_times(
    scripts: Sequence[AgentScript],
    jct_s: Mapping[str, float],
    calls: Mapping[str, str],
    times: Mapping[str, RequestTimes],
    splits: Mapping[str, TimeSplit],
) -> dict[str, JobTime]:
    """Each finished job's ``JobTime``: ``jct_s`` its time, ``calls`` "agent/turn" -> the
    request id of that call, ``times`` and ``splits`` each request's, from the twin."""
    by_name = {script.name: script for script in scripts}

    def finish(name: str, turn: int) -> float:
        end = times[calls[f"{name}/{turn}"]].finish_s
        assert end is not None, f"{name}/{turn} never finished"
        return end

    out = {}
    for name, total in jct_s.items():
        script = by_name[name]
        engine = TimeSplit()
        tool = workers = 0.0
        for turn_index, turn in enumerate(script.turns):
            request_id = calls[f"{name}/{turn_index}"]
            split = splits[request_id]
            engine.queue_s += split.queue_s
            engine.prefill_s += split.prefill_s
            engine.recompute_s += split.recompute_s
            engine.swap_s += split.swap_s
            engine.decode_s += split.decode_s
            if turn.tool is None:
                continue
            ended = finish(name, turn_index)
            gap = times[calls[f"{name}/{turn_index + 1}"]].arrival_s - ended
            if turn.tool == "fanout":
                team = [s for s in scripts if s.team == script.team and not s.planner]
                last = max(_last_finish(w, calls, times) for w in team)
                workers += min(gap, max(0.0, last - ended))
            else:
                tool += min(gap, turn.tool_s)
        admission = total - tool - workers - engine.total_s
        out[name] = JobTime(
            tool_s=tool,
            workers_s=workers,
            admission_s=admission,
            queue_s=engine.queue_s,
            prefill_s=engine.prefill_s,
            recompute_s=engine.recompute_s,
            swap_s=engine.swap_s,
            decode_s=engine.decode_s,
        )
    return out


def _last_finish(
    worker: AgentScript, calls: Mapping[str, str], times: Mapping[str, RequestTimes]
) -> float:
    """When the worker's last call that was made ended (a failed worker's job ends
    early, and its planner waits only for the others)."""
    for turn in reversed(range(len(worker.turns))):
        request_id = calls.get(f"{worker.name}/{turn}")
        end = None if request_id is None else times[request_id].finish_s
        if end is not None:
            return end
    return -math.inf
