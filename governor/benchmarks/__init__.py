"""Benchmarks of the governor, runnable as ``kvgov bench governor``.

The governor cannot import the engine's ``Measurement`` type (layer rules), so its
benchmarks yield plain mappings with the same keys; the CLI turns them into the one
``Measurement`` type it prints.
"""

__all__: list[str] = []
