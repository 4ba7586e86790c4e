"""Compiler, linter and test-runner output cut into units: each error, warning, failure
and verdict with the lines that belong to it, and runs of passing tests.

``parse_units`` reads the lines once, in order, with their kinds (``_diagnostic_lines``);
a handler per kind consumes the lines under a head (a rustc error's ``-->`` location
and snippet, a pytest failure's section, a unittest failure's traceback) and gives each
part a ``Role``: what the diagnostics reader ranks it as. A go test's messages take
their role from the test's verdict, printed after them by ``go test -v``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from policies.readers._diagnostic_lines import kind_of
from policies.readers._stack_traces import PartKind, Trace, find_traces, parts, trace_at

__all__ = ["Role", "Unit", "parse_units"]

_ERRORISH = re.compile(r"(?i)\b(?:error|fail(?:ed|ure)?|fatal|panic|exception)\b")
_PY_LOCATION = re.compile(r"[^\s:]+:\d+: (?:in \S+|[A-Za-z_][\w.]*)?")
_CAPTURED = re.compile(r"[-_ ]{3,}(?:Captured|captured) .*")
_PANICKED = re.compile(r"thread '.*' panicked at .*")
_TSC_SNIPPET = re.compile(r"\d+\s")
_NOT_PASSED = re.compile(r"SKIP|skipped|ignored|XFAIL|XPASS|expected failure")  # counted apart
_CONTEXT_LINES = 6  # lines of a compiler error's snippet kept as context
_E_LINES = 5  # pytest's E lines kept as context after the first
_KEPT_FRAMES = 2  # innermost user frames of a failure's traceback kept as context
_MAX_VERDICTS = 4  # the last verdict lines are SHAPE, earlier ones rank as what they say

# Kinds of lines (``_diagnostic_lines``) by what the parser does with them.
_COMPILER = frozenset(
    re.findall(
        r"\S+",
        "e_rust_code e_rust e_tsc e_loc e_go_loc e_kotlin e_maven_loc e_lint_code "
        "w_rust w_tsc w_loc w_kotlin w_maven_loc",
    )
)
_ITEMS = frozenset(
    re.findall(
        r"\S+",
        "e_eslint e_eslint_unix e_eslint_compact w_eslint w_eslint_unix w_eslint_compact w_py "
        "w_maven",
    )
)
_VERDICTS = frozenset(
    re.findall(
        r"\S+",
        "v_pytest v_unittest_ran v_unittest v_go v_go_bare v_cargo v_cargo_error "
        "v_warning_count v_found v_eslint v_maven v_surefire v_gradle v_count v_jest",
    )
)
_PASSES = {
    "p_pytest": 1,
    "p_pytest_v": 1,
    "p_unittest_v": 1,
    "p_cargo_test": 1,
    "p_go_pass": 1,
    "p_gradle_test": 1,
    "p_jest": 1,
    "g_go_run": 0,
    "p_go_ok": 0,
}
_MARKS = frozenset(
    re.findall(
        r"\S+",
        "m_pytest_v m_unittest_v m_cargo_test m_surefire m_maven m_gradle_task m_jest_file m_jest",
    )
)
_GO_ENDS = frozenset(
    re.findall(r"\S+", "v_go v_go_bare p_go_ok h_go_fail p_go_pass g_go_run x_go_exit")
)


class Role(Enum):
    """What a unit is to the reader: how it ranks."""

    VERDICT = 0
    ALARM = 1
    CONTEXT = 2
    BODY = 3  # the rest of a failure's lines
    WARNING = 4
    WARNING_BODY = 5
    PASS = 6
    PROGRESS = 7
    OTHER = 8
    NOISE = 9
    HEADER = 10  # a file's name above its findings: ranked as its best finding
    GO_MESSAGE = 11  # a go test's message: ALARM or REST once its test's verdict is known


@dataclass(slots=True)
class Unit:
    """Lines ``[start, end)`` and what they are; the units of one error or failure share
    its ``block``."""

    start: int
    end: int
    role: Role
    block: int = 0
    group: int = 0  # ALARM: 0 a located error, 1 a failure's head and message, 2 a mark
    what: str = "lines"
    count: int = 0  # passing tests in a PASS unit, frames in a FRAMES one
    kind: str = ""  # an error's or a warning's kind
    header: Unit | None = None  # the HEADER unit above this finding


def parse_units(lines: list[str], kinds: list[str | None], terms: tuple[str, ...]) -> list[Unit]:
    """The units of ``lines`` in order; a line holding one of ``terms`` joins no run."""
    return _Parser(lines, kinds, terms).run()


class _Parser:
    """One pass over the lines, cutting them into units; a handler per kind of line
    consumes the lines that belong to it."""

    def __init__(self, lines: list[str], kinds: list[str | None], terms: tuple[str, ...]) -> None:
        self.lines = lines
        self.terms = terms
        self.kinds = kinds
        self.units: list[Unit] = []
        self.blocks = 0
        self.go_test = ""  # the go test whose output this is
        self.go_verdict: Role | None = None  # its verdict's role, once printed
        self.go_pending: dict[str, list[Unit]] = {}  # messages awaiting their verdict
        self.warnings_section = False
        self.header: Unit | None = None

    def run(self) -> list[Unit]:
        i, n = 0, len(self.lines)
        while i < n:
            if not self.lines[i] or self.kinds[i] == "rule":
                i += 1
                continue
            i = self.step(i)
        for pending in self.go_pending.values():
            for unit in pending:  # no verdict printed (cut short): they may say why
                unit.role = Role.ALARM
        _demote_verdicts(self.units, self.lines)
        return _merge_runs(self.units, self.lines, self.terms)

    def add(
        self,
        start: int,
        end: int,
        role: Role,
        *,
        block: int = 0,
        group: int = 0,
        what: str = "lines",
        count: int = 0,
        kind: str = "",
        header: Unit | None = None,
    ) -> None:
        if end <= start:
            return
        last = self.units[-1] if self.units else None
        if (
            (role is Role.PASS or role is Role.PROGRESS)
            and last is not None
            and (last.role is Role.PASS or last.role is Role.PROGRESS)
            and not (self.terms and (self.asked(start) or self.asked(last.start)))
        ):
            # A run of passing tests and progress is one unit: one piece with a count.
            last.end = end
            last.count += count
            if role is not last.role:
                last.role = Role.PROGRESS
            return
        self.units.append(Unit(start, end, role, block, group, what, count, kind, header))

    def asked(self, i: int) -> bool:
        return any(term in self.lines[i] for term in self.terms)

    def block(self) -> int:
        self.blocks += 1
        return self.blocks

    def step(self, i: int) -> int:
        kind = self.kinds[i] or ""
        line = self.lines[i]
        if kind != "e_go_loc" and kind not in ("e_eslint", "w_eslint"):
            self.header = None
        if kind in _VERDICTS:
            self.add(i, i + 1, Role.VERDICT)
        elif kind in _COMPILER:
            return self.compiler(i, kind)
        elif kind in _ITEMS:
            warning = kind.startswith("w_")
            role = Role.WARNING if warning else Role.ALARM
            self.add(
                i, i + 1, role, block=self.block(), kind=kind_of(kind, line), header=self.header
            )
        elif kind in ("f_pytest", "f_pytest_weak", "f_maven"):
            self.add(i, i + 1, Role.ALARM, block=self.block())
        elif kind in _MARKS:
            self.add(i, i + 1, Role.ALARM, group=2)
        elif kind in _PASSES:
            if kind == "g_go_run":
                self.go_test, self.go_verdict = line.split()[-1], None
            elif kind == "p_go_pass":
                self.go_verdict_is(line.split()[2], Role.PASS)
            passed = _PASSES[kind] if _NOT_PASSED.search(line) is None else 0
            self.add(i, i + 1, Role.PASS, count=passed)
        elif kind.startswith("g_") or kind.startswith("x_") or kind.startswith("s_"):
            return self.noise(i, kind)
        elif kind == "h_pytest":
            return self.pytest_failure(i)
        elif kind == "h_unittest":
            return self.traced_failure(i, ("h_unittest", "v_unittest_ran"), rule="=")
        elif kind == "h_surefire":
            return self.traced_failure(i, (), stop_at_bracket=True)
        elif kind == "h_go_fail":
            self.go_verdict_is(line.split()[2], Role.ALARM)
            self.add(i, i + 1, Role.ALARM, group=1, block=self.block())
        elif kind == "n_go_message":
            return self.go_message(i)
        elif kind == "h_go_panic":
            return self.go_panic(i)
        elif kind == "h_cargo":
            return self.cargo_failure(i)
        elif kind in ("h_gradle_wrong", "h_gradle_test", "h_jest", "h_gradle_where"):
            return self.indented_failure(i, kind)
        else:
            return self.other(i)
        return i + 1

    def compiler(self, i: int, kind: str) -> int:
        """An error or warning with the lines under it: its location, snippet, notes."""
        end = self.body_end(i, kind)
        located = i + 2 if end > i + 1 and self.kinds[i + 1] == "b_arrow" else i + 1
        what = kind_of(kind, self.lines[i])
        if kind.startswith("w_"):
            self.add(i, located, Role.WARNING, kind=what)
            self.add(located, end, Role.WARNING_BODY)
            return end
        block = self.block()
        self.add(i, located, Role.ALARM, block=block, kind=what, header=self.header)
        snippet = min(end, located + _CONTEXT_LINES)
        self.add(located, snippet, Role.CONTEXT, block=block)
        self.add(snippet, end, Role.BODY, block=block)
        return end

    def body_end(self, i: int, kind: str) -> int:
        lines, kinds, n = self.lines, self.kinds, len(self.lines)
        rust = kind.endswith("rust") or kind == "e_rust_code"
        pretty_tsc = kind.endswith("tsc") and " - " in lines[i].split(": ", 1)[0]
        j = i + 1
        while j < n:
            line = lines[j]
            if not line:
                if pretty_tsc and j + 1 < n and _TSC_SNIPPET.match(lines[j + 1]):
                    pretty_tsc = False  # tsc --pretty: one blank line, then the snippet
                    j += 1
                    continue
                break
            k = kinds[j]
            if (
                k in ("b_arrow", "n_loc")
                or (k == "f_maven" and kind.endswith("maven_loc"))
                or (k is None and (rust or line[0] in " \t|" or line[0].isdigit()))
            ):
                j += 1
            else:
                break
        return j

    def noise(self, i: int, kind: str) -> int:
        if kind in ("s_pytest", "s_pytest_own"):
            self.warnings_section = "warnings summary" in self.lines[i]
            self.add(i, i + 1, Role.NOISE)
            return i + 1
        if kind == "x_go_package":
            self.add(i, i + 1, Role.HEADER)
            self.header = self.units[-1]
            return i + 1
        if kind in ("x_failures", "x_gradle"):  # a list or a help text, to its end
            j = i + 1
            while j < len(self.lines) and self.lines[j] and self.kinds[j] is None:
                j += 1
            self.add(i, j, Role.NOISE)
            return j
        self.add(i, i + 1, Role.PROGRESS if kind.startswith("g_") else Role.NOISE)
        return i + 1

    def other(self, i: int) -> int:
        lines, n = self.lines, len(self.lines)
        line = lines[i]
        if i + 1 < n and self.kinds[i + 1] in ("e_eslint", "w_eslint") and line[0] not in " \t":
            self.add(i, i + 1, Role.HEADER)  # ESLint's stylish format: the file's name
            self.header = self.units[-1]
            return i + 1
        if "Traceback (most" in line or (i + 1 < n and lines[i + 1].lstrip().startswith("at ")):
            trace = trace_at(lines, i, n)
            if trace is not None:
                self.trace(trace, self.block())
                return trace.end
        if self.warnings_section and "Warning" in line:
            self.add(i, i + 1, Role.WARNING, kind=kind_of("w_py", line))
            return i + 1
        self.add(i, i + 1, Role.NOISE if self.warnings_section else Role.OTHER)
        return i + 1

    def trace(self, trace: Trace, block: int) -> None:
        for part in parts(trace, self.lines, num_kept=_KEPT_FRAMES):
            role = {
                PartKind.MESSAGE: Role.ALARM,
                PartKind.FRAME: Role.CONTEXT,
                PartKind.SOURCE: Role.CONTEXT,
            }.get(part.kind, Role.BODY)
            if part.kind is PartKind.DETAIL and part.order == 0:
                role = Role.CONTEXT
            what = {PartKind.FRAMES: "frames", PartKind.GOROUTINE: "goroutines"}.get(
                part.kind, "lines"
            )
            count = part.count if part.kind is PartKind.FRAMES else 0
            self.add(part.start, part.end, role, block=block, group=1, what=what, count=count)

    def traced_failure(
        self, i: int, stops: tuple[str, ...], *, rule: str = "", stop_at_bracket: bool = False
    ) -> int:
        """A failure whose lines hold a traceback (unittest, surefire): its head, the
        exception, the innermost frames of the test's code."""
        lines, kinds, n = self.lines, self.kinds, len(self.lines)
        end = i + 1
        while end < n:
            line, kind = lines[end], kinds[end]
            if kind in stops or (rule and kind == "rule" and line.startswith(rule * 10)):
                break
            if stop_at_bracket and (not line or line.startswith("[")):
                break
            end += 1
        block = self.block()
        self.add(i, i + 1, Role.ALARM, group=1, block=block)
        self.traced_lines(i + 1, end, block)
        return end

    def traced_lines(self, start: int, end: int, block: int) -> None:
        """A failure's lines: the tracebacks among them read as traces, the rest BODY
        (its first line ALARM when no traceback says what was raised)."""
        traces = find_traces(self.lines, start, end)
        at = start
        for trace in traces:
            self.add(at, trace.start, Role.BODY, block=block)
            self.trace(trace, block)
            at = trace.end
        if (
            not traces
            and (first := next((j for j in range(start, end) if self.lines[j]), end)) < end
        ):
            self.add(first, first + 1, Role.ALARM, group=1, block=block)
            at = first + 1
        self.add(at, end, Role.BODY, block=block)

    def pytest_failure(self, i: int) -> int:
        """pytest's ``____ test_x ____`` section: the first ``E`` line and the
        ``file:line: Error`` at its end are ALARM; the failing ``>`` line and the next
        ``E`` lines CONTEXT; source, frames and captured output BODY."""
        lines, kinds, n = self.lines, self.kinds, len(self.lines)
        end = i + 1
        while end < n and kinds[end] not in ("h_pytest", "s_pytest", "s_pytest_own", "v_pytest"):
            end += 1
        captured = next((j for j in range(i + 1, end) if _CAPTURED.fullmatch(lines[j])), end)
        block = self.block()
        self.add(i, i + 1, Role.ALARM, group=1, block=block)
        if any("Traceback (most" in lines[j] for j in range(i + 1, captured)):
            self.traced_lines(i + 1, captured, block)  # --tb=native
        else:
            roles = self.pytest_roles(i + 1, captured)
            j = i + 1
            while j < captured:
                role = roles.get(j, Role.BODY)
                k = j + 1
                while (
                    k < captured
                    and roles.get(k, Role.BODY) is role
                    and (role is Role.BODY or not lines[k].startswith(("E ", ">")))
                ):
                    k += 1
                self.add(j, k, role, block=block, group=1)
                j = k
        self.add(captured, end, Role.BODY, block=block)
        return end

    def pytest_roles(self, start: int, end: int) -> dict[int, Role]:
        lines = self.lines
        roles: dict[int, Role] = {}
        e_lines = [j for j in range(start, end) if lines[j] == "E" or lines[j].startswith("E ")]
        located = [j for j in range(start, end) if _PY_LOCATION.fullmatch(lines[j])]
        if e_lines:
            roles[e_lines[0]] = Role.ALARM
            for j in e_lines[1 : 1 + _E_LINES]:
                roles[j] = Role.CONTEXT
            failing = [j for j in range(start, e_lines[0]) if lines[j].startswith(">")]
            if failing:
                roles[failing[-1]] = Role.CONTEXT
        if located:
            roles[located[-1]] = Role.ALARM
        return roles

    def go_verdict_is(self, test: str, role: Role) -> None:
        """``--- FAIL: test`` or ``--- PASS: test``: its messages are ALARM, or part of
        the passing run (``go test -v`` prints them before the verdict, plain ``go test``
        after)."""
        self.go_test, self.go_verdict = test, role
        for unit in self.go_pending.pop(test, []):
            unit.role = role

    def go_message(self, i: int) -> int:
        """A ``go test`` message (``    x_test.go:42: got 3, want 4``) and its continuation
        lines: ALARM unless its test passed."""
        lines, kinds, n = self.lines, self.kinds, len(self.lines)
        indent = len(lines[i]) - len(lines[i].lstrip())
        end = i + 1
        while end < n and lines[end] and kinds[end] is None:
            if len(lines[end]) - len(lines[end].lstrip()) <= indent:
                break
            end += 1
        block = self.block()
        self.add(i, i + 1, self.go_verdict or Role.GO_MESSAGE, block=block)
        if self.go_verdict is None:
            self.go_pending.setdefault(self.go_test, []).append(self.units[-1])
        detail = min(end, i + 1 + _E_LINES)
        self.add(i + 1, detail, Role.CONTEXT, block=block)
        self.add(detail, end, Role.BODY, block=block)
        return end

    def go_panic(self, i: int) -> int:
        lines, kinds, n = self.lines, self.kinds, len(self.lines)
        end = i + 1
        while end < n and kinds[end] not in _GO_ENDS:
            end += 1
        trace = trace_at(lines, i, end)
        block = self.block()
        if trace is None:
            self.add(i, i + 1, Role.ALARM, group=1, block=block)
            return i + 1
        self.trace(trace, block)
        return trace.end

    def cargo_failure(self, i: int) -> int:
        """cargo test's ``---- tests::x stdout ----``: the panic's location and message."""
        lines, kinds, n = self.lines, self.kinds, len(self.lines)
        end = i + 1
        while end < n and kinds[end] not in ("h_cargo", "x_failures", "v_cargo"):
            end += 1
        block = self.block()
        self.add(i, i + 1, Role.ALARM, group=1, block=block)
        at = i + 1
        panic = next((j for j in range(i + 1, end) if _PANICKED.fullmatch(lines[j])), None)
        if panic is not None:
            message = panic + 2 if lines[panic].endswith(":") and panic + 1 < end else panic + 1
            self.add(at, panic, Role.BODY, block=block)
            self.add(panic, message, Role.ALARM, group=1, block=block)
            detail = message
            while detail < min(end, message + _E_LINES) and not lines[detail].startswith("note:"):
                detail += 1
            self.add(message, detail, Role.CONTEXT, block=block)
            at = detail
        self.add(at, end, Role.BODY, block=block)
        return end

    def indented_failure(self, i: int, kind: str) -> int:
        """A failure whose message follows it (Gradle's test and ``* What went wrong:``,
        Jest's ``●``): the first line under it ALARM, a few more CONTEXT."""
        lines, kinds, n = self.lines, self.kinds, len(self.lines)
        indent = len(lines[i]) - len(lines[i].lstrip())
        end = i + 1
        while end < n:
            line = lines[end]
            if kind == "h_jest":
                if line and (len(line) - len(line.lstrip()) <= indent or kinds[end] == "h_jest"):
                    break
            elif not line or (kind == "h_gradle_test" and line[0] not in " \t"):
                break
            end += 1
        block = self.block()
        if kind == "h_gradle_where":
            self.add(i, end, Role.CONTEXT, block=block)
            return end
        shown = [j for j in range(i + 1, end) if lines[j]]
        self.add(i, i + 1, Role.ALARM, group=1, block=block)
        if not shown:
            return end
        # Its message, the next lines, and where: Jest's ``> 11 |`` line and first frame.
        telling = set(shown[1 : 1 + _E_LINES // 2])
        telling.update([j for j in shown if lines[j].lstrip().startswith(">")][:1])
        telling.update([j for j in shown if lines[j].lstrip().startswith("at ")][:1])
        self.add(shown[0], shown[0] + 1, Role.ALARM, group=1, block=block)
        j = shown[0] + 1
        while j < end:
            role = Role.CONTEXT if j in telling else Role.BODY
            k = j + 1
            while k < end and (Role.CONTEXT if k in telling else Role.BODY) is role:
                k += 1
            self.add(j, k, role, block=block)
            j = k
        return end


def _merge_runs(units: list[Unit], lines: list[str], terms: tuple[str, ...]) -> list[Unit]:
    """Adjacent runs of passing tests and progress as one unit (a go test's messages join
    its run once its verdict is known). A line naming a term stands alone."""
    merged: list[Unit] = []
    for unit in units:
        last = merged[-1] if merged else None
        if (
            last is not None
            and unit.role in (Role.PASS, Role.PROGRESS)
            and last.role in (Role.PASS, Role.PROGRESS)
            and not (terms and any(t in lines[j] for j in (unit.start, last.start) for t in terms))
        ):
            last.end = unit.end
            last.count += unit.count
            if unit.role is not last.role:
                last.role = Role.PROGRESS
        else:
            merged.append(unit)
    return merged


def _demote_verdicts(units: list[Unit], lines: list[str]) -> None:
    """Only the last verdict lines are SHAPE: a go test run prints one per package."""
    verdicts = [u for u in units if u.role is Role.VERDICT]
    for unit in verdicts[:-_MAX_VERDICTS]:
        if _ERRORISH.search(lines[unit.start]):
            unit.role, unit.group = Role.ALARM, 2
        else:
            unit.role = Role.PROGRESS
