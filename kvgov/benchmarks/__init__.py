"""Benchmarks that compose every layer (``kvgov bench serve``)."""
