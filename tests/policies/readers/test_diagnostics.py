"""``read_diagnostics``: every error and failure with its location and message under a small
budget, the lines that explain it next, counts of the rest; nothing else claimed."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governor import TokenCounter
from policies.readers import Query, Tier, fit
from policies.readers.diagnostics import read_diagnostics
from tests.policies.readers import diagnostic_outputs as outputs
from tests.policies.readers.samples import app_log, others
from tests.policies.readers.trace_outputs import java_log, python_log

COUNTER = TokenCounter()
NO_QUERY = Query.of()


def fitted_text(text: str, budget: int, query: Query = NO_QUERY) -> str:
    reading = read_diagnostics(text, query)
    assert reading is not None and reading.method == "diagnostics"
    fitted = fit(reading, budget, COUNTER)
    assert fitted is not None and fitted.tokens == COUNTER.count(fitted.text) <= budget
    return fitted.text


def kept_lines(text: str, budget: int, query: Query = NO_QUERY) -> list[str]:
    return fitted_text(text, budget, query).split("\n")


@pytest.mark.parametrize("seed", range(3))
def test_pytest_keeps_every_failure_and_the_verdict(seed: int) -> None:
    text = outputs.pytest_verbose(seed)
    assert COUNTER.count(text) > 3_000
    lines = text.split("\n")
    summary = [line for line in lines if line.startswith("FAILED ")]
    assert len(summary) == len(outputs.PYTEST_FAILING)
    kept = kept_lines(text, 250)
    assert set(summary) <= set(kept)
    assert lines[-1] in kept  # the verdict
    # With more room, the first failure's explanation: its E line and where it was raised.
    kept = kept_lines(text, 400)
    first_e = next(line for line in lines if line.startswith("E       AssertionError"))
    raised = next(line for line in lines if re.fullmatch(r"tests/\S+:\d+: AssertionError", line))
    assert first_e in kept and raised in kept


def test_pytest_passing_tests_fold_into_one_counted_piece() -> None:
    text = outputs.pytest_verbose(4, failing=(150,))
    reading = read_diagnostics(text, NO_QUERY)
    assert reading is not None
    passed = sum(1 for line in text.split("\n") if " PASSED " in line)
    runs = [p for p in reading.pieces if p.what == "passing tests"]
    assert sum(p.count for p in runs) == passed
    assert len(runs) == 2  # before and after the failing test's line
    assert all(p.rank[0] == Tier.REST for p in runs)


def test_a_failure_the_call_names_is_asked_for() -> None:
    text = outputs.pytest_verbose(5)
    target = f"test_case_{outputs.PYTEST_FAILING[-1]}"
    query = Query.of("run_tests", {"test": target})
    reading = read_diagnostics(text, query)
    assert reading is not None
    asked = [p for p in reading.pieces if p.rank[0] == Tier.ASKED]
    assert asked and all(target in p.text for p in asked if "FAILED" in p.text)
    # Its whole failure section is kept before the other failures' sections.
    kept = kept_lines(text, 300, query)
    section = next(line for line in text.split("\n") if line.startswith("_") and target in line)
    assert section in kept


@pytest.mark.parametrize("seed", range(3))
def test_rustc_keeps_both_errors_with_their_locations_and_counts_the_warnings(seed: int) -> None:
    text = outputs.cargo_build(seed)
    assert COUNTER.count(text) > 3_000
    kept = kept_lines(text, 300)
    lines = text.split("\n")
    for code in ("error[E0308]", "error[E0425]"):
        at = next(k for k, line in enumerate(lines) if line.startswith(code))
        assert lines[at] in kept and lines[at + 1] in kept  # the message and its --> line
    assert lines[-1] in kept  # could not compile ... due to 2 previous errors
    summary = next(line for line in kept if line.startswith("[warnings: "))
    total = sum(1 for line in lines if re.match(r"warning: (?!`shop`)", line))
    assert summary.startswith(f"[warnings: {total} (")
    unused = sum(1 for line in lines if line.startswith("warning: unused variable"))
    assert f"unused variable {unused}" in summary


def test_rustc_snippet_follows_the_error_when_there_is_room() -> None:
    text = outputs.cargo_build(1)
    kept = kept_lines(text, 450)
    assert "88 |     let total: Money = line.amount * 2;" in kept


@pytest.mark.parametrize("seed", range(3))
def test_eslint_keeps_the_error_under_its_file_and_counts_warnings_by_rule(seed: int) -> None:
    text, broken = outputs.eslint_stylish(seed)
    lines = text.split("\n")
    kept = kept_lines(text, 200)
    error = next(line for line in lines if "  error  " in line)
    assert error in kept
    # The file's name is kept with it, right above (a marker may stand between).
    above = [line for line in kept[: kept.index(error)] if not line.startswith("[...")]
    assert above[-1] == broken
    assert next(line for line in lines if line.startswith("✖")) in kept
    summary = next(line for line in kept if line.startswith("[warnings: "))
    console = sum(1 for line in lines if line.rstrip().endswith("no-console"))
    assert f"no-console {console}" in summary


def test_warnings_stand_out_one_per_rule_when_nothing_failed() -> None:
    text, _ = outputs.eslint_stylish(3)
    text = "\n".join(line for line in text.split("\n") if "  error  " not in line)
    reading = read_diagnostics(text, NO_QUERY)
    assert reading is not None
    standout = [p for p in reading.pieces if p.rank[0] == Tier.STANDOUT]
    headers = [p for p in standout if p.text.startswith("/home/")]  # ranked with their own
    standout = [p for p in standout if p not in headers]
    assert len(headers) <= len(standout)
    rules = {line.split()[-1] for line in text.split("\n") if "  warning  " in line}
    assert sorted(p.text.split()[-1] for p in standout) == sorted(rules)
    firsts = {}
    for line in text.split("\n"):
        if "  warning  " in line:
            firsts.setdefault(line.split()[-1], line)
    assert {p.text for p in standout} == set(firsts.values())


def test_eslint_file_named_by_the_call_is_asked_for_with_its_findings() -> None:
    text, _ = outputs.eslint_stylish(2)
    lines = text.split("\n")
    target = next(line for line in lines[20:] if line.startswith("/home/"))
    query = Query.of("lint", {"path": target})
    reading = read_diagnostics(text, query)
    assert reading is not None
    start = lines.index(target)
    end = next(k for k in range(start + 1, len(lines)) if not lines[k])
    asked = {p.text for p in reading.pieces if p.rank[0] == Tier.ASKED}
    assert set(lines[start:end]) <= asked


@pytest.mark.parametrize("seed", range(3))
def test_tsc_keeps_the_errors_first_and_counts_them_by_code(seed: int) -> None:
    text = outputs.tsc_errors(seed)
    assert COUNTER.count(text) > 3_000
    lines = text.split("\n")
    kept = kept_lines(text, 300)
    assert lines[0] in kept and lines[-1] in kept  # the first error, "Found 91 errors"
    summary = next(line for line in kept if line.startswith("[errors: "))
    errors = [line for line in lines if ": error TS" in line]
    assert summary.startswith(f"[errors: {len(errors)} (")
    code = "TS2345"
    assert f"{code} {sum(1 for line in errors if code in line)}" in summary
    query = Query.of("tsc", {"file": "src/checkout/pay.ts"})
    assert next(line for line in lines if "pay.ts" in line) in kept_lines(text, 120, query)


@pytest.mark.parametrize("seed", range(3))
def test_go_test_keeps_the_failing_test_messages_and_not_the_passing_ones(seed: int) -> None:
    text = outputs.go_test(seed)
    assert COUNTER.count(text) > 3_000
    lines = text.split("\n")
    kept = kept_lines(text, 200)
    fail = lines.index("--- FAIL: TestParse3 (0.00s)")
    messages = [lines[fail - 2], lines[fail - 1]]
    assert all(m.startswith("    parse_test.go:5") for m in messages)
    assert set(messages) <= set(kept) and lines[fail] in kept
    failed_package = next(line for line in lines if line.startswith("FAIL\texample.com"))
    assert failed_package in kept
    reading = read_diagnostics(text, NO_QUERY)
    assert reading is not None
    alarms = [p.text for p in reading.pieces if p.rank[0] == Tier.ALARM]
    assert not any("checked" in text for text in alarms)  # passing tests' t.Log lines


def test_go_build_errors_keep_their_package_line() -> None:
    text = "\n".join(
        [
            "# example.com/shop/cart",
            "cart/store.go:12:5: undefined: Totl",
            "cart/store.go:20:2: declared and not used: x",
            "# example.com/shop/api",
            "api/handler.go:33:14: cannot use id (variable of type int) as string value",
        ]
    )
    reading = read_diagnostics(text, NO_QUERY)
    assert reading is not None
    ranks = {p.text: p.rank for p in reading.pieces}
    assert ranks["# example.com/shop/cart"][0] == Tier.ALARM
    assert (
        ranks["api/handler.go:33:14: cannot use id (variable of type int) as string value"][0]
        == Tier.ALARM
    )


@pytest.mark.parametrize("seed", range(3))
def test_maven_keeps_the_failure_its_test_frame_and_the_build_verdict(seed: int) -> None:
    text = outputs.maven_surefire(seed)
    assert COUNTER.count(text) > 3_000
    lines = text.split("\n")
    kept = kept_lines(text, 300)
    message = "org.opentest4j.AssertionFailedError: expected: <40.00> but was: <45.00>"
    frame = next(line for line in lines if "Test.refundsPartialOrder(" in line)
    result = next(line for line in lines if ".refundsPartialOrder:77 " in line)
    assert {message, frame, result, "[INFO] BUILD FAILURE"} <= set(kept)
    assert not any("AssertionFailureBuilder" in line for line in kept)  # JUnit's own frames


@pytest.mark.parametrize("seed", range(3))
def test_unittest_keeps_the_failure_its_frame_and_the_verdict(seed: int) -> None:
    text = outputs.unittest_verbose(seed)
    assert COUNTER.count(text) > 3_000
    lines = text.split("\n")
    kept = kept_lines(text, 200)
    head = next(line for line in lines if line.startswith("FAIL: "))
    frame = next(line for line in lines if line.startswith('  File "/app/tests/'))
    assert {head, frame, "AssertionError: Decimal('10.90') != Decimal('9.90')"} <= set(kept)
    assert {"FAILED (failures=1)", lines[-3]} <= set(kept)  # the verdict and "Ran 260 tests"


@pytest.mark.parametrize("seed", range(3))
def test_junit_xml_renders_the_failing_testcase_compactly(seed: int) -> None:
    text, test = outputs.junit_report(seed)
    assert COUNTER.count(text) > 3_000
    kept = kept_lines(text, 200)
    assert kept[0] == "[junit: 300 tests, 1 failure, 0 errors, 0 skipped; 12 suites]"
    expected = f"FAILED {test} - org.opentest4j.AssertionFailedError: expected: <3> but was: <4>"
    assert expected in kept
    method = test.rsplit(".", 1)[1]
    assert any(line.strip().startswith("at ") and f".{method}(" in line for line in kept)
    reading = read_diagnostics(text, NO_QUERY)
    assert reading is not None
    assert sum(p.count for p in reading.pieces if p.what == "passing tests") == 299


def test_junit_xml_cut_short_still_reads_its_testcases() -> None:
    text, test = outputs.junit_report(3)
    cut = text[: text.index("</failure>") + 2_000]
    reading = read_diagnostics(cut, NO_QUERY)
    assert reading is not None
    assert "report cut short" in reading.pieces[0].text
    assert any(p.text.startswith(f"FAILED {test}") for p in reading.pieces)


@pytest.mark.parametrize(
    "text",
    [
        # cargo test
        "running 2 tests\ntest tests::adds ... ok\ntest tests::parses ... FAILED\n\nfailures:\n\n"
        "---- tests::parses stdout ----\nthread 'tests::parses' panicked at src/lib.rs:10:9:\n"
        "assertion `left == right` failed\n  left: 1\n right: 2\n\nfailures:\n    tests::parses\n"
        "\ntest result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out",
        # gcc
        "main.c: In function 'main':\nmain.c:5:5: error: 'y' undeclared (first use in this "
        "function)\n    5 |     y = 3;\n      |     ^",
        # mypy
        'src/app/models.py:12: error: Incompatible types in assignment (expression has type "str"'
        ', variable has type "int")  [assignment]\n'
        "Found 1 error in 1 file (checked 14 source files)",
        # Gradle with Kotlin
        "> Task :compileKotlin\ne: file:///app/src/main/kotlin/Cart.kt:12:5 Unresolved reference:"
        " totl\n> Task :compileKotlin FAILED\n\nBUILD FAILED in 3s",
        # tsc --pretty
        "src/util.ts:7:3 - error TS2304: Cannot find name 'bar'.\n\n7   bar();\n    ~~~\n\n"
        "Found 1 error in src/util.ts:7",
    ],
    ids=["cargo-test", "gcc", "mypy", "gradle", "tsc-pretty"],
)
def test_each_format_marks_its_failure_alarm(text: str) -> None:
    reading = read_diagnostics(text, NO_QUERY)
    assert reading is not None
    alarms = "\n".join(p.text for p in reading.pieces if p.rank[0] == Tier.ALARM)
    failure = {
        "panicked": "panicked at src/lib.rs:10:9",
        "main.c:5:5: error": "main.c:5:5: error",
        "src/app/models.py:12: error": "src/app/models.py:12: error",
        "Cart.kt:12:5": "Cart.kt:12:5 Unresolved reference",
        "error TS2304": "src/util.ts:7:3 - error TS2304",
    }
    assert any(key in text and found in alarms for key, found in failure.items())


@pytest.mark.parametrize("seed", range(2))
def test_other_structures_are_not_diagnostics(seed: int) -> None:
    for kind, text in others(seed).items():
        if kind == "pytest":
            continue  # pytest output is diagnostics
        assert read_diagnostics(text, NO_QUERY) is None, kind
    assert read_diagnostics(python_log(seed), NO_QUERY) is None  # a trace, not a test run
    assert read_diagnostics(java_log(seed), NO_QUERY) is None


def test_a_log_that_merely_says_error_is_not_diagnostics() -> None:
    text = "\n".join(
        [
            "2026-03-04 10:00:01 ERROR [http-1] orders - Failed to load order 42: refused",
            "[ERROR] something went wrong in worker 3",
            "error: could not open config file /etc/shop.yml",
            "FAILED to connect to db (timeout)",
            "ERROR: connection (timeout)",
            "warning: disk 91% full",
            "The build failed because of an error; test result reporting was off.",
        ]
        * 20
    )
    assert read_diagnostics(text, NO_QUERY) is None


def test_one_tool_like_line_in_a_long_log_does_not_make_it_diagnostics() -> None:
    lines = app_log(3).split("\n")
    lines.insert(len(lines) // 2, "ok  \texample.com/shop/cart\t0.012s")
    assert read_diagnostics("\n".join(lines), NO_QUERY) is None
    # The same line with a second one only a test runner prints is a test run.
    lines.insert(len(lines) // 2, "--- FAIL: TestCart (0.00s)")
    assert read_diagnostics("\n".join(lines), NO_QUERY) is not None


def test_grep_output_with_columns_is_not_diagnostics() -> None:
    text = "\n".join(
        f"internal/cart/store_{k}.go:{10 + k}:{k % 9 + 1}:    if err := s.db.Get(id); err != nil {{"
        for k in range(60)
    )
    assert read_diagnostics(text, NO_QUERY) is None


DIAGNOSTIC_LINES = (
    "FAILED tests/test_a.py::test_x - AssertionError: boom",
    "tests/test_a.py::test_y PASSED                        [ 50%]",
    "=================== 1 failed, 1 passed in 0.10s ===================",
    "_______________ test_x _______________",
    "E       assert 1 == 2",
    ">       assert f() == 2",
    "tests/test_a.py:3: AssertionError",
    "error[E0308]: mismatched types",
    "  --> src/main.rs:4:18",
    '4 |     let x: i32 = "a";',
    "warning: unused variable: `y`",
    "src/a.ts(12,5): error TS2345: Argument of type 'string'.",
    "  12:5  error    'x' is defined but never used  no-unused-vars",
    "/home/me/a.js",
    "--- FAIL: TestX (0.00s)",
    "    x_test.go:42: got 3",
    "=== RUN   TestX",
    "panic: runtime error: index out of range",
    "goroutine 1 [running]:",
    "main.main()",
    "\t/app/main.go:10 +0x1d",
    "[ERROR] testX(com.acme.FooTest)  Time elapsed: 0.01 s  <<< FAILURE!",
    "java.lang.AssertionError: expected:<1> but was:<2>",
    "\tat com.acme.FooTest.testX(FooTest.java:42)",
    "FAIL: test_add (tests.test_math.TestMath)",
    "Traceback (most recent call last):",
    '  File "/app/x.py", line 3, in f',
    "ValueError: bad",
    "Ran 3 tests in 0.001s",
    "---- tests::b stdout ----",
    "  \u25cf Suite \u203a adds",  # Jest's failure head
    "* What went wrong:",
    "CartTest > testTotal() FAILED",
    "",
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(DIAGNOSTIC_LINES) | st.text(max_size=30), max_size=60),
    st.integers(min_value=20, max_value=400),
)
def test_never_raises_and_fits_on_diagnostic_like_text(lines: list[str], budget: int) -> None:
    text = "\n".join(lines)
    reading = read_diagnostics(text, Query.of("run", {"test": "test_x"}))
    if reading is None:
        return
    source = {line.rstrip() for line in text.splitlines()}
    for piece in reading.pieces:
        assert piece.text and not piece.text.endswith("\n")
        if not piece.text.startswith("["):  # synthesized counts are the only new lines
            assert set(piece.text.split("\n")) <= source
    fitted = fit(reading, budget, COUNTER)
    assert fitted is None or fitted.tokens <= budget


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400), st.integers(min_value=1, max_value=300))
def test_never_raises_on_arbitrary_text(text: str, budget: int) -> None:
    reading = read_diagnostics(text, NO_QUERY)
    if reading is not None:
        fitted = fit(reading, budget, COUNTER)
        assert fitted is None or fitted.tokens <= budget
