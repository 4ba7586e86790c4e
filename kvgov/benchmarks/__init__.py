"""Benchmarks that compose every layer (``kvgov bench serve``)."""
"""Benchmarks that wire every layer (several servers, the governor, the integrations),
runnable as ``kvgov bench ...``."""
