"""The knobs each policy of ``kvgov bench openloop`` runs with, chosen on the
tuning seed by ``tuning``'s rule. Written by that run (below), not by hand."""

# Produced by `kvgov bench openloop-tune` (its two grids run in two processes), started
# at commit 9e650ee, 2026-12-06 23:56 UTC, in 818 s of host time. Tuning seed 0; twin-rx9070xt;
# constrained runs at 0.1, 0.2, 0.4, 1 teams/min over 3600, 1800, 900, 360 s. Objective: the
# geometric mean over rates of the mean job time, s (* chosen; - disqualified).
#
# | policy | knobs | objective | 0.1/min | 0.2/min | 0.4/min | 1/min |
# |---|---|---|---|---|---|---|
# | paged | (none) | not run: one point |  |  |  |  |
# | paged+offload | (none) | not run: one point |  |  |  |  |
# | ttl-pin | num_prior_samples=100 queue_window=100 | 653 | 427 | 519 | 886 | 924 |
# | ttl-pin | num_prior_samples=25 queue_window=25 | 650 | 414 | 530 | 926 | 876 |
# | ttl-pin | num_prior_samples=25 queue_window=100 | 656 | 422 | 541 | 889 | 910 |
# | ttl-pin | num_prior_samples=100 queue_window=25 | 660 | 450 | 500 | 903 | 936 |
# | ttl-pin | num_prior_samples=400 queue_window=25 | 645* | 431 | 488 | 874 | 939 |
# | ttl-pin | num_prior_samples=400 queue_window=100 | 675 | 450 | 526 | 860 | 1,021 |
# | intercept | (none) | not run: one point |  |  |  |  |
# | kvgov | headroom_ratio=0.25 retain_s=5.0 | 597* | 416 | 509 | 746 | 803 |
# | kvgov | headroom_ratio=0.1 retain_s=2.0 | 601 | 418 | 520 | 749 | 802 |
# | kvgov | headroom_ratio=0.1 retain_s=5.0 | 626 | 418 | 531 | 768 | 899 |
# | kvgov | headroom_ratio=0.1 retain_s=15.0 | 634 | 420 | 547 | 785 | 895 |
# | kvgov | headroom_ratio=0.25 retain_s=2.0 | 595 | 414 | 490 | 750 | 823 |
# | kvgov | headroom_ratio=0.25 retain_s=15.0 | 614 | 415 | 530 | 775 | 833 |

from __future__ import annotations

from typing import Any

__all__ = ["TUNED"]

TUNED: dict[str, dict[str, Any]] = {
    "paged": {},
    "paged+offload": {},
    "ttl-pin": {"num_prior_samples": 400, "queue_window": 25},
    "intercept": {},
    "kvgov": {"retain_s": 5.0, "headroom_ratio": 0.25},
}
