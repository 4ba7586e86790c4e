"""Benchmarks that wire every layer (servers in their own processes, the governor, the
integrations): ``kvgov bench serve`` and ``kvgov bench replicas``."""
