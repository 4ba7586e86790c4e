"""The hardware twin's model of device speed: device profiles, a step-time model fitted
from measured step-time grids, and the shapes they read. Only the forward pass's and the
KV copies' durations are modelled; every decision stays the real engine's and governor's.
"""

from __future__ import annotations

from engine.twin.clock import ClockError, VirtualClock
from engine.twin.grid import GRID_VERSION, GridError, StepGrid, load_grid, read_grid, write_grid
from engine.twin.link import Direction, HostLink, LinkError, LinkTotals
from engine.twin.noise import NoiseError, StepNoise
from engine.twin.profiles import (
    PROFILES,
    DeviceProfile,
    ProfileError,
    ProfileFileError,
    Source,
    UnknownProfileError,
    get_profile,
    load_profile,
)
from engine.twin.shapes import ModelShape, SequenceWork, StepBatch, StepSample
from engine.twin.step_time import (
    FitError,
    FitReport,
    StepTime,
    StepTimeModel,
    StepWork,
    evaluate,
    fit,
    split_held_back,
    step_work,
)

__all__ = [
    "GRID_VERSION",
    "PROFILES",
    "ClockError",
    "DeviceProfile",
    "Direction",
    "FitError",
    "FitReport",
    "GridError",
    "HostLink",
    "LinkError",
    "LinkTotals",
    "ModelShape",
    "NoiseError",
    "ProfileError",
    "ProfileFileError",
    "SequenceWork",
    "Source",
    "StepBatch",
    "StepGrid",
    "StepNoise",
    "StepSample",
    "StepTime",
    "StepTimeModel",
    "StepWork",
    "UnknownProfileError",
    "VirtualClock",
    "evaluate",
    "fit",
    "get_profile",
    "load_grid",
    "load_profile",
    "read_grid",
    "split_held_back",
    "step_work",
    "write_grid",
]
