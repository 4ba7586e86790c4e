"""What each line of compiler, linter and test-runner output is, by its shape alone.

``classify`` names a line's kind (``None`` for a line with no shape of its own) in one
or two regex calls: the line's first character (after its indentation, for an indented
line) picks the few patterns that can match; a line that starts with a path tries the
endings that can follow one, the path matched once. The kind's prefix says what the
diagnostics reader does with it:

- ``v_`` a verdict or count (pytest's last line, ``Ran 9 tests``, ``test result:``, ...)
- ``e_``/``w_`` an error or a warning with its location (rustc, gcc, tsc, ESLint, Maven)
- ``h_`` the head of a test failure, whose lines follow it (pytest, unittest, cargo ...)
- ``f_`` one line naming a failure and its message (``FAILED x.py::t - AssertionError``)
- ``m_`` one line marking a failure with no message (``test x ... FAILED``)
- ``p_`` a passing test, ``g_`` a progress line, ``x_`` noise, ``s_`` a section title,
  ``n_``/``b_`` a line that belongs to the diagnostic above it

``STRONG`` kinds are the ones no plain log prints: the reader applies when it finds them.
"""

from __future__ import annotations

import re

__all__ = ["classify", "is_strong", "kind_of"]

# Kinds told by how an unindented line starts: (kind, the characters it can start with,
# pattern). Within one first character, the first pattern that matches the line wins.
_WS = " \t"
_DIGITS = "0123456789"
_CROSSES = "\u2716\u00d7\u2715"  # ESLint's and Jest's crosses: heavy, multiplication, plain
_TICKS = "\u2713\u221a"  # Jest's ticks
_CARGO = (
    "(?:Compiling|Checking|Finished|Running|Doc-tests|Fresh|Downloaded|Downloading|Updating"
    "|Blocking|Locking|Adding|Installing|Installed|Documenting)"
)  # cargo's progress words
_STARTS: tuple[tuple[str, str, str], ...] = (
    ("rule", "=-_*#", r"[=\-_*#](?:[=\-_*# ]){4,}"),
    # verdicts and counts
    (
        "v_pytest",
        "=",
        r"=+ (?:\d+ \w+(?:, \d+ \w+)*|no tests ran)(?: in [\d.]+m?s"
        r"(?: \([\d:.]+\))?)? =+",
    ),
    ("v_unittest_ran", "R", r"Ran \d+ tests? in [\d.]+s"),
    ("v_unittest", "OF", r"(?:OK|FAILED)(?: \(\w+=\d+(?:, \w+=\d+)*\))?"),
    ("v_go", "FP", r"FAIL\s+\S+\s+(?:[\d.]+s|\[[\w ]+\])(?:\s.*)?|(?:PASS|FAIL)"),
    ("v_cargo", "t", r"test result: (?:ok|FAILED)\. .*"),
    (
        "v_cargo_error",
        "e",
        r"error: (?:could not compile|aborting due to|test failed|\d+ targets? "
        r"failed|build failed|failed to compile|linking with).*",
    ),
    ("v_warning_count", "w", r"warning: .* generated \d+ warnings?.*"),
    ("v_found", "FSA", r"Found \d+ errors?\b.*|Success: no issues found.*|All checks passed!"),
    (
        "v_eslint",
        _DIGITS + _CROSSES + "x",
        rf"(?:[{_CROSSES}x] )?\d+ problems? "
        r"\(\d+ errors?, \d+ warnings?\)",
    ),
    (
        "h_surefire",
        "[",
        r"\[ERROR\] \S+(?:\(\S+\))?\s+(?:-- )?Time elapsed: .*"
        r"<<< (?:FAILURE|ERROR)!",
    ),
    ("v_maven", "[", r"\[INFO\] BUILD (?:SUCCESS|FAILURE)"),
    (
        "v_surefire",
        "[T",
        r"(?:\[(?:ERROR|WARNING|INFO)\] )?Tests run: \d+, Failures: \d+, "
        r"Errors: \d+, Skipped: \d+",
    ),
    (
        "v_gradle",
        "BF" + _DIGITS,
        r"BUILD (?:SUCCESSFUL|FAILED) in \S+"
        r"|FAILURE: Build failed with an exception\."
        r"|\d+ tests? completed, \d+ failed(?:, \d+ skipped)?",
    ),
    ("v_count", _DIGITS, r"\d+ (?:errors?|warnings?)(?: generated)?\.?"),
    ("v_jest", "TS", r"(?:Tests|Test Suites|Snapshots):\s+.*\btotal"),
    # errors and warnings without a path first
    ("e_rust_code", "e", r"error\[E\d{4}\]: .*"),
    ("e_rust", "e", r"error: .*"),
    ("w_rust", "w", r"warning(?:\[[\w-]+\])?: .*"),
    ("e_kotlin", "e", r"e: (?:file://)?\S+:\d+:\d+:? .*"),
    ("w_kotlin", "w", r"w: (?:file://)?\S+:\d+:\d+:? .*"),
    ("e_maven_loc", "[", r"\[ERROR\] \S.*:\[\d+,\d+\].*"),
    ("w_maven_loc", "[", r"\[WARNING\] \S.*:\[\d+,\d+\].*"),
    # test runners
    ("s_pytest", "=", r"=+ .+ =+"),
    ("h_pytest", "_", r"_{3,} .+ _{3,}"),
    ("f_pytest", "FE", r"(?:FAILED|ERROR) \S+(?: - .*)?"),
    ("p_pytest", "PSX", r"(?:PASSED|SKIPPED|XFAIL|XPASS) .+"),
    ("m_pytest_v", "[", r"\[gw\d+\] \[\s*\d+%\] (?:FAILED|ERROR) \S+"),
    ("p_pytest_v", "[", r"\[gw\d+\] \[\s*\d+%\] (?:PASSED|SKIPPED|XFAIL|XPASS) \S+"),
    ("h_unittest", "FEU", r"(?:FAIL|ERROR|UNEXPECTED SUCCESS): \S+ \(\w+(?:\.\w+)+\)"),
    ("p_cargo_test", "t", r"test \S+ \.\.\. (?:ok|ignored.*)"),
    ("m_cargo_test", "t", r"test \S+ \.\.\. FAILED"),
    ("g_unittest", ".FEsxu", r"[.FEsxu]{3,}"),
    ("g_go_run", "=", r"=== (?:RUN|PAUSE|CONT|NAME)\s+\S+"),
    ("h_go_fail", "-", r"--- FAIL: \S+ \([\d.]+s\)"),
    ("p_go_pass", "-", r"--- (?:PASS|SKIP): \S+ \([\d.]+s\)"),
    ("p_go_ok", "o?", r"(?:ok|\?)\s+\S+\s+(?:[\d.]+s|\(cached\)|\[no test files\])(?:\s.*)?"),
    ("h_go_panic", "pf", r"panic: .*|fatal error: .*"),
    ("x_go_package", "#", r"# \S+"),
    ("x_go_exit", "e", r"exit status \d+"),
    ("h_cargo", "-", r"---- \S+ stdout ----"),
    ("g_cargo", "CFRrDUBLAI", rf"{_CARGO} .*|running \d+ tests?"),
    ("x_failures", "f", r"failures:"),
    ("b_arrow", "-", r"--> \S+:\d+:\d+"),
    ("m_surefire", "[T", r"(?:\[ERROR\] )?Tests run: .*<<< (?:FAILURE|ERROR)!.*"),
    ("g_surefire", "[T", r"(?:\[INFO\] )?Tests run: .*(?:Time elapsed|- in ).*"),
    (
        "x_maven",
        "[",
        r"\[ERROR\] (?:-> \[Help \d+\]|To see the full stack trace.*|Re-run Maven.*"
        r"|For more information about.*|\[Help \d+\].*|After correcting the "
        r"problems.*|\s*mvn <args>.*|Failures: ?|Errors: ?|COMPILATION ERROR : ?|)",
    ),
    ("f_maven", "[", r"\[ERROR\]\s{2,}\S.*"),
    ("m_maven", "[", r"\[ERROR\] .*"),
    ("w_maven", "[", r"\[WARNING\] \S.*"),
    ("g_maven", "[", r"\[(?:INFO|DEBUG|WARNING)\].*"),
    ("m_gradle_task", ">", r"> Task \S+ FAILED"),
    ("g_gradle_task", ">", r"> Task \S+.*"),
    ("h_gradle_wrong", "*", r"\* What went wrong:"),
    ("h_gradle_where", "*", r"\* Where:"),
    ("x_gradle", "*", r"\* (?:Try|Get more help|Exception is):"),
    ("h_jest", "\u25cf", r"\u25cf .+"),
    ("m_jest_file", "F", r"FAIL \S+\.\w+.*"),
    ("g_jest_file", "P", r"PASS \S+\.\w+.*"),
)
# Kinds of indented lines, told by how they start once the indentation is stripped.
_INDENTED: tuple[tuple[str, str, str], ...] = (
    ("rule", "=-_*#", r"[=\-_*#](?:[=\-_*# ]){4,}"),
    (
        "v_eslint",
        _DIGITS + _CROSSES + "x",
        rf"(?:[{_CROSSES}x] )?\d+ problems? "
        r"\(\d+ errors?, \d+ warnings?\)",
    ),
    ("e_eslint", _DIGITS, r"\d+:\d+\s+error\s+.*"),
    ("w_eslint", _DIGITS, r"\d+:\d+\s+warning\s+.*"),
    ("h_go_fail", "-", r"--- FAIL: \S+ \([\d.]+s\)"),
    ("p_go_pass", "-", r"--- (?:PASS|SKIP): \S+ \([\d.]+s\)"),
    ("b_arrow", "-", r"--> \S+:\d+:\d+"),
    ("g_cargo", "CFRDUBLAI", rf"{_CARGO} .*"),
    ("h_jest", "\u25cf", r"\u25cf .+"),
    ("m_jest_file", "F", r"FAIL \S+\.\w+.*"),
    ("g_jest_file", "P", r"PASS \S+\.\w+.*"),
    ("p_jest", _TICKS, rf"[{_TICKS}] .*"),
    ("m_jest", _CROSSES, rf"[{_CROSSES}] .*"),
)
# Indented kinds that start with a file path, tried when the line holds a colon.
_INDENTED_PATH: tuple[tuple[str, str], ...] = (
    ("w_py", r"(?:[A-Za-z]:)?[^\s:()\[\]]+:\d+: \w*Warning: .*"),
    ("n_go_message", r"[\w.-]+\.go:\d+: .*"),
)
# Kinds that start with a file path: (kind, what follows the path). The path is matched
# once (an atomic group: a lookahead and a backreference), then each ending is tried.
_AFTER_PATH: tuple[tuple[str, str], ...] = (
    ("e_tsc", r"\(\d+,\d+\): error TS\d+: .*|:\d+:\d+ - error TS\d+: .*"),
    ("w_tsc", r"\(\d+,\d+\): warning TS\d+: .*|:\d+:\d+ - warning TS\d+: .*"),
    ("e_eslint_unix", r":\d+:\d+: .* \[Error/[^\]]*\]"),
    ("w_eslint_unix", r":\d+:\d+: .* \[Warning/[^\]]*\]"),
    ("e_loc", r":\d+(?::\d+)?: (?:fatal error|error|Error)(?:\[[\w-]+\])?: .*"),
    ("w_loc", r":\d+(?::\d+)?: (?:warning|Warning)(?:\[[\w-]+\])?: .*"),
    ("n_loc", r":\d+(?::\d+)?: note: .*"),
    ("w_py", r":\d+: \w*Warning: .*"),
    ("e_eslint_compact", r": line \d+, col \d+, Error - .*"),
    ("w_eslint_compact", r": line \d+, col \d+, Warning - .*"),
    ("e_lint_code", r":\d+:\d+: [A-Z]{1,4}\d{2,5}:? .*"),
    ("e_go_loc", r"(?<=\.go):\d+:\d+: \S.*"),  # not rg --vimgrep's indented source
    ("m_pytest_v", r"::\S.*? (?:FAILED|ERROR)(?:\s+\[\s*\d+%\])?"),
    ("p_pytest_v", r"::\S.*? (?:PASSED|SKIPPED|XFAIL|XPASS)(?:\s+\[\s*\d+%\])?"),
    ("g_pytest", r"(?<=\.py) [.FEsxX]+\s*(?:\[\s*\d+%\])?"),
    ("h_surefire", r"(?:\(\S+\))?\s+(?:-- )?Time elapsed: .*<<< (?:FAILURE|ERROR)!"),
)
# Kinds whose start says nothing, tried when the line holds their needle.
_NEEDLED: tuple[tuple[str, str, str], ...] = (
    ("m_unittest_v", " ... ", r".+ \.\.\. (?:FAIL|ERROR|unexpected success)"),
    ("p_unittest_v", " ... ", r".+ \.\.\. (?:ok|skipped.*|expected failure)"),
    ("h_gradle_test", " > ", r"\S.* > .+ FAILED"),
    ("p_gradle_test", " > ", r"\S.* > .+ (?:PASSED|SKIPPED)"),
)


def _alternation(named: list[tuple[str, str]]) -> re.Pattern[str]:
    return re.compile("|".join(f"(?P<{name}>{pattern})" for name, pattern in named))


def _by_first(table: tuple[tuple[str, str, str], ...]) -> dict[str, re.Pattern[str]]:
    return {
        char: _alternation([(name, pattern) for name, starts, pattern in table if char in starts])
        for char in {c for _, starts, _ in table for c in starts}
    }


_BY_FIRST = _by_first(_STARTS)
_INDENTED_BY_FIRST = _by_first(_INDENTED)
_INDENTED_PATH_FIRST = _alternation(list(_INDENTED_PATH))
_PATH_FIRST = re.compile(
    r"(?=(?P<path>(?:vet: )?(?:[A-Za-z]:)?[^\s:()\[\]]+))(?P=path)(?:"
    + "|".join(f"(?P<{name}>{pattern})" for name, pattern in _AFTER_PATH)
    + ")"
)
_BY_NEEDLE = {
    needle: _alternation([(name, pattern) for name, n, pattern in _NEEDLED if n == needle])
    for needle in {n for _, n, _ in _NEEDLED}
}
STRONG = frozenset(
    re.findall(
        r"\S+",
        "v_pytest v_unittest_ran v_cargo v_eslint v_maven v_surefire v_gradle v_jest e_rust_code "
        "e_tsc w_tsc e_eslint_unix w_eslint_unix e_loc w_loc e_eslint_compact w_eslint_compact "
        "e_eslint w_eslint e_lint_code e_go_loc e_kotlin w_kotlin e_maven_loc w_maven_loc "
        "m_pytest_v p_pytest_v g_pytest h_unittest p_cargo_test m_cargo_test g_go_run h_go_fail "
        "p_go_pass p_go_ok h_cargo b_arrow h_surefire m_surefire g_surefire m_gradle_task "
        "g_gradle_task",
    )
)
# A v_go line is strong when it names a package ("FAIL\tpkg\t0.01s"), f_pytest when it
# names a test, s_pytest when it is one of pytest's own titles.
_PYTEST_TITLES = (
    "test session starts",
    "FAILURES",
    "ERRORS",
    "short test summary info",
    "warnings summary",
    "PASSES",
    "slowest",
)

_TS_CODE = re.compile(r"\b(TS\d{4,5})\b")
_RUST_CODE = re.compile(r"(?:error|warning)\[([\w-]+)\]")
_RULE = re.compile(r"@?[\w-]+(?:/[\w-]+)*")
_UNIX_RULE = re.compile(r"\[(?:Error|Warning)/([^\]]+)\]$")
_COMPACT_RULE = re.compile(r"\(([@\w/-]+)\)$")
_BRACKET = re.compile(r"\[(-?W?[\w-]+)\]$")
_LINT_CODE = re.compile(r":\d+:\d+: ([A-Z]{1,4}\d{2,5})\b")
_PY_WARNING = re.compile(r"(\w*Warning): ")
_JAVAC_LINT = re.compile(r":\[\d+,\d+\] \[(\w+)\]")
_LOCATION = re.compile(
    r"\s*(?:\[[A-Z]+\]\s+)?(?:[ew]: )?(?:vet: )?"
    r"(?:\S*?(?::\d+(?::\d+)?:?|\(\d+,\d+\):|:\[\d+,\d+\]))\s*(?:-\s*)?"
)
_SEVERITY = re.compile(
    r"(?:fatal error|error|warning|Error|Warning)(?:\[[\w-]+\])?(?: TS\d+)?:?\s*"
)
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"|`[^`]*`|\u2018[^\u2019]*\u2019|\d+")
_LONG = 500  # characters of a line that are enough to tell its kind
_KIND_CHARS = 40  # of a message that stands for its kind


def classify(line: str) -> str | None:
    """The kind of ``line`` (no trailing whitespace, no ANSI colours), or None."""
    head = line if len(line) <= _LONG else line[:_LONG]  # long lines: told by their start
    found = None
    if head[0] in _WS:
        body = head.lstrip()
        if not body:
            return None
        if (by_first := _INDENTED_BY_FIRST.get(body[0])) is not None:
            found = by_first.fullmatch(body)
        if found is None and ":" in body:
            found = _INDENTED_PATH_FIRST.fullmatch(body)
    else:
        if (by_first := _BY_FIRST.get(head[0])) is not None:
            found = by_first.fullmatch(head)
        if found is None and (":" in head or ".py " in head):
            found = _PATH_FIRST.fullmatch(head)
    if found is None:
        for needle, pattern in _BY_NEEDLE.items():
            if needle in head and (found := pattern.fullmatch(head)) is not None:
                break
    if found is None:
        return None
    kind = found.lastgroup
    assert kind is not None
    if kind == "v_go" and line in ("PASS", "FAIL"):
        return "v_go_bare"
    if kind == "f_pytest" and "::" not in line and ".py" not in line:
        return "f_pytest_weak"
    if kind == "s_pytest" and any(title in line for title in _PYTEST_TITLES):
        return "s_pytest_own"
    return kind


def is_strong(kind: str | None) -> bool:
    return kind in STRONG or kind in ("v_go", "f_pytest", "s_pytest_own")


def kind_of(kind: str, line: str) -> str:
    """What kind of error or warning ``line`` reports, to count by: a rule or code where
    the tool prints one, else the message with names and numbers left out."""
    code: re.Match[str] | None = None
    if kind in ("e_tsc", "w_tsc"):
        code = _TS_CODE.search(line)
    elif kind in ("e_rust_code", "e_rust", "w_rust"):
        code = _RUST_CODE.match(line)
    elif kind in ("e_eslint", "w_eslint"):
        _, gap, rule = line.rpartition("  ")  # the rule is the last column
        if gap and _RULE.fullmatch(rule.strip()):
            return rule.strip()
    elif kind in ("e_eslint_unix", "w_eslint_unix"):
        code = _UNIX_RULE.search(line)
    elif kind in ("e_eslint_compact", "w_eslint_compact"):
        code = _COMPACT_RULE.search(line)
    elif kind == "e_lint_code":
        code = _LINT_CODE.search(line)
    elif kind == "w_py":
        code = _PY_WARNING.search(line)
    elif kind in ("e_maven_loc", "w_maven_loc", "w_maven"):
        code = _JAVAC_LINT.search(line)
    elif kind in ("e_loc", "w_loc"):
        code = _BRACKET.search(line)
    if code is not None:
        return code.group(1)
    message = line.strip()
    if (located := _LOCATION.match(message)) is not None:
        message = message[located.end() :]
    if (severity := _SEVERITY.match(message)) is not None:
        message = message[severity.end() :]
    message = _QUOTED.sub("…", message).strip()
    head = message.split(": ", 1)[0]
    return (head if 3 <= len(head) <= _KIND_CHARS else message[:_KIND_CHARS]).strip() or "other"
