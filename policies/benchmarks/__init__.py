"""Benchmarks of the policies, runnable as ``kvgov bench policies``.

Like the governor's, these benchmarks may not import the engine's ``Measurement`` type
(layer rules), so they yield plain mappings with the same keys; the CLI turns them into
the one ``Measurement`` type it prints. ``corpus`` builds the tool outputs they run on.
"""

__all__: list[str] = []
