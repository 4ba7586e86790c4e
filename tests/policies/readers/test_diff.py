"""``read_diff``: the asked-for change with its file and hunk headers, under a small budget."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governor import TokenCounter
from policies.readers import Query, fit
from policies.readers.diff import read_diff
from tests.policies.readers.samples import git_diff, others

COUNTER = TokenCounter()
QUESTION = "What changed in the retry timeout?"


@pytest.mark.parametrize("seed", range(4))
def test_the_asked_change_is_kept_with_where_it_is(seed: int) -> None:
    text = git_diff(seed)
    lines = text.split("\n")
    changed = lines.index("+RETRY_TIMEOUT_S = 90")
    file_header = max(i for i in range(changed) if lines[i].startswith("+++ b/"))
    hunk_header = max(i for i in range(changed) if lines[i].startswith("@@ "))
    reading = read_diff(text, Query.of("shell", {"cmd": "git diff HEAD~3"}, QUESTION))
    assert reading is not None and reading.method == "diff"
    fitted = fit(reading, 200, COUNTER)
    assert fitted is not None and fitted.tokens <= 200 < COUNTER.count(text) // 10
    kept = fitted.text.split("\n")
    assert kept[0] == "[diff: 12 files, 48 hunks, +145 -145 lines]"
    order = [kept.index(lines[i]) for i in (file_header, hunk_header, changed - 1, changed)]
    assert order == sorted(order)  # the file, the hunk, then the change, in the diff's order


def test_headers_then_changed_lines_then_context_lines() -> None:
    reading = read_diff(git_diff(1), Query.of())
    assert reading is not None
    ranks: dict[str, list[tuple[float, ...]]] = {"header": [], "change": [], "context": []}
    for piece in reading.pieces[1:]:
        first = piece.text[:1]
        if piece.text.startswith(("diff --git", "@@")):
            ranks["header"].append(piece.rank)
        elif first in "+-" and not piece.text.startswith(("+++", "---")):
            ranks["change"].append(piece.rank)
        elif first == " ":
            ranks["context"].append(piece.rank)
    assert max(ranks["header"]) < min(ranks["change"])
    assert max(ranks["change"]) < min(ranks["context"])


def test_a_plain_unified_diff_is_read_and_hunks_end_by_their_counts() -> None:
    text = "\n".join(
        f"--- a/f{k}.txt\t2026-01-01\n+++ b/f{k}.txt\t2026-01-02\n"
        f"@@ -1,3 +1,3 @@\n a\n-b{k}\n+c{k}\n d"
        for k in range(30)
    )
    reading = read_diff(text, Query.of())
    assert reading is not None
    assert reading.pieces[0].text == "[diff: 30 files, 30 hunks, +30 -30 lines]"


@pytest.mark.parametrize("kind", ["log", "listing", "prose", "html", "json", "csv", "pytest"])
def test_other_outputs_are_not_diffs(kind: str) -> None:
    assert read_diff(others(2)[kind], Query.of()) is None


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("+- @\n-,0123abc")), max_size=400), st.integers(5, 80))
def test_any_text_is_read_or_refused_and_fits(text: str, budget: int) -> None:
    reading = read_diff("--- a/x\n+++ b/x\n" + text, Query.of("t", {"q": "abc"}))
    if reading is not None:
        fitted = fit(reading, budget, COUNTER)
        assert fitted is None or fitted.tokens <= budget
