"""The composition root: the ``kvgov`` command line, the demo and the memory map.

The four layers below (engine/, governor/, policies/, integrations/) never import this
package; it is the one place that wires them all together, with examples/.

- ``kvgov.cli``: ``kvgov demo | bench | plan | map | report``.
- ``kvgov.demo``: the LangGraph swarm run twice on one KV budget, reserve-for-max
  against kvgov (the swarm itself in ``kvgov._demo_swarm``, its sampling of the engine
  in ``kvgov._demo_stats``).
- ``kvgov.memory_map``: where a card's memory goes, drawn with matplotlib.
"""

from __future__ import annotations

from governor import __version__
from kvgov.memory_map import AgentMemory, MemoryMap

__all__ = ["AgentMemory", "MemoryMap", "__version__"]
