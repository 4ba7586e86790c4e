"""``kvgov bench swarm``: kvgov against the memory policies a user would pick instead, one
workload on one engine at several KV budgets (``bench``, whose ``run`` the CLI calls).

- ``workload``: the teams of agents and every prompt, fixed up front for every policy;
- ``runner``: the engine driven directly for the baselines, without the governor;
- ``kvgov``: the same workload through ``Governor`` over ``LocalBackend``;
- ``result``: one policy's run at one budget, and the engine counters it read;
- ``breakdown``: where each job's time went, on the twin;
- ``twin``: the same runs on the hardware twin, in virtual time;
- ``plot``: the figures, with matplotlib.

Nothing is re-exported here: the baselines import ``runner`` and ``bench`` imports the
baselines, so each caller imports the module it needs.
"""
