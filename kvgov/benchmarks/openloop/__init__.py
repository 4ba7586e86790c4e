"""The swarm benchmark under open-loop load (issue 34): teams arriving as a Poisson
process, tenants of different sizes, long agents and heavy-tailed tools, every policy
at its papers' best, many seeds and paired confidence bands.

- ``workload``: the workload and its prompts, fixed up front for every policy;
- ``stats``: paired bootstrap intervals over seeds, goodput;
- ``unloaded``: each job's time with the machine to itself, what its SLO is twice;
- ``panel``: every policy on one modelled device, each beside its own unconstrained run;
- ``figures``: a panel's figures, medians over the evaluation seeds with their intervals,
  the paged engine's saturation load and where job time goes;
- ``plots``: the figures as pictures;
- ``tuning`` and ``tuned``: every policy's knobs tuned on the tuning seed by one rule
  (``kvgov bench openloop-tune``), and the knobs it chose;
- ``bench``: ``kvgov bench openloop``, the reference card's panel.
"""
