"""The knobs each policy of ``kvgov bench openloop`` runs with, chosen on the
tuning seed by ``tuning``'s rule. Written by that run, not by hand."""

# Not tuned yet: every grid's default (the papers' settings, kvgov's KVGOV_CONFIG),
# until `kvgov bench openloop-tune` has run and its output replaces this file.

from __future__ import annotations

from typing import Any

__all__ = ["TUNED"]

TUNED: dict[str, dict[str, Any]] = {
    "paged": {},
    "paged+offload": {},
    "ttl-pin": {"num_prior_samples": 100, "queue_window": 100},
    "intercept": {},
    "kvgov": {"headroom_ratio": 0.25, "retain_s": 5.0},
}
