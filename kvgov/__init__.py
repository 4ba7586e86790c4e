"""The composition root: the ``kvgov`` command line, the demo and the memory map.

The four layers below (engine/, governor/, policies/, integrations/) never import this
package; it is the one place that wires them all together, with examples/.

- ``kvgov.cli``: ``kvgov demo | bench | plan | map | report | serve | twin``.
- ``kvgov.demo``: the LangGraph swarm run three ways on one KV budget, reserve-for-max,
  the paged engine alone and kvgov (the swarm itself in ``kvgov.demo.swarm``, its
  sampling of the engine in ``kvgov.demo.stats``).
- ``kvgov.memory_map``: where a card's memory goes, drawn with matplotlib.
"""

from __future__ import annotations

from governor import __version__
from kvgov.memory_map import AgentMemory, MemoryMap

__all__ = ["AgentMemory", "MemoryMap", "__version__"]
