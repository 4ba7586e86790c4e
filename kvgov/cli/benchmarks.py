"""The benchmarks ``kvgov bench`` runs, and the runner that calls them.

A benchmark is a module with ``run(*, quick: bool = False) -> Iterator[Measurement]``.
``BENCHMARKS`` maps each name that ``kvgov bench`` accepts to that module's import path;
the module is imported only when its benchmark runs, so ``kvgov --version`` stays cheap.
A benchmark is given ``device``, ``model`` or ``plot`` only where its ``run`` takes it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from inspect import signature
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from kvgov.cli.output import fail

if TYPE_CHECKING:
    from engine.benchmarks import Measurement

__all__ = ["BENCHMARKS", "NOT_IN_ALL", "benchmark_runs", "measurements", "taking"]

BENCHMARKS: Mapping[str, str] = MappingProxyType(
    {
        "allocator": "engine.benchmarks.allocator",
        "attention": "engine.benchmarks.attention",
        "engine": "engine.benchmarks.engine",
        "model": "engine.benchmarks.model_run",
        "quantization": "engine.benchmarks.quantization",
        "governor": "kvgov.benchmarks.governor",
        "policies": "kvgov.benchmarks.policies",
        "integrations": "integrations.benchmarks.integrations",
        "serve": "kvgov.benchmarks.serve",
        "replicas": "kvgov.benchmarks.replicas",
        "processes": "kvgov.benchmarks.processes",
        "context": "kvgov.benchmarks.context",
        "reduce": "kvgov.benchmarks.reduce",
        "swarm": "kvgov.benchmarks.swarm.bench",
        "openloop": "kvgov.benchmarks.openloop.bench",
        "openloop-tune": "kvgov.benchmarks.openloop.tuning",
    }
)

# Not a benchmark of figures but a tuning run that writes a module to commit (and takes
# most of half an hour): run by name only.
NOT_IN_ALL = frozenset({"openloop-tune"})

Run = Callable[..., Any]


def benchmark_runs(registry: Mapping[str, str], name: str) -> dict[str, Run]:
    """The ``run`` of benchmark ``name`` in ``registry``, or of every one for ``all``
    (but those in ``NOT_IN_ALL``), each module imported now."""
    names = [n for n in registry if n not in NOT_IN_ALL] if name == "all" else [name]
    return {each: importlib.import_module(registry[each]).run for each in names}


def taking(option: str, runs: dict[str, Run], name: str, why: str) -> dict[str, Run]:
    """The benchmarks of ``runs`` whose ``run`` takes ``option``: for ``all``, the others
    are left out; a benchmark named alone that does not take it is an error."""
    if name != "all" and option not in signature(runs[name]).parameters:
        fail(f"kvgov bench {name} takes no --{option}: {why}.")
    return {each: fn for each, fn in runs.items() if option in signature(fn).parameters}


def measurements(
    runs: Mapping[str, Run], options: dict[str, Any], plot: str | None
) -> Iterator[Measurement]:
    """Every measurement of ``runs``, in order, each benchmark run with ``options`` (and
    ``plot`` where it draws figures) as it is reached."""
    return (
        _as_measurement(item)
        for fn in runs.values()
        for item in fn(**_with_plot(fn, options, plot))
    )


def _with_plot(fn: Run, options: dict[str, Any], plot: str | None) -> dict[str, Any]:
    """``options``, and ``plot`` for a benchmark whose ``run`` draws figures."""
    if plot is None or "plot" not in signature(fn).parameters:
        return options
    from pathlib import Path

    return {**options, "plot": Path(plot)}


def _as_measurement(item: Measurement | Mapping[str, Any]) -> Measurement:
    """Engine benchmarks yield ``Measurement``; the governor's and the policies', which may
    not import the engine, yield mappings with the same fields."""
    from engine.benchmarks import Direction, Measurement

    if isinstance(item, Measurement):
        return item
    fields = dict(item)
    fields["direction"] = Direction(fields.get("direction", "higher"))
    return Measurement(**fields)
