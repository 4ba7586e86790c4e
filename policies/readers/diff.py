"""Unified diffs (``git diff``, ``diff -u``): file and hunk headers, then changed lines.

A diff is read when it has a file header (``diff --git`` or a ``---``/``+++`` pair) and a
hunk header (``@@ -a,b +c,d @@``). A summary (files, lines added and removed) comes first,
with a commit's subject (``git show``); then the changed lines that hold the call's terms
or the most of its rare words, each with its file and hunk headers; then each file's
counts (when there are few files), every file header, every hunk header, every changed
line and last the context lines, each group in order.
"""

from __future__ import annotations

import re

from policies.readers.pieces import Piece, Query, Reading, Tier
from policies.readers.relevance import Relevance

__all__ = ["read_diff"]

_DIGIT = re.compile(r"\d")
_SUBJECT_LINES = 1  # of a commit's message kept with the summary
_NAMED_FILES = 12  # a diff of at most this many files names each, after the asked changes
_QUANTITY_BONUS = 2.0
_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
_FILE_PAIR = re.compile(r"^--- .*\n\+\+\+ ", re.MULTILINE)
_FILE_HEADER = ("diff --git ", "diff -", "Index: ")
_META = (
    *("index ", "new file mode", "deleted file mode", "old mode", "new mode"),
    *("similarity index", "rename from", "rename to", "copy from", "copy to"),
    *("Binary files", "--- ", "+++ ", "==="),
)


def read_diff(text: str, query: Query) -> Reading | None:
    if "@@ -" not in text or not (_FILE_PAIR.search(text) or "diff --git " in text):
        return None
    lines = text.split("\n")
    kinds = _kinds(lines)
    if kinds is None:
        return None
    changed = [i for i, kind in enumerate(kinds) if kind == "change"]
    bodies = [lines[i][1:] for i in changed]
    relevance = Relevance(query.words, bodies)
    mentions = {changed[k] for k in query.picks_in(bodies)}
    asked: dict[int, float] = {}
    for i in changed:
        score = relevance.score(lines[i][1:]) + (10.0 if i in mentions else 0.0)
        if score > 0 and query.quantity and _DIGIT.search(lines[i]):
            score += _QUANTITY_BONUS  # a question for a value: the line that sets one
        if score > 0:
            asked[i] = score
    # An asked-for change brings its file header (kept just before the best change under
    # it: a change is read by its file) and its hunk header (kept right after).
    needed: dict[int, tuple[float, float]] = {}
    file_at = hunk_at = -1
    for i, kind in enumerate(kinds):
        if kind == "file" or (kind == "meta" and lines[i].startswith("+++ ")):
            file_at = i  # git's "+++ b/x" names the file in half the tokens of its header
        elif kind == "hunk":
            hunk_at = i
        elif i in asked:
            for j in (file_at, hunk_at):
                if j >= 0:
                    # the file first (a change is read by its file), the hunk after it
                    at = i - 0.5 if j == file_at else i + 0.5
                    needed[j] = min(needed.get(j, (-asked[i], at)), (-asked[i], at))
    summary, files = _summary(lines, kinds)
    pieces = [Piece(summary, (Tier.SHAPE, 0))]
    if files:  # each file's counts: after what was asked for
        pieces.append(Piece(files, (Tier.CONTEXT, -1), "files", 0))
    first_file = kinds.index("file") if "file" in kinds else 0
    message = [i for i in range(first_file) if lines[i].startswith("    ") and lines[i].strip()]
    for i, (line, kind) in enumerate(zip(lines, kinds, strict=True)):
        if not line.strip() and kind != "context":
            continue  # a blank line outside a hunk says nothing
        if i < first_file:  # git show's commit: its subject says what the change is
            subject = message[:_SUBJECT_LINES]
            rank: tuple[float, ...] = (Tier.SHAPE, 2, i) if i in subject else (Tier.CONTEXT, 3, i)
        elif i in asked:
            rank = (Tier.ASKED, -asked[i], i)
        elif i in needed:
            rank = (Tier.ASKED, *needed[i])
        elif kind == "file":
            rank = (Tier.CONTEXT, 0, i)
        elif kind == "hunk":
            rank = (Tier.CONTEXT, 1, i)
        elif kind == "change":
            rank = (Tier.CONTEXT, 2, i)
        elif kind == "meta":
            rank = (Tier.REST, 0, i)
        else:
            rank = (Tier.REST, 1, i)
        if kind == "file" and line.startswith("--- ") and "\t" in line:
            line = line.split("\t")[0]  # diff -u's file header, without its timestamp
        pieces.append(Piece(line, rank))
    return Reading("diff", tuple(pieces))


def _kinds(lines: list[str]) -> list[str] | None:
    """Each line's kind: file, meta, hunk, change, context or other; None when the text
    has no hunk. A hunk ends when its header's line counts are used up."""
    git = any(line.startswith("diff --git ") for line in lines)
    kinds = []
    old = new = 0  # lines of the current hunk still to come, on each side
    seen_hunk = False
    for line in lines:
        if old > 0 or new > 0:
            first = line[:1]
            if first == "+":
                kind, new = "change", new - 1
            elif first == "-":
                kind, old = "change", old - 1
            elif first == "\\":
                kind = "context"
            else:  # " ", or a blank line where an editor stripped the space
                kind, old, new = "context", old - 1, new - 1
        elif (match := _HUNK.match(line)) is not None:
            kind, seen_hunk = "hunk", True
            old, new = (1 if n is None else int(n) for n in match.groups())
        elif line.startswith(_FILE_HEADER) or (line.startswith("--- ") and not git):
            kind = "file"
        elif line.startswith(_META):
            kind = "meta"
        else:
            kind = "other"
        kinds.append(kind)
    return kinds if seen_hunk else None


def _summary(lines: list[str], kinds: list[str]) -> tuple[str, str]:
    """Files, hunks and lines added and removed; and, apart, each file's counts when
    there are few files."""
    counts: dict[str, list[int]] = {}
    name = ""
    for line, kind in zip(lines, kinds, strict=True):
        if line.startswith("+++ "):
            name = line[4:].split("\t")[0].removeprefix("b/")
            counts.setdefault(name, [0, 0])
        elif kind == "change" and name:
            counts[name][line[0] == "-"] += 1
    added = sum(n for n, _ in counts.values())
    removed = sum(n for _, n in counts.values())
    files = len(counts) or kinds.count("file")
    each = ""
    if 1 < len(counts) <= _NAMED_FILES:
        each = "[files: " + ", ".join(f"{n} +{a} -{r}" for n, (a, r) in counts.items()) + "]"
    return f"[diff: {files} files, {kinds.count('hunk')} hunks, +{added} -{removed} lines]", each
