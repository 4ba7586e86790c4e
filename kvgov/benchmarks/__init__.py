"""Benchmarks that wire every layer (servers in their own processes, the governor, the
integrations, the policies beside LangChain's own): ``kvgov bench serve``, ``kvgov bench
replicas`` and ``kvgov bench context``."""
