"""The hardware twin's model of device speed: device profiles, a step-time model fitted
from measured step-time grids, and the shapes they read. Only the forward pass's and the
KV copies' durations are modelled; every decision stays the real engine's and governor's.
"""

from __future__ import annotations

from engine.twin.shapes import ModelShape, SequenceWork, StepBatch, StepSample

__all__ = ["ModelShape", "SequenceWork", "StepBatch", "StepSample"]
