"""Decisions the governor delegates: summarize, compact, admit, park or offload, preempt.

One small class per file, each satisfying a protocol that governor/ defines. Policies
use governor's public types only, never engine/ or integrations/.
"""

from __future__ import annotations

from policies.extractive_summarizer import ExtractiveSummarizer

__all__ = ["ExtractiveSummarizer"]
