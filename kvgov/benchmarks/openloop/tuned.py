"""The knobs each policy of ``kvgov bench openloop`` runs with, chosen on the
tuning seed by ``tuning``'s rule. Written by that run (below), not by hand."""

# Produced by `kvgov bench openloop-tune`, started at commit 8ade560, 2026-12-07 12:16 UTC,
# in 289 s of host time. Tuning seed 0; twin-rx9070xt;
# constrained runs at 0.1, 0.2, 0.4, 1 teams/min over 3600, 1800, 900, 360 s. Objective: the
# geometric mean over rates of the mean job time, s (* chosen; - disqualified).
#
# | policy | knobs | objective | 0.1/min | 0.2/min | 0.4/min | 1/min |
# |---|---|---|---|---|---|---|
# | paged | (none) | not run: one point |  |  |  |  |
# | paged+offload | (none) | not run: one point |  |  |  |  |
# | ttl-pin | num_prior_samples=100 queue_window=100 | 638 | 421 | 468 | 821 | 1,023 |
# | ttl-pin | num_prior_samples=25 queue_window=25 | 622 | 432 | 513 | 775 | 871 |
# | ttl-pin | num_prior_samples=25 queue_window=100 | 637 | 411 | 508 | 827 | 954 |
# | ttl-pin | num_prior_samples=100 queue_window=25 | 638 | 432 | 509 | 862 | 873 |
# | ttl-pin | num_prior_samples=400 queue_window=25 | 622* | 406 | 444 | 848 | 977 |
# | ttl-pin | num_prior_samples=400 queue_window=100 | 651 | 423 | 533 | 787 | 1,016 |
# | intercept | (none) | not run: one point |  |  |  |  |
# | kvgov | headroom_ratio=0.25 retain_s=5.0 | 582 | 398 | 477 | 731 | 827 |
# | kvgov | headroom_ratio=0.1 retain_s=2.0 | 578 | 401 | 467 | 719 | 830 |
# | kvgov | headroom_ratio=0.1 retain_s=5.0 | 596 | 405 | 480 | 758 | 855 |
# | kvgov | headroom_ratio=0.1 retain_s=15.0 | 595 | 405 | 486 | 728 | 875 |
# | kvgov | headroom_ratio=0.25 retain_s=2.0 | 562* | 394 | 461 | 666 | 824 |
# | kvgov | headroom_ratio=0.25 retain_s=15.0 | 567 | 398 | 484 | 691 | 775 |

from __future__ import annotations

from typing import Any

__all__ = ["TUNED"]

TUNED: dict[str, dict[str, Any]] = {
    "paged": {},
    "paged+offload": {},
    "ttl-pin": {"num_prior_samples": 400, "queue_window": 25},
    "intercept": {},
    "kvgov": {"headroom_ratio": 0.25, "retain_s": 2.0},
}
