"""Benchmarks of the integrations, runnable as ``kvgov bench integrations``.

Integrations cannot import the engine's ``Measurement`` type (layer rules), so their
benchmarks yield plain mappings with the same keys; the CLI turns them into the one
``Measurement`` type it prints.
"""

__all__: list[str] = []
