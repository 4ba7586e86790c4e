"""Capacity planning on the hardware twin (``kvgov plan --simulate``, the demo's second
act): a swarm of agents on a modelled card, run as reserve-for-max, the paged engine
alone and kvgov, in virtual time (``scenario``); or a recorded run replayed (``trace``)."""

from __future__ import annotations

from kvgov.simulate.scenario import (
    SCHEMES,
    TITLES,
    Scenario,
    ScenarioError,
    SchemeRun,
    Simulation,
    scenario_engine,
    simulate,
    simulation_table,
    stand_in_engine,
)

__all__ = [
    "SCHEMES",
    "TITLES",
    "Scenario",
    "ScenarioError",
    "SchemeRun",
    "Simulation",
    "scenario_engine",
    "simulate",
    "simulation_table",
    "stand_in_engine",
]
