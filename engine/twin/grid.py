"""A step-time grid on disk: the measured steps a device profile is fitted from, as one
JSON document that any machine can read and refit (a grid recorded on a GPU in a few lent
minutes is fitted later on a CPU).

    {"version": 1, "device": "cpu-here", "recorded": {...}, "models": {name: ModelShape},
     "samples": [StepSample.to_json(), ...], "link": [LinkSample.to_json(), ...]}

``link`` (optional) holds the host link's timed copies where the grid measured them
(a CPU's, whose link is fitted), so a refit of the file fits the link as well.

``recorded`` says where and when the grid was taken (torch version, the device's name,
dtype, attention backend, UTC time) and never the host's name. A sample names its model;
every name it uses is in ``models``. Nothing here imports torch.

    GridError        a grid file that cannot be read: missing, not JSON, another version,
                     or a sample that does not match its models
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.twin.link_fit import LinkSample
from engine.twin.shapes import ModelShape, StepBatch, StepSample

__all__ = ["GRID_VERSION", "GridError", "StepGrid", "load_grid", "read_grid", "write_grid"]

GRID_VERSION = 1


class GridError(ValueError):
    """A step-time grid file that cannot be read or written; ``path`` names it."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"step-time grid {self.path}: {problem}")


@dataclass(frozen=True, slots=True, kw_only=True)
class StepGrid:
    """A grid as read back: its samples and where they were recorded."""

    device: str  # the profile name the samples were measured for
    samples: tuple[StepSample, ...]
    recorded: Mapping[str, Any] = field(default_factory=dict)
    link: tuple[LinkSample, ...] = ()  # the host link's timed copies, where measured

    @property
    def model_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(sample.model.name for sample in self.samples))


def write_grid(
    path: str | Path,
    samples: Sequence[StepSample],
    *,
    recorded: Mapping[str, Any] | None = None,
    link: Sequence[LinkSample] = (),
) -> Path:
    """Write ``samples`` (all of one device) as a grid document at ``path``; ``recorded``:
    where and when they were measured (``engine.twin.measure.recorded_here`` for a grid
    measured here). Returns the path written."""
    path = Path(path)
    if not samples:
        raise GridError(path, "no samples to write: measure a grid first")
    devices = sorted({sample.device for sample in samples})
    if len(devices) > 1:
        raise GridError(path, f"samples from several devices {devices}: write one grid each")
    models: dict[str, dict[str, Any]] = {}
    for sample in samples:
        shape = sample.model.to_json()
        if models.setdefault(sample.model.name, shape) != shape:
            raise GridError(
                path, f"two different shapes are both named {sample.model.name!r}: rename one"
            )
    document = {
        "version": GRID_VERSION,
        "device": devices[0],
        "recorded": dict(recorded or {}),
        **({"link": [sample.to_json() for sample in link]} if link else {}),
        "models": models,
        "samples": [sample.to_json() for sample in samples],
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    except OSError as exc:
        raise GridError(path, f"cannot write it: {exc.strerror or exc}") from exc
    return path


def read_grid(path: str | Path) -> list[StepSample]:
    """The samples of the grid at ``path``, as written by ``write_grid``."""
    return list(load_grid(path).samples)


def load_grid(path: str | Path) -> StepGrid:
    """The grid at ``path`` with its ``recorded`` fields."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise GridError(path, "no such file: pass the --save-grid path of a measuring run") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise GridError(path, f"cannot read it: {exc}") from exc
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GridError(path, f"not JSON ({exc.msg} at line {exc.lineno})") from exc
    if not isinstance(document, dict):
        raise GridError(path, "not a grid document: expected a JSON object")
    if document.get("version") != GRID_VERSION:
        raise GridError(
            path,
            f"version {document.get('version')!r}, this kvgov reads version {GRID_VERSION}: "
            "record the grid again with this version",
        )
    try:
        return _parse(document)
    except (KeyError, TypeError, ValueError) as exc:
        raise GridError(path, f"malformed ({type(exc).__name__}: {exc})") from exc


def _parse(document: dict[str, Any]) -> StepGrid:
    device = str(document["device"])
    models = {name: ModelShape.from_json(shape) for name, shape in document["models"].items()}
    samples = []
    for i, item in enumerate(document["samples"]):
        name = item["model"]
        if name not in models:
            raise ValueError(f"sample {i} names model {name!r}, absent from 'models'")
        seconds = float(item["seconds"])
        if not math.isfinite(seconds) or seconds <= 0:
            raise ValueError(f"sample {i} took {seconds!r} seconds; a step takes a positive time")
        samples.append(
            StepSample(
                device=str(item.get("device", device)),
                model=models[name],
                batch=StepBatch.from_json(item["batch"]),
                seconds=seconds,
                attention=str(item.get("attention", "")),
            )
        )
    if not samples:
        raise ValueError("no samples")
    recorded = document.get("recorded", {})
    return StepGrid(
        device=device,
        samples=tuple(samples),
        recorded=recorded if isinstance(recorded, dict) else {},
        link=tuple(LinkSample.from_json(item) for item in document.get("link", ())),
    )
