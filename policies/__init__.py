"""Decisions the governor delegates: summarize, compact, admit, park or offload, preempt.

One small class per file, each satisfying a protocol that governor/ defines. Policies
use governor's public types only, never engine/ or integrations/. The governor's own
defaults (``RaiseAtCeiling``, ``HeadTailTruncation``, ``PriorityWithAging``,
``PressureOrder``) are re-exported here, so every policy can be picked from one place.
``build_corpus`` is the seeded corpus of realistic tool outputs the benchmarks (and the
demo) feed them.
"""

from __future__ import annotations

from governor import HeadTailTruncation, PressureOrder, RaiseAtCeiling
from policies.benchmarks.corpus import build_corpus
from policies.drop_oldest import DropOldest
from policies.extractive_summarizer import ExtractiveSummarizer
from policies.fair_share import FairShare
from policies.fifo import Fifo
from policies.llm_summarizer import LLMSummarizer, SummarizerStats
from policies.program_order import ProgramOrder
from policies.summarize_oldest import SummarizeOldest

__all__ = [
    "DropOldest",
    "ExtractiveSummarizer",
    "FairShare",
    "Fifo",
    "HeadTailTruncation",
    "LLMSummarizer",
    "PressureOrder",
    "ProgramOrder",
    "RaiseAtCeiling",
    "SummarizeOldest",
    "SummarizerStats",
    "build_corpus",
]
