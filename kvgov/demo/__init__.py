"""``kvgov demo``: one LangGraph swarm run three ways on the same KV budget
(reserve-for-max, the paged engine alone, kvgov), then at the reference user's scale on
the hardware twin.

- ``demo``: the three runs, their options, result and table (``run_demo``);
- ``swarm``: the planner and workers, a LangGraph graph governed by kvgov;
- ``stats``: what each run measures, from the governor's events and the engine;
- ``twin``: the second act, the same swarm modelled on a 16 GB card.
"""

from __future__ import annotations

from kvgov.demo.demo import DemoOptions, DemoResult, parse_size, result_table, run_demo

__all__ = ["DemoOptions", "DemoResult", "parse_size", "result_table", "run_demo"]
