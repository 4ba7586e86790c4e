"""A job's unloaded time: how long it takes with the machine to itself, the reference its
goodput SLO is a multiple of (``stats.slo_s_by_job``).

Each team runs alone under ``paged`` on an engine where memory never binds, its own
system prompt already in the prefix cache, no other team on the device: every agent's
job time there is that job's unloaded time. The system prompt is computed first by a
warm-up request, because under load the prefix cache holds it too (kvgov pins every
team's at the start of a run; under the other policies an earlier team of the tenant
leaves most of it cached), so a job's unloaded time is at most its time under any load
and any policy, up to floating-point rounding.

The unloaded time of a job depends on its team alone, never on the rates swept: a team's
tenant, prompts, replies and tool latencies are drawn from the seed and the team's index
(``workload.arrivals`` draws a team's gap and tenant together, ``workload.build`` seeds
each team's draws by its index), and the rate only scales the gaps between arrivals. So
a team is run alone once per seed and serves every rate at which it arrives; its scripts
are compared first, and a team whose scripts differ is run again. The engine's room is
set by the workload's shape (the widest team, each agent at the ceiling), not by which
teams a rate draws.

Errors: ``UnloadedRunError`` (a ``RuntimeError``) when a job fails even alone, so no SLO
can be set for it; its message says what to change.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvgov.benchmarks.swarm.workload import AgentScript, Turn

if TYPE_CHECKING:
    from engine import Engine
    from kvgov.benchmarks.openloop.workload import OpenLoopWorkload
    from kvgov.benchmarks.openloop.workload_setup import WorkloadSetup
    from kvgov.benchmarks.swarm.twin import TwinDevice
    from kvgov.simulate import Scenario

__all__ = ["UnloadedRunError", "UnloadedTimes"]

# Twice the blocks of the widest team with every agent at the ceiling at once, so the
# stale history compaction leaves in the cache is evicted, least recently used, before
# any context an agent sends again. (On the reference card's twin a swe team alone with
# room for exactly its agents' peaks computed 4,373 tokens again and took 1 s longer;
# with 1.5x, 2x or 4x that room, 405 tokens, its partial last blocks, and equal times.)
_ROOM_FACTOR = 2
# The team arrives this long (virtual seconds) after its system prompt's warm-up starts;
# where the warm-up takes longer (a slow device), the team is run again after twice that.
_WARM_UP_S = 10.0


class UnloadedRunError(RuntimeError):
    """A job failed with the machine to itself: it has no unloaded time, so no SLO."""

    def __init__(self, *, jobs: list[str]) -> None:
        self.jobs = jobs
        super().__init__(
            f"jobs failed even run alone with room for every context ({'; '.join(jobs)}): "
            "no SLO can be set for them. A prompt longer than the model's context "
            "(max_model_len) is the usual cause: lower the workload's ceiling_tokens, "
            "tool_output_tokens or system_tokens"
        )


@dataclass(slots=True)
class _Team:
    scripts: tuple[AgentScript, ...]  # as it arrives alone: its planner at 0 s
    jct_s: dict[str, float]


@dataclass(slots=True, kw_only=True)
class UnloadedTimes:
    """Every job's unloaded time on ``scenario``'s twin (``device``), each team run once
    per seed however many rates draw it; ``deadline_s`` is virtual, per team."""

    scenario: Scenario
    device: TwinDevice
    deadline_s: float
    num_team_runs: int = field(init=False, default=0)  # teams run alone so far
    _engines: dict[int, Engine] = field(init=False, default_factory=dict)  # by room, blocks
    _teams: dict[tuple[int, int], _Team] = field(init=False, default_factory=dict)

    def of(self, setup: WorkloadSetup) -> dict[str, float]:
        """Each job of ``setup`` (an agent, by name) -> its unloaded time, seconds."""
        engine = self._engine(setup.workload)
        by_team: dict[int, list[AgentScript]] = {}
        for script in setup.scripts:
            by_team.setdefault(script.team, []).append(script)
        out: dict[str, float] = {}
        for team, scripts in by_team.items():
            alone = tuple(
                dataclasses.replace(s, arrival_s=0.0) if s.planner else s for s in scripts
            )
            key = (setup.workload.seed, team)
            known = self._teams.get(key)
            if known is None or known.scripts != alone:
                known = _Team(alone, self._run_alone(engine, alone, setup))
                self._teams[key] = known
                self.num_team_runs += 1
            out.update(known.jct_s)
        return out

    def _engine(self, workload: OpenLoopWorkload) -> Engine:
        from kvgov.simulate import stand_in_engine

        scenario = self.scenario
        context = workload.ceiling_tokens or scenario.target.context_tokens
        widest = 1 + max(t.workers_per_team for t in workload.tenants)
        room = _ROOM_FACTOR * widest * math.ceil(context / scenario.block_size)
        room = max(room, scenario.kv_blocks)
        if room not in self._engines:
            # paged keeps no context on the host: no host memory to allocate.
            self._engines[room] = stand_in_engine(scenario, num_blocks=room, host_blocks=0)
        return self._engines[room]

    def _run_alone(
        self, engine: Engine, scripts: tuple[AgentScript, ...], setup: WorkloadSetup
    ) -> dict[str, float]:
        from kvgov.benchmarks.swarm.twin import run_twin_policy

        planner = next(s for s in scripts if s.planner)
        prompts = {
            (s.name, i): setup.prompts[(s.name, i)] for s in scripts for i in range(len(s.turns))
        }
        # What every agent of the team sends first: its system prompt (and the role
        # header of the next message), which a warm-up request leaves in the cache.
        assert len(scripts) > 1, "a team is a planner and at least one worker"
        shared = _common_prefix([prompts[(s.name, 0)] for s in scripts])
        warm_up = AgentScript(
            f"{planner.name}/warm-up",
            min(s.team for s in scripts) - 1,  # a team of its own: it waits on no worker
            True,
            (Turn((planner.system,), None, 0.0, 0.0, 1),),
            0.0,
            planner.tenant,
        )
        prompts[(warm_up.name, 0)] = shared
        gap_s = _WARM_UP_S
        # The warm-up runs alone from a cold cache both times, so it takes as long again.
        for _ in range(2):
            timed = tuple(
                dataclasses.replace(s, arrival_s=gap_s) if s.planner else s for s in scripts
            )
            result = run_twin_policy(
                engine,
                self.device,
                "paged",
                1.0,
                (warm_up, *timed),
                prompts,
                setup.swarm_workload,
                None,
                deadline_s=self.deadline_s + gap_s,
            ).result
            if result.failed:
                raise UnloadedRunError(jobs=result.failed)
            warmed_s = result.jct_s.pop(warm_up.name)
            if warmed_s <= gap_s:
                return result.jct_s
            gap_s = 2 * warmed_s
        raise AssertionError(f"{planner.name}'s warm-up took {warmed_s} s, then longer")


def _common_prefix(sequences: list[list[int]]) -> list[int]:
    first = sequences[0]
    n = min(len(s) for s in sequences)
    for i in range(n):
        if any(s[i] != first[i] for s in sequences[1:]):
            return first[:i]
    return first[:n]
