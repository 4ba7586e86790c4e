"""The hardware twin's model of device speed: device profiles, a step-time model fitted
from measured step-time grids, and the shapes they read. Only the forward pass's and the
KV copies' durations are modelled; every decision stays the real engine's and governor's.
"""

from __future__ import annotations

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
    "PROFILES",
    "DeviceProfile",
    "FitError",
    "FitReport",
    "ModelShape",
    "ProfileError",
    "ProfileFileError",
    "SequenceWork",
    "Source",
    "StepBatch",
    "StepSample",
    "StepTime",
    "StepTimeModel",
    "StepWork",
    "UnknownProfileError",
    "evaluate",
    "fit",
    "get_profile",
    "load_profile",
    "split_held_back",
    "step_work",
]
