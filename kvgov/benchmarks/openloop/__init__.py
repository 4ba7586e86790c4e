"""The swarm benchmark under open-loop load (issue 34): teams arriving as a Poisson
process, tenants of different sizes, long agents and heavy-tailed tools, every policy
at its papers' best, many seeds and paired confidence bands.

- ``sweep``: the policies compared, the tuning seed and the evaluation seeds, the rates
  and each rate's arrival window;
- ``workload``: the workload and its prompts, fixed up front for every policy;
- ``workload_setup``: one workload's scripts and prompt ids as every policy is sent them;
- ``stats``: paired bootstrap intervals over seeds, goodput;
- ``unloaded``: each job's time with the machine to itself, what its SLO is twice;
- ``panel``: every policy on one modelled device, each beside its own unconstrained run;
- ``figures``: a panel's figures, medians over the evaluation seeds with their intervals,
  the paged engine's saturation load and where job time goes;
- ``plots``: the figures as pictures;
- ``tuning`` and ``tuned``: every policy's knobs tuned on the tuning seed by one rule
  (``kvgov bench openloop-tune``), and the knobs it chose;
- ``processes``: runs in a pool of spawned processes, one a core;
- ``budgets``: goodput against the KV memory the engine is given;
- ``facts``, ``langchain_context``, ``editing_knobs``, ``kvgov_context``, ``handled``,
  ``system_runs``, ``system_figures`` and ``system``: the whole system, each baseline with
  LangChain's context handling and kvgov with its own, facts kept beside goodput;
  ``context_tuning``: each handling's knobs tuned on the tuning seed;
- ``cpu``, ``real`` and ``agreement``: the CPU panel, the real engine's short form beside
  the twin of this machine, and how far apart they are;
- ``bench``: ``kvgov bench openloop``, all of the above in one run.
"""
