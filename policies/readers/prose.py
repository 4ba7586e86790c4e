"""Prose and HTML: the sentences that share the most rare words with what was asked.

HTML is read when the text is a page (a doctype, an ``<html>`` or ``<body>``, or mostly
markup): its text is taken out of the markup (scripts, styles and navigation dropped),
block by block, and the summary says markup was removed. Prose (plain text, Markdown) is
read when most lines are sentences. Paragraphs are unwrapped and cut into sentences;
headings, list items and code lines stand alone. A summary comes first (the title, the
sections and sentences); then the sentences that hold the call's terms or the most of the
rare words of the arguments and the agent's last request, shown in their order, each
section's heading before its best sentence; then the sentences that name a setting, a
file or an id no other sentence names; then the headings; then each paragraph's first
sentence; then the rest.
"""

from __future__ import annotations

import re
from collections import Counter
from html.parser import HTMLParser

from policies.readers.lines import is_alarm
from policies.readers.pieces import Piece, Query, Reading, Tier
from policies.readers.relevance import Relevance

__all__ = ["read_prose"]

# A sentence ends at . ! or ? before a space, unless the stop ends a usual abbreviation; the
# next may start with a lowercase identifier (``snapshot_interval defaults to ...``).
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*\s+(?=[A-Za-z0-9\"'(\[`*_])")
_ABBREVIATION = re.compile(r"(?:\b(?:e\.g|i\.e|etc|vs|cf|St|Dr|Mr|Mrs|Ms|No|Fig)\.)$")
_HEADING = re.compile(r"#{1,6} \S|[^\n]+\n[=-]{3,}$")
_CAPS_HEADING = re.compile(r"[A-Z][A-Z0-9 &/-]{2,40}")  # a man page's section name
_HYPHENS = ("-", "\u2010")
_SPACES = re.compile(r"[ \t]{2,}")
_LINE_END = re.compile(r"[.!?][\"')\]]*$")
_MARKER = re.compile(r"\d+[.)]|[-*+•]")
_LIST_ITEM = re.compile(r"\s*(?:[-*+•]|\d+[.)])\s+\S")
_FENCE = re.compile(r"\s*(?:```|~~~)")
_WORDY = re.compile(r"[A-Za-z][a-z']+")
_TAG = re.compile(r"<[a-zA-Z!/][^>]{0,2000}>")
_PAGE = re.compile(r"\s*(?:<!doctype html|<html|<\?xml[^>]*>\s*<html)|<body[\s>]", re.IGNORECASE)
_DIGIT = re.compile(r"\d")
_NUMBER = re.compile(r"\d+")
_QUANTITY_BONUS = 2.0
# A name a program reads: a setting or constant (BILLING_WINDOW_x967z), a path to a file
# (src/billing/sync.py), a long number or id. In one sentence only, it stands out.
_CODE_NAME = re.compile(
    r"(?<![\w/.])(?:[A-Z][A-Z0-9]*(?:_[A-Za-z0-9]+)+|[\w.-]*/[\w./-]*\.[A-Za-z]\w{0,4}|\d{6,})(?![\w/])"
)
_MIN_WORDS = 6  # a line with fewer words is not a sentence's worth
_SENTENCE_STOP = re.compile(r"[a-z0-9)][.!?][\"')\]]?(?:\s|$)")
_SENTENCE_WORDS = 40  # prose has a sentence end for every this many words, at least
_PROSE_SHARE = 0.5  # of non-blank lines (outside code fences) that must be wordy
_MIN_SENTENCES = 8
_BLOCKS = frozenset(
    re.findall(
        r"\w+",
        "p div li tr td th pre section article blockquote dd dt h1 h2 h3 h4 h5 h6 hr table "
        "ul ol main header figcaption title summary details caption",
    )
)
_SKIPPED = frozenset(("script", "style", "noscript", "svg", "nav", "footer", "template", "iframe"))
_SENTENCES = frozenset(("lead", "sentence"))
_HEADINGS = frozenset(("h1", "h2", "h3", "h4", "h5", "h6", "title"))


def read_prose(text: str, query: Query) -> Reading | None:
    if _PAGE.match(text) or _mostly_markup(text):
        blocks, title = _html_blocks(text)
        method = "html"
    elif _is_prose(text):
        blocks, title = _text_blocks(text), None
        method = "prose"
    else:
        return None
    units = _units(blocks)  # (text, kind, section heading index)
    sentences = [u for u, (_, kind, _) in enumerate(units) if kind in _SENTENCES]
    if len(sentences) < _MIN_SENTENCES:
        return None
    texts = [units[u][0] for u in sentences]
    relevance = Relevance(query.words, texts)
    mentions = {sentences[k] for k in query.picks_in(texts)}
    measured = _measured(query.measures)
    asked: dict[int, tuple[float, float]] = {}  # (0 when it has the measure asked for, -score)
    seen: set[str] = set()
    for u in sentences:
        template = _NUMBER.sub("#", units[u][0])
        if template in seen:
            continue  # said again (numbers aside), it adds nothing: only its first time is read
        seen.add(template)
        score = relevance.score(units[u][0]) if relevance else 0.0
        if u in mentions:
            score += 10.0
        if score > 0 and query.quantity and _DIGIT.search(units[u][0]):
            score += _QUANTITY_BONUS  # a question for a number: the sentence that has one
        if score > 0:
            # "how many connections": a sentence with "301 connections" comes first
            found = measured is not None and measured.search(units[u][0]) is not None
            asked[u] = (0.0 if found else 1.0, -score)
    named = Counter(name for u in sentences for name in set(_CODE_NAME.findall(units[u][0])))
    standout = {
        u for u in sentences if any(named[name] == 1 for name in _CODE_NAME.findall(units[u][0]))
    }
    # A heading: the rank of its section's best sentence, and it is kept right after it
    # (shown before it): a heading that would crowd out its own sentence is not kept.
    sections: dict[int, tuple[float, ...]] = {}
    for u, key in asked.items():
        if (heading := units[u][2]) >= 0:
            sections[heading] = min(sections.get(heading, (*key, u + 0.5)), (*key, u + 0.5))
    headings = sum(1 for _, kind, _ in units if kind == "heading")
    title_text = f"{title!r}; " if title else ""
    markup = "; markup removed" if method == "html" else ""
    summary = f"[{method}: {title_text}{headings} headings, {len(sentences)} sentences{markup}]"
    pieces = [Piece(summary, (Tier.SHAPE, 0), "sentences", 0)]
    for u, (body, kind, _) in enumerate(units):
        if u in asked:
            rank: tuple[float, ...] = (Tier.ASKED, *asked[u], u)
        elif is_alarm(body):
            rank = (Tier.ALARM, -u)  # an error quoted in a page, a traceback in a document
        elif u in standout:
            rank = (Tier.STANDOUT, u)  # names a setting, a file or an id no other sentence does
        elif kind == "heading":
            rank = (Tier.ASKED, *sections[u]) if u in sections else (Tier.CONTEXT, 0, u)
        elif kind == "lead":
            rank = (Tier.CONTEXT, 1, u)
        else:
            rank = (Tier.REST, u)
        what = "lines" if kind in ("code", "heading") else "sentences"
        pieces.append(Piece(body, rank, what))
    return Reading(method, tuple(pieces))


def _measured(measures: tuple[str, ...]) -> re.Pattern[str] | None:
    """A number followed by one of ``measures``: the answer to a "how many" question."""
    if not measures:
        return None
    return re.compile(rf"\d[\d,.]*\s*(?:{'|'.join(map(re.escape, measures))})\b", re.IGNORECASE)


def _units(blocks: list[tuple[str, str]]) -> list[tuple[str, str, int]]:
    """Each block cut into units: ``(text, kind, index of its section's heading or -1)``,
    where kind is heading, code, or lead (a paragraph's first sentence: it says what
    the paragraph is about) and sentence (the others)."""
    units: list[tuple[str, str, int]] = []
    heading = -1
    for body, kind in blocks:
        if kind == "heading":
            heading = len(units)
            units.append((body, "heading", heading))
        elif kind == "code":
            units.append((body, kind, heading))
        else:
            split = [part.strip() for part in _sentences(body) if part.strip()]
            if len(split) > 1 and _MARKER.fullmatch(split[0]):  # "3." starts an item
                split[:2] = [f"{split[0]} {split[1]}"]
            for k, part in enumerate(split):
                units.append((part, "lead" if k == 0 else "sentence", heading))
    return units


def _sentences(body: str) -> list[str]:
    """``body`` cut after each . ! or ? before a space, unless the stop ends a usual
    abbreviation (e.g. etc.); the next sentence may start with a lowercase identifier."""
    parts = []
    start = 0
    for stop in _SENTENCE_END.finditer(body):
        if _ABBREVIATION.search(body, max(start, stop.start() - 5), stop.start() + 1):
            continue
        parts.append(body[start : stop.start() + 1] + body[stop.start() + 1 : stop.end()].rstrip())
        start = stop.end()
    parts.append(body[start:])
    return parts


def _is_prose(text: str) -> bool:
    lines = []
    fenced = False
    for line in text.split("\n"):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and line.strip():
            lines.append(line)
    if not lines:
        return False
    counts = [len(_WORDY.findall(line)) for line in lines]
    wordy = sum(1 for n in counts if n >= _MIN_WORDS)
    # Sentences end: a test run's or a log's wordy lines mostly do not.
    ends = sum(len(_SENTENCE_STOP.findall(line)) for line in lines)
    return wordy >= _PROSE_SHARE * len(lines) and ends * _SENTENCE_WORDS >= sum(counts)


def _text_blocks(text: str) -> list[tuple[str, str]]:
    """Paragraphs (unwrapped; a list item is one), headings and code lines, in order."""
    blocks: list[tuple[str, str]] = []
    paragraph: list[str] = []
    fenced = item = False

    def flush() -> None:
        if paragraph:
            blocks.append((_unwrapped(paragraph), "paragraph"))
            paragraph.clear()

    lines = _dedented(text.split("\n"))
    indented_prose = _indented_prose(lines)
    for k, line in enumerate(lines):
        stripped = line.strip()
        if _FENCE.match(line):
            flush()
            fenced = not fenced
            blocks.append((line, "code"))
        elif k in indented_prose and not fenced:
            if k - 1 not in indented_prose:
                flush()  # an option's description under it, as a man page indents one
            paragraph.append(stripped)
        elif fenced or (line[:2].isspace() and not (paragraph and item)) or is_alarm(line):
            flush()  # indented (code, a table) or an error or frame: kept as lines
            blocks.append((line, "code"))
        elif not stripped:
            flush()
        elif (line.startswith("#") and _HEADING.match(line)) or _CAPS_HEADING.fullmatch(line):
            flush()  # Markdown's, or a man page's section name (OPTIONS, SEE ALSO)
            blocks.append((line, "heading"))
        elif (
            k + 1 < len(lines) and re.fullmatch(r"[=-]{3,}", lines[k + 1].strip()) and not paragraph
        ):
            blocks.append((line, "heading"))
        elif re.fullmatch(r"[=-]{3,}", stripped):
            continue  # a setext heading's rule
        elif _LIST_ITEM.match(line):
            flush()
            paragraph.append(stripped)  # an item is a paragraph of its own
            item = True
        else:
            if not paragraph:
                item = False
            paragraph.append(stripped)
            if _LINE_END.search(stripped):
                flush()  # a line that ends a sentence ends its paragraph: a message a line
    flush()
    return blocks


def _indented_prose(lines: list[str]) -> set[int]:
    """The indented lines that are prose: runs of lines at one indentation that read as
    sentences (enough words a line, a sentence's end in the run), as a man page indents
    each option's description under it; code and tables read otherwise."""
    found: set[int] = set()
    k = 0
    while k < len(lines):
        indent = len(lines[k]) - len(lines[k].lstrip(" \t"))
        if not lines[k].strip() or indent < 2:
            k += 1
            continue
        end = k + 1
        while (
            end < len(lines)
            and lines[end].strip()
            and (len(lines[end]) - len(lines[end].lstrip(" \t")) == indent)
        ):
            end += 1
        run = lines[k:end]
        words = sum(len(_WORDY.findall(line)) for line in run)
        ends = sum(len(_SENTENCE_STOP.findall(line)) for line in run)
        if words >= _MIN_WORDS * len(run) and ends and not any(map(is_alarm, run)):
            found.update(range(k, end))
        k = end
    return found


def _unwrapped(lines: list[str]) -> str:
    """A paragraph's lines as one: a word hyphenated at a line's end joined again, runs of
    spaces (a justified man page's) as one."""
    joined = lines[0]
    for line in lines[1:]:
        if joined[-1:] in _HYPHENS and joined[-2:-1].isalpha() and line[:1].islower():
            joined = joined[:-1] + line
        else:
            joined = f"{joined} {line}"
    return _SPACES.sub(" ", joined)


def _dedented(lines: list[str]) -> list[str]:
    """``lines`` less the indentation most of them share (a man page's body sits 7 columns
    in): what is indented beyond it is code, a table or an example."""
    indents = Counter(len(line) - len(line.lstrip(" ")) for line in lines if line.strip())
    if not indents:
        return lines
    base, n = indents.most_common(1)[0]
    if base < 2 or n * 2 < sum(indents.values()):
        return lines
    prefix = " " * base
    return [line[base:] if line.startswith(prefix) else line for line in lines]


def _mostly_markup(text: str) -> bool:
    head = text[:20_000]
    tags = _TAG.findall(head)
    return len(tags) >= 20 and sum(map(len, tags)) >= 0.3 * len(head)


def _html_blocks(text: str) -> tuple[list[tuple[str, str]], str | None]:
    parser = _PageText()
    parser.feed(text)
    parser.close()
    parser.end_block()
    return parser.blocks, parser.title


class _PageText(HTMLParser):
    """The text of a page, block by block: ``(text, "heading" | "paragraph" | "code")``."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[tuple[str, str]] = []
        self.title: str | None = None
        self._parts: list[str] = []
        self._kind = "paragraph"
        self._skipping = 0
        self._pre = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "br":
            self._parts.append("\n" if self._pre else " ")  # a line break, not a new block
        elif tag in _SKIPPED:
            self._skipping += 1
        elif tag in _BLOCKS:
            self.end_block()
            if tag in _HEADINGS:
                self._kind = "heading"
            elif tag == "pre":
                self._pre += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIPPED:
            self._skipping = max(0, self._skipping - 1)
        elif tag in _BLOCKS:
            self.end_block()
            if tag == "pre":
                self._pre = max(0, self._pre - 1)

    def handle_data(self, data: str) -> None:
        if not self._skipping:
            self._parts.append(data)

    def end_block(self) -> None:
        raw = "".join(self._parts)
        self._parts.clear()
        kind, self._kind = self._kind, "paragraph"
        if self._pre:
            self.blocks.extend((line, "code") for line in raw.split("\n") if line.strip())
            return
        body = " ".join(raw.split())
        if not body:
            return
        if kind == "heading" and self.title is None:
            self.title = body
        self.blocks.append((body, kind))
