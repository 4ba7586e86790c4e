"""docs/readers.md: one real tool output per reader, rendered by docs/readers/render.py.

The page is generated from docs/readers/examples.json and the captured outputs beside it,
so it is stale as soon as a reader reduces an example differently: rerun
``.venv/bin/python docs/readers/render.py``, and where a test below names an example
whose sentence no longer holds, rewrite its ``kept``, ``shows`` and ``omits`` there.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from governor import TokenCounter
from policies.readers import READERS

ROOT = Path(__file__).resolve().parent.parent
RENDER = ROOT / "docs" / "readers" / "render.py"
RERUN = "rerun .venv/bin/python docs/readers/render.py"


def _load_render() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_readers_render", RENDER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


render = _load_render()  # loaded from its path: its types (render.Shown) are Any here
COUNTER = TokenCounter()
EXAMPLES = render.load_examples()
SHOWN = render.reduce_examples(EXAMPLES, COUNTER)
IDS = [shown.example.reader for shown in SHOWN]


def test_the_page_is_what_render_writes() -> None:
    page = render.render_page(EXAMPLES, SHOWN, COUNTER)
    written = render.PAGE.read_text(encoding="utf-8")
    assert page == written, f"docs/readers.md is stale: {RERUN}"


def test_every_reader_has_an_example() -> None:
    shown = {shown.reduction.method for shown in SHOWN}
    readers = {reader.__name__.removeprefix("read_") for reader in READERS}
    assert readers <= shown, f"readers without an example: {sorted(readers - shown)}"
    assert len(set(IDS)) == len(IDS)


@pytest.mark.parametrize("shown", SHOWN, ids=IDS)
def test_each_example_is_read_by_the_reader_it_shows(shown: Any) -> None:
    example, reduction = shown.example, shown.reduction
    assert reduction.method == example.method, example.reader
    assert reduction.tokens_before > example.budget_tokens
    assert COUNTER.count(reduction.text) <= example.budget_tokens
    assert len(example.text.encode("utf-8")) <= 60_000  # a page's worth, not a dump


@pytest.mark.parametrize("shown", SHOWN, ids=IDS)
def test_each_sentence_says_what_the_reduction_holds(shown: Any) -> None:
    example, text = shown.example, shown.reduction.text
    stale = f"the {example.reader} sentence in docs/readers/examples.json no longer holds"
    for kept in example.shows:
        assert kept in text, f"{stale}: {kept!r} is gone"
    for left_out in example.omits:
        assert left_out not in text, f"{stale}: {left_out!r} is now kept"
