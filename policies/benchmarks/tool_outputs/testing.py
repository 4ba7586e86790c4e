"""Test runs: pytest, ``python -m unittest -v``, ``go test -v``, ``cargo test``, JUnit XML reports.

Hundreds of passing tests and one to three failures, each printed where its runner prints
it (pytest, unittest and cargo gather the details at the end; go test and JUnit keep them
with the test). A failing test is a fact: its name and its assertion message.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

from policies.benchmarks.tool_outputs._common import (
    NOUNS,
    QUALIFIERS,
    SERVICES,
    VERBS,
    Clock,
    Unique,
    fill,
    hexid,
    num_chars,
    pascal,
    plant,
)
from policies.benchmarks.tool_outputs.case import Case, Fact

__all__ = ["FORMATS", "build"]

FORMATS = ("pytest", "unittest", "go_test", "cargo_test", "junit_xml")
_CHARS_PER_TOKEN = {
    "pytest": 4.1,
    "unittest": 4.9,
    "go_test": 2.0,
    "cargo_test": 4.1,
    "junit_xml": 3.6,
}
_CHARS_PER_TEST = {"pytest": 95, "unittest": 110, "go_test": 60, "cargo_test": 50, "junit_xml": 125}


@dataclass(frozen=True, slots=True)
class _Test:
    module: str  # billing/test_invoices (python), billing (go, rust, java)
    words: tuple[str, str, str]  # verb, noun, qualifier
    failure: tuple[int, int, str] | None = None  # actual, expected, what (None: passes)


def build(rng: random.Random) -> Case:
    fmt = rng.choice(FORMATS)
    size = num_chars(rng, _CHARS_PER_TOKEN[fmt])
    names, values = Unique(), Unique()
    modules = [
        f"{svc}/{rng.choice(('test_', ''))}{noun}"
        for svc, noun in zip(rng.sample(SERVICES, 6), rng.sample(NOUNS, 6), strict=True)
    ]

    def test(failing: bool = False) -> _Test:
        verb, noun, qualifier = names(
            lambda: f"{rng.choice(VERBS)} {rng.choice(NOUNS)} {rng.choice(QUALIFIERS)}"
        ).split()
        failure: tuple[int, int, str] | None = None
        if failing:
            actual, expected = (int(values(lambda: str(rng.randint(100, 99_999)))) for _ in "ab")
            failure = (
                actual,
                expected,
                rng.choice(("eq", "count")) if fmt != "junit_xml" else "eq",
            )
        return _Test(rng.choice(modules), (verb, noun, qualifier), failure)

    tests = fill(test, size, lambda t: _CHARS_PER_TEST[fmt])
    failing = [test(failing=True) for _ in range(rng.choice((1, 1, 2, 3)))]
    plant(rng, tests, failing)
    tests.sort(key=lambda t: modules.index(t.module))  # a runner goes file by file
    text, tool, arguments = _RENDER[fmt](rng, tests)
    facts = [
        Fact(
            (_name(fmt, t), _message(fmt, t)),
            "standout",
            f"{_name(fmt, t)} fails: {_message(fmt, t)}",
        )
        for t in failing
    ]
    question = rng.choice(
        (
            "Why are the tests failing?",
            "CI went red after my last push. Which tests broke, and what do the assertions say?",
            "Run the suite and tell me whether it's green.",
        )
    )
    if rng.random() < 0.3:
        named = failing[0]
        facts[0] = Fact(facts[0].needles, "asked", facts[0].description)
        question = f"Does {_name(fmt, named)} pass now? I changed the {named.words[1]} code."
    return Case("test_output", fmt, tool, arguments, question, text, tuple(facts))


def _name(fmt: str, t: _Test) -> str:
    verb, noun, qualifier = t.words
    if fmt in ("pytest", "unittest"):
        return f"test_{verb}_{noun}_{qualifier}"
    if fmt == "go_test":
        return f"Test{pascal(verb, noun, qualifier)}"
    if fmt == "cargo_test":
        return f"{t.module.split('/')[0]}::tests::{verb}_{noun}_{qualifier}"
    return pascal(verb, noun, qualifier)[0].lower() + pascal(verb, noun, qualifier)[1:]


def _message(fmt: str, t: _Test) -> str:
    """The needle phrase of a failure's message, as the runner prints it."""
    assert t.failure is not None
    actual, expected, what = t.failure
    noun = t.words[1]
    if fmt == "pytest":
        return (
            f"assert {actual} == {expected}"
            if what == "eq"
            else (f"expected {expected} {noun}s, got {actual}")
        )
    if fmt == "unittest":
        return f"{actual} != {expected}"
    if fmt == "go_test":
        return (
            f"total = {actual}, want {expected}"
            if what == "eq"
            else (f"got {actual} {noun}s, want {expected}")
        )
    if fmt == "cargo_test":
        return f"left: {actual}" if what == "eq" else f"expected {expected} {noun}s, got {actual}"
    return f"but was: {actual}"


def _python_file(t: _Test) -> str:
    svc, mod = t.module.split("/")
    return f"tests/{svc}/{mod if mod.startswith('test_') else 'test_' + mod}.py"


# -- pytest ----------------------------------------------------------------------------------
def _pytest(rng: random.Random, tests: list[_Test]) -> tuple[str, str, dict]:
    lines = [
        "=" * 29 + " test session starts " + "=" * 30,
        "platform linux -- Python 3.11.8, pytest-8.1.1, pluggy-1.4.0 -- /app/.venv/bin/python",
        "cachedir: .pytest_cache",
        "rootdir: /app",
        "configfile: pyproject.toml",
        "plugins: anyio-4.3.0, cov-5.0.0, asyncio-0.23.6, mock-3.14.0",
        f"collecting ... collected {len(tests)} items",
        "",
    ]
    for i, t in enumerate(tests):
        outcome = "FAILED" if t.failure else rng.choice(("PASSED",) * 30 + ("SKIPPED",))
        head = f"{_python_file(t)}::{_name('pytest', t)} {outcome}"
        lines.append(f"{head:<72} [{100 * (i + 1) // len(tests):3d}%]")
    failing = [t for t in tests if t.failure]
    lines += ["", "=" * 35 + " FAILURES " + "=" * 35]
    for t in failing:
        assert t.failure is not None  # failing: tests that fail
        actual, expected, what = t.failure
        name, noun = _name("pytest", t), t.words[1]
        lineno = rng.randint(20, 400)
        lines += [
            f" {name} ".center(80, "_"),
            "",
            f"client = <starlette.testclient.TestClient object at 0x7f{hexid(rng, 10)}>",
            "",
            f"    def {name}(client):",
            f"        {noun} = make_{noun}(client, expected={expected})",
        ]
        if what == "eq":
            lines += [
                f">       assert {t.words[0]}_{noun}({noun}).total == {expected}",
                f"E       assert {actual} == {expected}",
                f"E        +  where {actual} = <{pascal(noun)} id={rng.randint(1, 9999)}>.total",
            ]
        else:
            lines += [
                f"        found = list_{noun}s(client)",
                f'>       assert len(found) == {expected}, f"expected {expected} {noun}s, '
                'got {len(found)}"',
                f"E       AssertionError: expected {expected} {noun}s, got {actual}",
            ]
        lines += [
            "",
            f"{_python_file(t)}:{lineno}: AssertionError",
            "------------------------------ Captured log call -------------------------------",
            f"INFO     {t.module.split('/')[0]}.api:api.py:{rng.randint(20, 300)} POST /{noun}s "
            f"201 in {rng.randint(3, 90)}ms",
        ]
    lines += ["=" * 31 + " warnings summary " + "=" * 31]
    for t in rng.sample(tests, min(len(tests), rng.randint(2, 6))):
        lines += [
            f"{_python_file(t)}::{_name('pytest', t)}",
            "  /app/.venv/lib/python3.11/site-packages/pydantic/_internal/_config.py:291: "
            "PydanticDeprecatedSince20: Support for class-based `config` is deprecated, use "
            "ConfigDict instead.",
            "",
        ]
    lines += [
        "-- Docs: https://docs.pytest.org/en/stable/how-to/capture-warnings.html",
        "=" * 28 + " short test summary info " + "=" * 27,
    ]
    for t in failing:
        message = _message("pytest", t)
        prefix = "" if message.startswith("assert ") else "AssertionError: "
        lines.append(f"FAILED {_python_file(t)}::{_name('pytest', t)} - {prefix}{message}")
    lines.append(
        f" {len(failing)} failed, {len(tests) - len(failing)} passed, "
        f"{rng.randint(2, 30)} warnings in {rng.uniform(5, 300):.2f}s ".center(80, "=")
    )
    command = rng.choice(
        ("pytest -v tests/", "pytest -v --tb=long", "python -m pytest -v -p no:cacheprovider")
    )
    return "\n".join(lines) + "\n", "run_tests", {"command": command}


# -- unittest --------------------------------------------------------------------------------
def _unittest(rng: random.Random, tests: list[_Test]) -> tuple[str, str, dict]:
    lines = []
    for t in tests:
        svc, mod = t.module.split("/")
        dotted = f"tests.{svc}.{mod if mod.startswith('test_') else 'test_' + mod}"
        cls = f"{pascal(t.words[1])}Tests"
        name = _name("unittest", t)
        lines.append(f"{name} ({dotted}.{cls}.{name}) ... {'FAIL' if t.failure else 'ok'}")
        if rng.random() < 0.04:  # what the code under test logs to stderr meanwhile
            lines.append(f"WARNING:{svc}.client:retrying {t.words[1]} fetch (attempt 2 of 3)")
    for t in (t for t in tests if t.failure):
        assert t.failure is not None  # failing: tests that fail
        actual, expected, what = t.failure
        svc, mod = t.module.split("/")
        dotted = f"tests.{svc}.{mod if mod.startswith('test_') else 'test_' + mod}"
        name = _name("unittest", t)
        cls = f"{pascal(t.words[1])}Tests"
        extra = "" if what == "eq" else f" : expected {expected} {t.words[1]}s"
        lines += [
            "=" * 70,
            f"FAIL: {name} ({dotted}.{cls}.{name})",
            "-" * 70,
            "Traceback (most recent call last):",
            f'  File "/app/{_python_file(t)}", line {rng.randint(20, 400)}, in {name}',
            f"    self.assertEqual({t.words[1]}.total, {expected})",
            f"AssertionError: {actual} != {expected}{extra}",
            "",
        ]
    failures = sum(1 for t in tests if t.failure)
    lines += [
        "-" * 70,
        f"Ran {len(tests)} tests in {rng.uniform(2, 90):.3f}s",
        "",
        f"FAILED (failures={failures})",
    ]
    return "\n".join(lines) + "\n", "shell", {"command": "python -m unittest discover -v -s tests"}


# -- go test ---------------------------------------------------------------------------------
def _go_test(rng: random.Random, tests: list[_Test]) -> tuple[str, str, dict]:
    module = f"github.com/{rng.choice(('acme', 'globex', 'initech'))}/shop"
    lines: list[str] = []
    packages: dict[str, bool] = {}
    for i, t in enumerate(tests):
        svc = t.module.split("/")[0]
        name = _name("go_test", t)
        lines.append(f"=== RUN   {name}")
        if rng.random() < 0.15:
            for case in rng.sample(("empty", "nil_input", "utf8", "large", "negative"), 2):
                lines += [f"=== RUN   {name}/{case}", f"    --- PASS: {name}/{case} (0.00s)"]
        if t.failure:
            file = f"{t.words[1]}_test.go:{rng.randint(20, 400)}"
            lines.append(f"    {file}: {_message('go_test', t)}")
            lines.append(f"--- FAIL: {name} ({rng.uniform(0, 0.5):.2f}s)")
        else:
            lines.append(f"--- PASS: {name} ({rng.uniform(0, 0.2):.2f}s)")
        packages[svc] = packages.get(svc, True) and t.failure is None
        if i + 1 == len(tests) or tests[i + 1].module != t.module:  # the package ends
            ok = packages[svc]
            lines += [
                "PASS" if ok else "FAIL",
                f"{'ok  ' if ok else 'FAIL'}\t{module}/internal/{svc}\t{rng.uniform(0.01, 9):.3f}s",
            ]
    lines.append("FAIL")
    return "\n".join(lines) + "\n", "run_tests", {"command": "go test -v ./..."}


# -- cargo test ------------------------------------------------------------------------------
def _cargo_test(rng: random.Random, tests: list[_Test]) -> tuple[str, str, dict]:
    crate = rng.choice(("shop", "ledger", "ingest", "pricing"))
    lines = [
        f"   Compiling {crate} v0.{rng.randint(1, 9)}.{rng.randint(0, 20)} (/app)",
        f"    Finished `test` profile [unoptimized + debuginfo] target(s) in "
        f"{rng.uniform(3, 90):.2f}s",
        f"     Running unittests src/lib.rs (target/debug/deps/{crate}-{hexid(rng, 16)})",
        "",
        f"running {len(tests)} tests",
    ]
    lines += [f"test {_name('cargo_test', t)} ... {'FAILED' if t.failure else 'ok'}" for t in tests]
    failing = [t for t in tests if t.failure]
    lines += ["", "failures:", ""]
    for t in failing:
        assert t.failure is not None  # failing: tests that fail
        actual, expected, what = t.failure
        name = _name("cargo_test", t)
        where = f"src/{t.module.split('/')[0]}.rs:{rng.randint(20, 600)}:{rng.randint(5, 40)}"
        lines += [f"---- {name} stdout ----", f"thread '{name}' panicked at {where}:"]
        if what == "eq":
            lines += [
                "assertion `left == right` failed",
                f"  left: {actual}",
                f" right: {expected}",
            ]
        else:
            lines.append(_message("cargo_test", t))
        lines += [
            "note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace",
            "",
        ]
    lines += [
        "",
        "failures:",
        *(f"    {_name('cargo_test', t)}" for t in failing),
        "",
        f"test result: FAILED. {len(tests) - len(failing)} passed; {len(failing)} failed; "
        f"0 ignored; 0 measured; 0 filtered out; finished in {rng.uniform(0.1, 40):.2f}s",
        "",
        "error: test failed, to rerun pass `--lib`",
    ]
    return "\n".join(lines) + "\n", "run_tests", {"command": "cargo test"}


# -- JUnit XML -------------------------------------------------------------------------------
def _junit_xml(rng: random.Random, tests: list[_Test]) -> tuple[str, str, dict]:
    clock = Clock(rng)
    suites: dict[str, list[_Test]] = {}
    for t in tests:
        svc, mod = t.module.split("/")
        suites.setdefault(
            f"com.acme.{svc}.{pascal(mod.removeprefix('test_'))}ServiceTest", []
        ).append(t)
    failures = sum(1 for t in tests if t.failure)
    lines = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<testsuites name="gradle test" tests="{len(tests)}" failures="{failures}" '
        f'errors="0" time="{rng.uniform(5, 300):.3f}">',
    ]
    for suite, members in suites.items():
        bad = sum(1 for t in members if t.failure)
        lines.append(
            f'  <testsuite name="{suite}" tests="{len(members)}" skipped="0" '
            f'failures="{bad}" errors="0" timestamp="{clock.tick():%Y-%m-%dT%H:%M:%S}" '
            f'hostname="runner-{rng.randint(1, 40)}" time="{rng.uniform(0.1, 9):.3f}">'
        )
        lines.append("    <properties/>")
        for t in members:
            name = _name("junit_xml", t)
            head = (
                f'    <testcase name="{name}()" classname="{suite}" time="{rng.uniform(0, 1):.3f}"'
            )
            if not t.failure:
                lines.append(head + "/>")
                continue
            actual, expected, _ = t.failure
            message = f"\nexpected: {expected}\n but was: {actual}"
            cls = suite.rsplit(".", 1)[1]
            stack = (
                f"org.opentest4j.AssertionFailedError: {message}\n"
                f"\tat app//org.assertj.core.api.AbstractAssert.isEqualTo(AbstractAssert.java:94)\n"
                f"\tat app//{suite}.{name}({cls}.java:{rng.randint(20, 400)})\n"
                "\tat java.base@21.0.2/java.lang.reflect.Method.invoke(Method.java:580)\n"
                "\tat app//org.junit.platform.commons.util.ReflectionUtils.invokeMethod("
                "ReflectionUtils.java:728)"
            )
            attr = quoteattr(message).replace("\n", "&#10;")
            lines += [
                head + ">",
                f'      <failure message={attr} type="org.opentest4j.AssertionFailedError">'
                f"{escape(stack)}</failure>",
                "    </testcase>",
            ]
        log = "\n".join(
            f"{clock.tick():%H:%M:%S.%f} [Test worker] INFO  {suite} - "
            f"{rng.choice(VERBS)} {rng.choice(NOUNS)} ok"
            for _ in range(rng.choice((0, 0, 1, 3)))
        )
        lines += [
            f"    <system-out><![CDATA[{log}]]></system-out>",
            "    <system-err><![CDATA[]]></system-err>",
            "  </testsuite>",
        ]
    lines.append("</testsuites>")
    return "\n".join(lines) + "\n", "read_file", {"path": "build/test-results/test/junit.xml"}


_RENDER = {
    "pytest": _pytest,
    "unittest": _unittest,
    "go_test": _go_test,
    "cargo_test": _cargo_test,
    "junit_xml": _junit_xml,
}
