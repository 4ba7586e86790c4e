"""The memory policies kvgov is measured against, each on the bundled engine as it is.

Each policy decides what happens to an agent's KV while the agent waits on a tool, and
the priority of its calls; the engine (``SwarmRunner``) does the rest, with the same
settings for all: prefix caching with LRU eviction, recompute on preemption, the same
blocks and the same host swap space. The two research policies price their choices with
``Costs`` measured on this engine before the runs, as their papers profile their GPUs.
One module per policy: ``paged`` (vLLM), ``paged_offload`` (vLLM with CPU KV offloading,
named ``paged+offload``), ``continuum`` (Continuum's TTL pins, named ``ttl-pin``) and
``infercept`` (InferCept's min-waste choice, named ``intercept``). Each class names its
knobs in ``KNOBS`` (``knobs``); ``make_baseline`` refuses any other.
"""

from __future__ import annotations

from typing import Any

from kvgov.benchmarks.baselines.continuum import TtlPin
from kvgov.benchmarks.baselines.costs import Costs, measure_costs
from kvgov.benchmarks.baselines.infercept import Intercept
from kvgov.benchmarks.baselines.knobs import UnknownKnobError
from kvgov.benchmarks.baselines.paged import Paged
from kvgov.benchmarks.baselines.paged_offload import PagedOffload
from kvgov.benchmarks.swarm.runner import KVPolicy

__all__ = [
    "BASELINES",
    "Costs",
    "Intercept",
    "Paged",
    "PagedOffload",
    "TtlPin",
    "UnknownKnobError",
    "baseline_knobs",
    "make_baseline",
    "measure_costs",
]

# kvgov's runs go through the governor, not through a baseline
BASELINES = ("paged", "paged+offload", "ttl-pin", "intercept")
_CLASSES: dict[str, Any] = {
    "paged": Paged,
    "paged+offload": PagedOffload,
    "ttl-pin": TtlPin,
    "intercept": Intercept,
}


def baseline_knobs(name: str) -> tuple[str, ...]:
    """The knobs of the baseline called ``name``: the keyword arguments a user of that
    system tunes."""
    if name not in _CLASSES:
        raise ValueError(f"no baseline {name!r}; pick from {', '.join(BASELINES)}")
    return _CLASSES[name].KNOBS


def make_baseline(
    name: str, costs: Costs | None, *, copies_overlap: bool | None = None, **knobs: Any
) -> KVPolicy:
    """The baseline called ``name``, its choices priced by ``costs`` where it prices them;
    ``copies_overlap``: whether the device's KV copies run beside its compute (None: as
    the engine's device does; the twin passes its modelled device's). ``knobs``: the
    policy's tunable keyword arguments (its class's ``KNOBS``; any other raises
    ``UnknownKnobError``)."""
    known = baseline_knobs(name)
    for knob in knobs:
        if knob not in known:
            raise UnknownKnobError(name, knob, known)
    if name == "paged":
        return Paged(**knobs)
    if name == "paged+offload":
        return PagedOffload(**knobs)
    if costs is None:
        raise ValueError(f"{name} prices its choices: give costs (measure_costs)")
    if name == "ttl-pin":
        return TtlPin(costs, **knobs)
    return Intercept(costs, copies_overlap=copies_overlap, **knobs)
