"""Benchmarks of the engine, runnable as ``kvgov bench ...``."""

from engine.benchmarks.measurement import Direction, Measurement

__all__ = ["Direction", "Measurement"]
