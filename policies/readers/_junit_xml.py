"""JUnit XML reports (surefire, pytest ``--junitxml``, Gradle, Jest, go-junit-report).

A report is parsed with ``xml.etree`` (incrementally, so that a report cut short still
yields the testcases before the cut) and rendered compactly: one SHAPE line of the
suites' counts, each failing or erroring testcase as one ALARM line (classname.name,
type, message) with the lines of its failure text that say where (CONTEXT: pytest's
``E`` lines, the innermost frames of the test's code), and the passing and skipped
testcases of each suite as one counted line (REST).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from policies.readers._stack_traces import PartKind, find_traces, parts
from policies.readers.pieces import Piece, Query, Reading, Tier

__all__ = ["read_junit"]

_PY_LOCATION = re.compile(r"[^\s:]+:\d+: [A-Za-z_][\w.]*")
_SPACES = re.compile(r"\s+")
_FIRST_LINES = 4  # of a failure's text kept as context when nothing better says where
_KEPT_FRAMES = 2
_MESSAGE_CHARS = 300  # of a failure's message shown on its line


@dataclass(slots=True)
class _Suite:
    name: str
    attrib: dict[str, str]
    depth: int
    cases: list[ET.Element] = field(default_factory=list)


def read_junit(text: str, query: Query) -> Reading | None:
    head = text[:256].lstrip("\ufeff \t\r\n")
    if not head.startswith(("<?xml", "<testsuite", "<!--")) or "<testcase" not in text:
        return None
    suites, root, cut = _parse(text)
    if not any(suite.cases for suite in suites):
        return None
    terms = tuple(t for t in query.terms if t in text)
    pieces = [Piece(_shape(suites, root, cut), (Tier.SHAPE, 0))]
    many = sum(1 for suite in suites if suite.cases) > 1
    position = 0
    for suite in suites:
        if not suite.cases:
            continue
        failing = [c for c in suite.cases if _outcome(c)[0] in ("failure", "error")]
        if many:
            line = f"testsuite {suite.name}: {_counts(suite.attrib, suite.cases)}"
            pieces.append(
                Piece(line, (Tier.CONTEXT, 2, position) if failing else (Tier.REST, 2, position))
            )
        passed: list[str] = []
        skipped: list[str] = []
        for case in suite.cases:
            position += 1
            label, element = _outcome(case)
            test = _test_id(case, suite.name)
            asked = any(term in test for term in terms)
            if element is None or label == "skipped":
                said = _one_line(element.get("message", "")) if element is not None else ""
                reason = f" ({said})" if said else ""
                if asked:
                    word = "SKIPPED" if label == "skipped" else "PASSED"
                    pieces.append(Piece(f"{word} {test}{reason}", (Tier.ASKED, 0, position)))
                else:
                    (skipped if label == "skipped" else passed).append(
                        _short_id(case, suite.name) + reason
                    )
                continue
            pieces.extend(_failure(case, test, label, element, position, terms))
        if passed:
            shown = f"passed ({len(passed):,}): " + ", ".join(passed)
            pieces.append(Piece(shown, (Tier.REST, 3, position), "passing tests", len(passed)))
        if skipped:
            shown = f"skipped ({len(skipped):,}): " + ", ".join(skipped)
            pieces.append(Piece(shown, (Tier.REST, 4, position), "skipped tests", len(skipped)))
    return Reading("diagnostics", tuple(pieces))


def _parse(text: str) -> tuple[list[_Suite], dict[str, str], bool]:
    """The suites with their testcases, the root ``<testsuites>``'s attributes, and
    whether the report was cut short (or is not well formed past some point)."""
    parser: ET.XMLPullParser = ET.XMLPullParser(events=("start", "end"))
    suites: list[_Suite] = []
    stack: list[_Suite] = []
    root: dict[str, str] = {}
    cut = False
    try:
        parser.feed(text)
        parser.close()
    except ET.ParseError:
        cut = True
    try:
        for item in parser.read_events():
            event, element = item[0], item[-1]
            if not isinstance(element, ET.Element):
                continue  # only "start" and "end" were asked for: always an element
            tag = element.tag
            if event == "start" and tag == "testsuites" and not root:
                root = dict(element.attrib)
            elif event == "start" and tag == "testsuite":
                suite = _Suite(element.get("name", "") or "", dict(element.attrib), len(stack))
                suites.append(suite)
                stack.append(suite)
            elif event == "end" and tag == "testsuite" and stack:
                stack.pop()
            elif event == "end" and tag == "testcase":
                if not stack:
                    stack.append(_Suite("", {}, 0))
                    suites.append(stack[-1])
                stack[-1].cases.append(element)
    except ET.ParseError:
        cut = True
    return suites, root, cut


def _outcome(case: ET.Element) -> tuple[str, ET.Element | None]:
    for tag in ("failure", "error", "skipped"):
        element = case.find(tag)
        if element is not None:
            return tag, element
    return "passed", None


def _test_id(case: ET.Element, suite: str) -> str:
    name = case.get("name", "?")
    classname = case.get("classname") or suite
    return f"{classname}.{name}" if classname else name


def _short_id(case: ET.Element, suite: str) -> str:
    classname = case.get("classname") or suite
    return case.get("name", "?") if classname == suite else _test_id(case, suite)


def _failure(
    case: ET.Element,
    test: str,
    label: str,
    element: ET.Element,
    position: int,
    terms: tuple[str, ...],
) -> list[Piece]:
    """A failing testcase: its line, its failure text (the telling lines as CONTEXT) and
    its captured output."""
    kind = element.get("type", "")
    message = _one_line(element.get("message", ""))
    body = [line.rstrip() for line in (element.text or "").strip("\n").splitlines()]
    if not message:
        message = next((_one_line(line) for line in body if line.strip()), "")
    said = f"{kind}: {message}" if kind and not message.startswith(kind) else message
    line = f"{'FAILED' if label == 'failure' else 'ERROR'} {test}" + (f" - {said}" if said else "")
    asked = any(term in line or term in (element.text or "") for term in terms)
    out = [Piece(line, (Tier.ASKED if asked else Tier.ALARM, 0, position))]
    context = _telling(body)
    shown = [k for k, text in enumerate(body) if text.strip()]
    run: list[int] = []

    def flush() -> None:
        if run:
            text = "\n".join(body[k] for k in run)
            out.append(Piece(text, (Tier.REST, 1, position, run[0]), "lines", len(run)))
            run.clear()

    for k in shown:
        if k in context:
            flush()
            rank = (Tier.CONTEXT, 0 if asked else 1, position, k)
            out.append(Piece(body[k], rank))
        else:
            run.append(k)
    flush()
    for tag in ("system-out", "system-err"):
        captured = case.find(tag)
        if captured is not None and captured.text and captured.text.strip():
            lines = [ln.rstrip() for ln in captured.text.strip("\n").splitlines() if ln.strip()]
            text = f"[{tag} of {test}]\n" + "\n".join(lines)
            out.append(Piece(text, (Tier.REST, 2, position), "lines", len(lines) + 1))
    return out


def _telling(body: list[str]) -> set[int]:
    """The lines of a failure's text that say what failed and where: pytest's ``>`` and
    ``E`` lines and closing ``file:line: Error``; else a traceback's innermost user
    frames and message; else the first lines."""
    e_lines = [k for k, line in enumerate(body) if line == "E" or line.startswith("E ")]
    if e_lines:
        chosen = set(e_lines[:_FIRST_LINES])
        failing = [k for k in range(e_lines[0]) if body[k].startswith(">")]
        located = [k for k, line in enumerate(body) if _PY_LOCATION.fullmatch(line)]
        chosen.update(failing[-1:] + located[-1:])
        return chosen
    traces = find_traces(body)
    if traces:
        chosen = set()
        for trace in traces:
            for part in parts(trace, body, num_kept=_KEPT_FRAMES):
                if part.kind in (PartKind.MESSAGE, PartKind.FRAME) or (
                    part.kind is PartKind.DETAIL and part.order == 0
                ):
                    chosen.update(range(part.start, part.end))
        return chosen
    return {k for k, line in enumerate(body) if line.strip()}.intersection(range(_FIRST_LINES))


def _shape(suites: list[_Suite], root: dict[str, str], cut: bool) -> str:
    """``[junit: 120 tests, 2 failures, 1 error, 4 skipped, 12.3s; 3 suites]``: the root's
    counts, else the top suites' summed, else the testcases counted."""
    top = [s for s in suites if s.depth == 0]
    cases = [case for suite in suites for case in suite.cases]
    if root.get("tests"):
        counts = _counts(root, cases)
    elif top and all(s.attrib.get("tests") for s in top):
        summed: dict[str, str] = {}
        for key in ("tests", "failures", "errors", "skipped", "time"):
            try:
                total = sum(float(s.attrib.get(key) or 0) for s in top)
            except ValueError:
                continue
            summed[key] = f"{total:.3f}" if key == "time" else str(int(total))
        counts = _counts(summed, cases)
    else:
        counts = _counts({}, cases)
    if len(top) == 1 and not root and top[0].name:
        counts = f"testsuite {top[0].name}: {counts}"
    elif len(top) > 1:
        counts += f"; {len(top):,} suites"
    ending = f"; report cut short after {len(cases):,} testcases" if cut else ""
    return f"[junit: {counts}{ending}]"


def _counts(attrib: dict[str, str], cases: list[ET.Element]) -> str:
    """``120 tests, 2 failures, 1 error, 4 skipped, 12.3s`` from a suite's attributes,
    or counted from its testcases where it has none."""
    outcomes = [_outcome(case)[0] for case in cases]
    tests = attrib.get("tests") or str(len(cases))
    failures = attrib.get("failures") or str(outcomes.count("failure"))
    errors = attrib.get("errors") or str(outcomes.count("error"))
    skipped = attrib.get("skipped") or attrib.get("skip") or str(outcomes.count("skipped"))
    parts_ = [
        _plural(tests, "test"),
        _plural(failures, "failure"),
        _plural(errors, "error"),
        f"{skipped} skipped",
    ]
    if attrib.get("time"):
        parts_.append(f"{attrib['time']}s")
    return ", ".join(parts_)


def _plural(n: str, word: str) -> str:
    return f"{n} {word}" if n == "1" else f"{n} {word}s"


def _one_line(text: str) -> str:
    first = text.strip().split("\n", 1)[0]
    first = _SPACES.sub(" ", first)
    return first if len(first) <= _MESSAGE_CHARS else first[: _MESSAGE_CHARS - 1] + "…"
