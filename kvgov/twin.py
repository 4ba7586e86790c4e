"""``kvgov twin fit``: measure a step-time grid on the real engine (or read one recorded
elsewhere, a GPU run's), hold back a seeded fraction of its points, fit a device
profile's factors on the rest, and report the fit's relative error on the points held
back. The fitted profile is written as JSON (``DeviceProfile.save``), by default under
the user's cache folder (``$XDG_CACHE_HOME/kvgov/twin/<profile>.json``).

On a CPU the device is one core: torch computes on one thread while the grid is measured
(``one_device_thread``), as ``kvgov twin check`` runs the real engine, whose other core
runs the agents' runtime (the governor, the tokenizer, the runners). With torch on both
cores of a 2-core host every parallel region waits whenever anything else runs, and the
grid's points scatter by 10-30% with the host's load: a profile of the host's load, not
of a device.

Bad input raises ``TwinFitError`` (or the engine's and the twin's own typed errors),
before anything is measured wherever it can be told up front.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from rich import box
from rich.table import Table

from engine.benchmarks import Direction, Measurement
from engine.twin import (
    DeviceProfile,
    FitReport,
    evaluate,
    fit,
    get_profile,
    load_profile,
    split_held_back,
)
from engine.twin.grid import StepGrid, load_grid, write_grid
from engine.twin.link_fit import LinkSample, fit_link
from engine.twin.profiles import FACTOR_FIELDS
from engine.twin.shapes import StepSample

__all__ = [
    "MEDIAN_ERROR_TARGET",
    "FitOptions",
    "TwinFit",
    "TwinFitError",
    "default_profile_path",
    "factor_table",
    "fit_twin",
    "model_label",
    "one_device_thread",
    "profile_named",
]

MEDIAN_ERROR_TARGET = 0.10  # issue 33: the fit's median step-time error on held-back points
DEFAULT_MODEL = "tiny-random"
QUICK_REPEATS, FULL_REPEATS = 3, 7


class TwinFitError(ValueError):
    """Options of ``kvgov twin fit`` that cannot work together; the message says which."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FitOptions:
    device: str | None = None  # where to measure (cpu, cuda, cuda:N); None: cpu
    model: str | None = None  # a preset or a local model folder; None: tiny-random, or the grid's
    profile: str | None = None  # a profile name or a profile file; None: per device or grid
    grid: Path | None = None  # read this grid instead of measuring
    save_grid: Path | None = None
    out: Path | None = None  # None: default_profile_path(profile)
    quick: bool = False
    held_back: float = 0.25
    seed: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class TwinFit:
    """A fit and where its parts came from and went."""

    profile: DeviceProfile  # as fitted
    start: DeviceProfile  # before the fit
    report: FitReport  # on the held-back points
    num_fit_points: int
    model: str
    origin: str  # what measured the grid, or which file it came from
    out: Path
    saved_grid: Path | None

    def measurements(self) -> list[Measurement]:
        where = f"{self.model} on {self.profile.name}, {self.origin}"
        held = f"{self.report.num_samples} held-back points of {self.num_points}"
        return [
            Measurement(
                "twin",
                "twin_fit_median_error",
                self.report.median_error,
                "ratio",
                target=MEDIAN_ERROR_TARGET,
                direction=Direction.LOWER_IS_BETTER,
                note=f"median |predicted - measured| / measured step time over {held}; "
                f"{where}; profile written to {self.out}",
            ),
            Measurement(
                "twin",
                "twin_fit_p90_error",
                self.report.p90_error,
                "ratio",
                direction=Direction.LOWER_IS_BETTER,
                note=f"90th percentile of the same errors, {held}",
            ),
            Measurement(
                "twin",
                "twin_fit_points",
                float(self.num_points),
                "points",
                note=f"{self.num_fit_points} fitted on, {self.report.num_samples} held back"
                + (f"; grid written to {self.saved_grid}" if self.saved_grid else ""),
            ),
        ]

    @property
    def num_points(self) -> int:
        return self.num_fit_points + self.report.num_samples


def fit_twin(options: FitOptions) -> TwinFit:
    """Measure or read the grid, fit, evaluate on the held-back points, write the profile."""
    if not 0 < options.held_back < 1:
        raise TwinFitError(
            f"--held-back {options.held_back} is outside (0, 1): hold back a fraction of the "
            "points, such as 0.25"
        )
    if options.grid is not None and options.device is not None:
        raise TwinFitError(
            "--device says where to measure and --grid reads a grid measured already: pass one"
        )
    if options.model is not None:
        model_label(options.model)  # a preset or a folder, before anything runs
    if options.grid is not None:
        grid = load_grid(options.grid)
        model, samples = _grid_samples(grid, options)
        start = profile_named(options.profile or grid.device)
        if start.name != grid.device:
            raise TwinFitError(
                f"the grid {options.grid} was measured for profile {grid.device!r}, not "
                f"{start.name!r}: pass --profile {grid.device} (or a file of that profile)"
            )
        origin = f"grid read from {options.grid}"
        saved, link = None, grid.link
    else:
        device = options.device or "cpu"
        model = options.model or DEFAULT_MODEL
        start = profile_named(options.profile or _default_profile_name(device))
        samples, origin, saved, link = _measure(options, device=device, model=model, profile=start)
    fit_on, held_back = split_held_back(samples, options.held_back, options.seed)
    fitted = fit(fit_on, profile=start)
    if link:  # the CPU's link is a memcpy: no specification, so fitted
        fitted_link = fit_link(link)
        fitted = replace(
            fitted,
            host_link_bandwidth_bytes_s=fitted_link.bandwidth_bytes_s,
            host_link_latency_s=fitted_link.latency_s,
        )
        origin += (
            f"; the link fitted to {len(link)} timed swaps: "
            f"{fitted_link.bandwidth_bytes_s / 1e9:.1f} GB/s after "
            f"{fitted_link.latency_s * 1e6:.0f} us"
        )
    report = evaluate(held_back, fitted)
    out = options.out or default_profile_path(fitted.name)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fitted.save(out)
    except OSError as exc:
        raise TwinFitError(f"cannot write the profile to {out}: {exc.strerror or exc}") from exc
    return TwinFit(
        profile=fitted,
        start=start,
        report=report,
        num_fit_points=len(fit_on),
        model=model,
        origin=origin,
        out=out,
        saved_grid=saved,
    )


@contextmanager
def one_device_thread(device: str = "cpu") -> Iterator[None]:
    """On a CPU, torch on one thread while inside (see the module docstring); on a GPU,
    nothing changes."""
    if not device.startswith("cpu"):
        yield
        return
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def model_label(model: str) -> str:
    """The name a model goes by in a grid: a preset's name, or a local folder's own name."""
    from engine.presets import PRESETS

    if model in PRESETS:
        return model
    if os.path.isdir(model):
        return Path(model).resolve().name
    raise TwinFitError(f"--model {model!r} is neither a preset ({', '.join(PRESETS)}) nor a folder")


def default_profile_path(name: str) -> Path:
    """Where a fitted profile goes unless ``--out`` says: the user's cache folder."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(cache) / "kvgov" / "twin" / f"{name}.json"


def factor_table(result: TwinFit) -> Table:
    """The fitted factors beside the ones the fit started from."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title=f"{result.profile.name}: fitted")
    table.add_column("factor", no_wrap=True)
    table.add_column("before", justify="right", no_wrap=True)
    table.add_column("fitted", justify="right", no_wrap=True)
    for name in FACTOR_FIELDS:
        before, after = getattr(result.start, name), getattr(result.profile, name)
        table.add_row(name, f"{before:.4g}", f"{after:.4g}")
    return table


def _grid_samples(grid: StepGrid, options: FitOptions) -> tuple[str, list[StepSample]]:
    names = grid.model_names
    if options.model is None:
        if len(names) > 1:
            raise TwinFitError(
                f"the grid {options.grid} holds several models ({', '.join(names)}): "
                "pick one with --model"
            )
        return names[0], list(grid.samples)
    wanted = model_label(options.model)
    if wanted not in names:
        raise TwinFitError(
            f"the grid {options.grid} was measured on {', '.join(names)}, not {wanted}: "
            f"pass --model {names[0]}, or measure {wanted} without --grid"
        )
    return wanted, [s for s in grid.samples if s.model.name == wanted]


def _measure(
    options: FitOptions, *, device: str, model: str, profile: DeviceProfile
) -> tuple[list[StepSample], str, Path | None, tuple[LinkSample, ...]]:
    """The grid measured on ``device``; on a CPU also its link, from timed swaps."""
    from engine.engine import Engine
    from engine.twin.measure import (
        default_points,
        grid_engine_config,
        measure_grid,
        measure_link,
        recorded_here,
    )

    points = default_points(quick=options.quick)
    repeats = QUICK_REPEATS if options.quick else FULL_REPEATS
    config = grid_engine_config(model=model, device=device, points=points, repeats=repeats)
    began = time.perf_counter()
    engine = Engine(config)
    with one_device_thread(device):
        samples = measure_grid(
            engine,
            device=profile.name,
            points=points,
            repeats=repeats,
            seed=options.seed,
            model_name=model_label(model),
        )
        link = tuple(measure_link(engine)) if engine.device.type == "cpu" else ()
        recorded = recorded_here(engine)  # inside: it records the thread count measured on
    seconds = time.perf_counter() - began
    on_cpu = engine.device.type == "cpu"
    origin = (
        f"{len(points)} points measured on {engine.device}"
        + (" (one core: torch on 1 thread)" if on_cpu else "")
        + f" ({engine.attention.name} attention, {str(engine.dtype).removeprefix('torch.')}), "
        f"median of {repeats}, in {seconds:.0f} s"
    )
    saved = None
    if options.save_grid is not None:
        saved = write_grid(options.save_grid, samples, recorded=recorded, link=link)
    return samples, origin, saved, link


def _default_profile_name(device: str) -> str:
    if device == "cpu":
        return "cpu-here"
    raise TwinFitError(
        f"--device {device} needs --profile: the name of the device profile to fit (such as "
        "h100-sxm), so that the grid and the fit name the card they were measured on"
    )


def profile_named(name_or_file: str) -> DeviceProfile:
    """A shipped profile by name, or a profile file (a fit's output)."""
    if name_or_file.endswith(".json") or os.path.isfile(name_or_file):
        return load_profile(name_or_file)
    return get_profile(name_or_file)
