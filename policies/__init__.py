"""Decisions the governor delegates: summarize, compact, admit, park or offload, preempt.

One small class per file, each satisfying a protocol that governor/ defines. Policies
use governor's public types only, never engine/ or integrations/.
"""

from __future__ import annotations

from policies.drop_oldest import DropOldest
from policies.extractive_summarizer import ExtractiveSummarizer
from policies.raise_at_ceiling import RaiseAtCeiling
from policies.summarize_oldest import SummarizeOldest

__all__ = ["DropOldest", "ExtractiveSummarizer", "RaiseAtCeiling", "SummarizeOldest"]
