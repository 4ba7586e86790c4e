"""A deterministic corpus of realistic agent tool outputs, with ground-truth error labels.

``build_corpus(seed=0, num_documents=50)`` returns documents of five categories in turn,
one module each: test-runner logs (``testing``), JSON API responses (``json_api``),
directory listings (``listings``), service logs with stack traces (``stack_traces``) and
web pages as text (``web_pages``). Each category's sizes are stratified log-uniformly
over about 2,000-40,000 tokens (cl100k; 7,000-180,000 characters), like real tool outputs.

The generators label each error, warning and traceback line as they write it
(``Document.error_lines``; in templates, a line marked "!"), so that a benchmark judges a
summarizer by this ground truth and never by the summarizer's own patterns. Blank lines
are never labelled, and a verdict (``3 failed, 69 passed``) is a summary, not an error
line. The same seed always gives the same corpus.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from types import MappingProxyType

from policies.benchmarks.corpus import json_api, listings, stack_traces, testing, web_pages
from policies.benchmarks.corpus._writer import Generator, Writer
from policies.benchmarks.corpus.document import Category, Document

__all__ = ["MAX_TOKENS", "MIN_TOKENS", "Category", "Document", "build_corpus"]

MIN_TOKENS = 2_000
MAX_TOKENS = 40_000

_GENERATORS: Mapping[Category, Generator] = MappingProxyType(
    {
        Category.TEST_LOG: testing.generate,
        Category.JSON_API: json_api.generate,
        Category.DIRECTORY_LISTING: listings.generate,
        Category.STACK_TRACE: stack_traces.generate,
        Category.WEB_PAGE: web_pages.generate,
    }
)


def build_corpus(*, seed: int = 0, num_documents: int = 50) -> tuple[Document, ...]:
    """``num_documents`` documents, the categories in turn."""
    if num_documents < 0:
        raise ValueError(f"num_documents must be 0 or more, got {num_documents}")
    categories = list(Category)
    per_category = math.ceil(num_documents / len(categories))
    documents = []
    for index in range(num_documents):
        category, stratum = categories[index % len(categories)], index // len(categories)
        rng = random.Random(f"kvgov-corpus:{seed}:{index}")
        share = (stratum + rng.random()) / per_category
        tokens = round(MIN_TOKENS * (MAX_TOKENS / MIN_TOKENS) ** share)
        out = Writer()
        flavour, tool, arguments = _GENERATORS[category](rng, out, tokens, stratum)
        name, text = f"{category.value}-{stratum:02d}-{flavour}", "\n".join(out.lines)
        frozen = MappingProxyType(arguments)
        documents.append(Document(name, category, tool, frozen, text, tuple(out.errors)))
    return tuple(documents)
