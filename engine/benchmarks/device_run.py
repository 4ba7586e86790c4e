"""The steps of ``tests/gpu_run.sh``: what a lent GPU's few minutes measure, one step per
process, each figure written to ``OUT/figures.json`` the moment it exists.

    python3 -m engine.benchmarks.device_run STEP --out OUT [--device cuda|cpu] [--model M]

A lent machine runs its image's ``python3`` (torch, triton, transformers, tiktoken; not
the agent stack), so this module and everything it imports stay inside engine/. Steps:

- ``env``: torch, triton and transformers versions, the device's name and memory;
- ``attention``: ``kvgov bench attention``'s decode microbenchmark (Triton paged against
  gather and contiguous SDPA) on the device;
- ``model [--quantize int4]``: the model served at batch 8 (``model_run``): load time,
  weights and KV GiB, prefill and decode tokens a second, ms a step, weights GB/s;
- ``transformers``: transformers on the same weights (``same_weights``): prefill logits'
  relative error (on a GPU; on a CPU the greedy tokens must be identical) and our
  throughput over ``generate_batch`` and ``generate`` (``kvgov bench engine``'s rounds);
- ``grid``: the step-time grid a profile of the device is fitted to (``OUT/step-grid.json``,
  refit anywhere with ``kvgov twin fit --grid``): batch 1-32 x context 512-16k on a GPU,
  a few of the quick grid's points on a CPU;
- ``step NAME STATUS SECONDS``: the script's record of how a step ended;
- ``summary``: ``OUT/summary.md``, every step and figure as a table.

The last two import nothing but the standard library (the script runs them as
``python3 engine/benchmarks/device_run.py``, sparing a torch import each); the others
import the engine inside their functions.

On ``--device cpu`` (CI runs the script so, in a venv holding only the image's packages:
``tests/test_gpu_run.py``) the model is ``tiny-random`` and every step is its short form.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["FIGURES", "main"]

FIGURES = "figures.json"
GRID = "step-grid.json"
SUMMARY = "summary.md"
_GIB = 1 << 30


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m engine.benchmarks.device_run")
    parser.add_argument("step", choices=[*sorted(_STEPS), "step", "summary"])
    parser.add_argument("args", nargs="*", help="step: NAME STATUS SECONDS")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--model", default=None, help="default: llama-8b-random, on a CPU tiny-random"
    )
    parser.add_argument("--quantize", default=None, choices=["int4", "int8"])
    options = parser.parse_args(argv)
    options.out.mkdir(parents=True, exist_ok=True)
    if options.step == "step":
        name, status, seconds = options.args
        _update(
            options.out,
            lambda doc: doc["steps"].append(
                {"name": name, "status": status, "seconds": round(float(seconds), 1)}
            ),
        )
        return 0
    if options.step == "summary":
        (options.out / SUMMARY).write_text(summary(_read(options.out)))
        return 0
    if options.model is None:
        options.model = "tiny-random" if options.device == "cpu" else "llama-8b-random"
    for figure in _STEPS[options.step](options):
        _update(options.out, functools.partial(_append_figure, figure))
        print(json.dumps(figure), flush=True)
    return 0


def _append_figure(figure: dict[str, Any], doc: dict[str, Any]) -> None:
    doc["figures"].append(figure)


def _env(options: argparse.Namespace) -> Iterator[dict[str, Any]]:
    import torch

    from engine.device import resolve_device

    versions = {"python": sys.version.split()[0], "torch": torch.__version__}
    for name in ("triton", "transformers", "tiktoken"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            versions[name] = "absent"
    device = resolve_device(options.device)
    where = "the CPU"
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        backend = f"ROCm {torch.version.hip}" if torch.version.hip else f"CUDA {torch.version.cuda}"
        where = f"{props.name}, {props.total_memory / _GIB:.1f} GiB, {backend}"
    _update(options.out, lambda doc: doc.update(device=where, versions=versions))
    print(f"device: {where}; " + ", ".join(f"{k} {v}" for k, v in versions.items()), flush=True)
    return iter(())


def _attention(options: argparse.Namespace) -> Iterator[dict[str, Any]]:
    from engine.benchmarks.attention import run

    cpu = options.device == "cpu"
    return _json(run(quick=True, device=options.device, num_layers=2 if cpu else None))


def _model(options: argparse.Namespace) -> Iterator[dict[str, Any]]:
    from engine.benchmarks.model_run import run

    cpu = options.device == "cpu"
    return _json(
        run(quick=cpu, model=options.model, device=options.device, quantize=options.quantize)
    )


def _transformers(options: argparse.Namespace) -> Iterator[dict[str, Any]]:
    import torch

    from engine.benchmarks.engine import versus_transformers
    from engine.config import EngineConfig
    from engine.engine import Engine
    from engine.sampling import SamplingParams

    cpu = options.device == "cpu"
    # Room for the 8 prompts' KV only: transformers' own cache needs the rest of the card.
    engine = Engine(
        EngineConfig(
            model=options.model,
            device=options.device,
            kv_cache_bytes=None if cpu else 4 * _GIB,
            adapt_cpu_threads=False,
        )
    )
    g = torch.Generator().manual_seed(0)
    length = 32 if cpu else 128
    prompts = [torch.randint(0, 100_000, (length,), generator=g).tolist() for _ in range(8)]
    greedy = SamplingParams(max_tokens=4 if cpu else 32, temperature=0, ignore_eos=True)
    engine.generate(prompts[:1], greedy)  # warm up, as kvgov bench engine does
    return _json(versus_transformers(engine, prompts, greedy, repeats=1))


def _grid(options: argparse.Namespace) -> Iterator[dict[str, Any]]:
    from engine.engine import Engine
    from engine.twin.grid import write_grid
    from engine.twin.measure import (
        card_points,
        default_points,
        grid_engine_config,
        measure_grid,
        recorded_here,
    )

    cpu = options.device == "cpu"
    # A CPU (CI) checks that the step runs and writes a grid, on a few quick points.
    points = default_points(quick=True)[::5] if cpu else card_points()
    repeats = 1 if cpu else 3
    began = time.perf_counter()
    config = grid_engine_config(
        model=options.model, device=options.device, points=points, repeats=repeats
    )
    engine = Engine(config)
    name = "cpu-here" if cpu else "lent-gpu"
    samples = measure_grid(engine, device=name, points=points, repeats=repeats)
    path = write_grid(options.out / GRID, samples, recorded=recorded_here(engine))
    yield {
        "bench": "grid",
        "metric": "grid_points",
        "value": len(samples),
        "unit": "points",
        "target": None,
        "direction": "higher",
        "met": None,
        "note": (
            f"{options.model} step times, median of {repeats}, in "
            f"{time.perf_counter() - began:.0f} s, written to {path.name} (refit with "
            f"kvgov twin fit --grid {path.name} --model {options.model})"
        ),
    }


_STEPS: dict[str, Callable[[argparse.Namespace], Iterator[dict[str, Any]]]] = {
    "env": _env,
    "attention": _attention,
    "model": _model,
    "transformers": _transformers,
    "grid": _grid,
}


def _json(measurements: Iterable[Any]) -> Iterator[dict[str, Any]]:
    for measurement in measurements:
        yield measurement.to_json()


def _read(out: Path) -> dict[str, Any]:
    path = out / FIGURES
    if not path.exists():
        return {"device": None, "versions": {}, "steps": [], "figures": []}
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def _update(out: Path, change: Callable[[dict[str, Any]], object]) -> None:
    """Read, change and write back the figures, atomically: a step killed by its
    timeout leaves the file as it was after its last figure."""
    doc = _read(out)
    change(doc)
    tmp = out / f".{FIGURES}.{os.getpid()}"
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, out / FIGURES)


def summary(doc: dict[str, Any]) -> str:
    """The run as markdown: where, each step's end, each figure against its target."""
    lines = [f"# tests/gpu_run.sh on {doc.get('device') or 'an unknown device'}", ""]
    versions = doc.get("versions") or {}
    if versions:
        lines += [", ".join(f"{k} {v}" for k, v in versions.items()), ""]
    lines += ["| step | status | seconds |", "|---|---|---|"]
    lines += [f"| {s['name']} | {s['status']} | {s['seconds']} |" for s in doc["steps"]]
    lines += ["", "| figure | value | target | met | note |", "|---|---|---|---|---|"]
    for f in doc["figures"]:
        value = "n/a" if f["value"] is None else f"{f['value']:.4g} {f['unit']}"
        target = "" if f["target"] is None else f"{f['target']:g}"
        met = {True: "yes", False: "**no**", None: ""}[f["met"]]
        lines.append(f"| {f['bench']}.{f['metric']} | {value} | {target} | {met} | {f['note']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
