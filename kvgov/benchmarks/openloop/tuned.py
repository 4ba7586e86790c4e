"""The knobs each policy of ``kvgov bench openloop`` runs with, chosen on the
tuning seed by ``tuning``'s rule. Written by that run (below), not by hand."""

# Produced by `kvgov bench openloop-tune`, started at commit c91d20a, 2026-12-06 23:40 UTC,
# in 747 s of host time. Tuning seed 0; twin-rx9070xt;
# constrained runs at 1, 2, 3 teams/min over 300 s. Objective: the
# geometric mean over rates of the mean job time, s (* chosen; - disqualified).
#
# | policy | knobs | objective | 1/min | 2/min | 3/min |
# |---|---|---|---|---|---|
# | paged | (none) | not run: one point |  |  |  |
# | paged+offload | (none) | not run: one point |  |  |  |
# | ttl-pin | num_prior_samples=100 queue_window=100 | 1,469 | 924 | 1,458 | 2,352 |
# | ttl-pin | num_prior_samples=25 queue_window=25 | 1,431 | 876 | 1,496 | 2,237 |
# | ttl-pin | num_prior_samples=25 queue_window=100 | 1,373* | 910 | 1,226 | 2,321 |
# | ttl-pin | num_prior_samples=100 queue_window=25 | 1,475 | 936 | 1,498 | 2,289 |
# | ttl-pin | num_prior_samples=400 queue_window=25 | 1,407 | 939 | 1,348 | 2,200 |
# | ttl-pin | num_prior_samples=400 queue_window=100 | 1,431 | 1,021 | 1,350 | 2,128 |
# | intercept | (none) | not run: one point |  |  |  |
# | kvgov | headroom_ratio=0.25 retain_s=5.0 | 1,152 | 803 | 1,150 | 1,654 |
# | kvgov | headroom_ratio=0.1 retain_s=2.0 | 1,139* | 802 | 1,132 | 1,629 |
# | kvgov | headroom_ratio=0.1 retain_s=5.0 | 1,220 | 899 | 1,101 | 1,834 |
# | kvgov | headroom_ratio=0.1 retain_s=15.0 | 1,246 | 895 | 1,206 | 1,795 |
# | kvgov | headroom_ratio=0.25 retain_s=2.0 | 1,181 | 823 | 1,126 | 1,777 |
# | kvgov | headroom_ratio=0.25 retain_s=15.0 | 1,183 | 833 | 1,185 | 1,678 |

from __future__ import annotations

from typing import Any

__all__ = ["TUNED"]

TUNED: dict[str, dict[str, Any]] = {
    "paged": {},
    "paged+offload": {},
    "ttl-pin": {"num_prior_samples": 25, "queue_window": 100},
    "intercept": {},
    "kvgov": {"headroom_ratio": 0.1, "retain_s": 2.0},
}
