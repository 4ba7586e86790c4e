"""Compiler, linter and test-runner outputs as the tools print them, for the diagnostics
reader's tests: long runs (3,000 tokens and more) with a few failures in them. Each
builder takes a seed and returns the text; the tests find what they expect in it."""

from __future__ import annotations

import random

PYTEST_FAILING = (41, 187, 260)


def pytest_verbose(
    seed: int, *, tests: int = 300, failing: tuple[int, ...] = PYTEST_FAILING
) -> str:
    rng = random.Random(seed)
    out = [
        "============================= test session starts ==============================",
        "platform linux -- Python 3.11.7, pytest-8.1.1, pluggy-1.4.0 -- /app/.venv/bin/python",
        "cachedir: .pytest_cache",
        "rootdir: /app",
        "configfile: pyproject.toml",
        "plugins: anyio-4.3.0, hypothesis-6.99.0",
        f"collecting ... collected {tests} items",
        "",
    ]
    modules = ("cart", "orders", "users", "billing")
    names = [
        f"tests/{'unit' if i % 3 else 'api'}/test_{modules[i % 4]}.py::test_case_{i}"
        for i in range(tests)
    ]
    skipped = 0
    for i, name in enumerate(names):
        status = "FAILED" if i in failing else "PASSED"
        if status == "PASSED" and rng.random() < 0.03:
            status, skipped = "SKIPPED", skipped + 1
        pad = " " * max(1, 70 - len(name) - len(status))
        out.append(f"{name} {status}{pad}[{(i + 1) * 100 // tests:3d}%]")
    out += ["", "=================================== FAILURES ==================================="]
    for i in failing:
        path, func = names[i].split("::")
        out += [
            f"{'_' * 30} {func} {'_' * 30}",
            "",
            f"    def {func}():",
            "        cart = Cart(currency='EUR')",
            "        for sku in ('A-1', 'B-2', 'C-3'):",
            "            cart.add(Item(sku, qty=2))",
            f">       assert cart.total() == Decimal('{i}.00')",
            f"E       AssertionError: assert Decimal('{i - 1}.50') == Decimal('{i}.00')",
            "E        +  where Decimal('1.50') = <bound method Cart.total of <Cart at 0x7f3a>>()",
            "",
            f"{path}:{40 + i}: AssertionError",
            "----------------------------- Captured stdout call -----------------------------",
        ]
        out += [f"DEBUG cart: add sku={s} qty=2 price={rng.randint(1, 99)}.00" for s in "ABC"]
    out += [
        "=============================== warnings summary ===============================",
        "tests/unit/test_cart.py::test_case_1",
        "  /app/src/cart.py:88: DeprecationWarning: datetime.datetime.utcnow() is deprecated",
        "    stamp = datetime.utcnow()",
        "",
        "tests/api/test_users.py::test_case_3",
        "  /app/src/users.py:12: ResourceWarning: unclosed file <_io.TextIOWrapper name='x'>",
        "    data = open(path).read()",
        "",
        "-- Docs: https://docs.pytest.org/en/stable/how-to/capture-warnings.html",
        "=========================== short test summary info ============================",
    ]
    for i in failing:
        out.append(f"FAILED {names[i]} - AssertionError: assert Decimal('{i - 1}.50') == Dec...")
    passed = tests - len(failing) - skipped
    out.append(
        f"====== {len(failing)} failed, {passed} passed, {skipped} skipped, 2 warnings "
        "in 4.21s ======"
    )
    return "\n".join(out)


RUST_WARNINGS = (
    ("unused variable: `{name}`", "let {name} = compute();", "unused_variables"),
    (
        "unused import: `std::collections::{name}`",
        "use std::collections::{name};",
        "unused_imports",
    ),
    ("function `{name}` is never used", "fn {name}() {{}}", "dead_code"),
)


def cargo_build(seed: int, *, warnings: int = 45) -> str:
    """``cargo build``: many warnings, two errors among them, cargo's closing lines."""
    rng = random.Random(seed)
    out = ["   Compiling libc v0.2.153", "   Compiling serde v1.0.197", "   Compiling shop v0.1.0"]
    errors_at = sorted(rng.sample(range(warnings), 2))
    for k in range(warnings):
        message, code, lint = RUST_WARNINGS[rng.randrange(3)]
        name = f"item_{k}"
        line = rng.randint(5, 400)
        out += [
            f"warning: {message.format(name=name)}",
            f"  --> src/orders/module_{k % 7}.rs:{line}:9",
            "    |",
            f"{line} |     {code.format(name=name)}",
            "    |         ^^^^^^ help: if this is intentional, prefix it with an underscore",
            "    |",
            f"    = note: `#[warn({lint})]` on by default",
            "",
        ]
        if k == errors_at[0]:
            out += [
                "error[E0308]: mismatched types",
                "  --> src/billing/invoice.rs:88:24",
                "   |",
                "88 |     let total: Money = line.amount * 2;",
                "   |                -----   ^^^^^^^^^^^^^^^ expected `Money`, found `f64`",
                "   |                |",
                "   |                expected due to this",
                "",
            ]
        if k == errors_at[1]:
            out += [
                "error[E0425]: cannot find value `discount_rate` in this scope",
                "   --> src/billing/discount.rs:140:17",
                "    |",
                "140 |     let cut = discount_rate * price;",
                "    |               ^^^^^^^^^^^^^ not found in this scope",
                "",
            ]
    out += [
        "Some errors have detailed explanations: E0308, E0425.",
        "For more information about an error, try `rustc --explain E0308`.",
        f"warning: `shop` (lib) generated {warnings} warnings",
        f"error: could not compile `shop` (lib) due to 2 previous errors; {warnings} warnings "
        "emitted",
    ]
    return "\n".join(out)


ESLINT_RULES = (
    ("'{name}' is defined but never used", "@typescript-eslint/no-unused-vars"),
    ("Unexpected console statement", "no-console"),
    ("Unexpected any. Specify a different type", "@typescript-eslint/no-explicit-any"),
)


def eslint_stylish(seed: int, *, files: int = 40) -> tuple[str, str]:
    """ESLint's default output: warnings in most files, one error; returns the text and
    the file holding the error."""
    rng = random.Random(seed)
    broken = rng.randrange(files)
    out, errors, warnings = [""], 0, 0
    for f in range(files):
        out.append(f"/home/dev/shop/src/components/Widget{f}.tsx")
        for _ in range(rng.randint(1, 4)):
            message, rule = ESLINT_RULES[rng.randrange(3)]
            where = f"{rng.randint(1, 300)}:{rng.randint(1, 40)}"
            out.append(f"  {where:<7} warning  {message.format(name=f'v{f}'):<45} {rule}")
            warnings += 1
        if f == broken:
            out.append("  17:3    error    'useCart' is not defined                      no-undef")
            errors += 1
        out.append("")
    out.append(f"✖ {errors + warnings} problems ({errors} error, {warnings} warnings)")
    out.append("  0 errors and 12 warnings potentially fixable with the `--fix` option.")
    out.append("")
    return "\n".join(out), f"/home/dev/shop/src/components/Widget{broken}.tsx"


def tsc_errors(seed: int, *, errors: int = 100) -> str:
    rng = random.Random(seed)
    codes = (
        ("TS2345", "Argument of type 'string' is not assignable to parameter of type 'number'."),
        ("TS2322", "Type 'undefined' is not assignable to type 'Order'."),
        ("TS7006", "Parameter 'event' implicitly has an 'any' type."),
    )
    out = []
    files = set()
    for k in range(errors):
        code, message = codes[rng.randrange(3)]
        path = f"src/features/feature{k % 23}/index.ts"
        files.add(path)
        out.append(f"{path}({rng.randint(1, 500)},{rng.randint(1, 60)}): error {code}: {message}")
        if code == "TS2322" and rng.random() < 0.5:
            out.append("  Type 'undefined' is not assignable to type '{ id: string; }'.")
    out.append("src/checkout/pay.ts(12,7): error TS2304: Cannot find name 'stripeClient'.")
    out.append(f"Found {errors + 1} errors in {len(files) + 1} files.")
    return "\n".join(out)


def go_test(seed: int, *, packages: int = 24) -> str:
    """``go test -v ./...``: many packages passing, one failing test with its messages."""
    rng = random.Random(seed)
    failing = rng.randrange(packages)
    out = []
    for p in range(packages):
        tests = [f"TestParse{k}" for k in range(8)]
        for test in tests:
            out.append(f"=== RUN   {test}")
            if p == failing and test == "TestParse3":
                out += [
                    '    parse_test.go:57: Parse("2024-13-01") returned no error',
                    "    parse_test.go:58: got month 13, want an error: month out of range",
                    f"--- FAIL: {test} (0.00s)",
                ]
            else:
                out.append(
                    f"    parse_test.go:{rng.randint(10, 90)}: checked {rng.randint(1, 9)} cases"
                )
                out.append(f"--- PASS: {test} (0.00s)")
        if p == failing:
            out += ["FAIL", f"FAIL\texample.com/shop/pkg{p}/dates\t0.0{rng.randint(1, 9)}s"]
        else:
            out += ["PASS", f"ok  \texample.com/shop/pkg{p}/dates\t0.0{rng.randint(1, 9)}s"]
    out.append("FAIL")
    return "\n".join(out)


def maven_surefire(seed: int, *, classes: int = 45) -> str:
    rng = random.Random(seed)
    failing = rng.randrange(classes)
    out = [
        "[INFO] Scanning for projects...",
        "[INFO] ",
        "[INFO] --------------------------< com.acme:shop >---------------------------",
        "[INFO] Building shop 1.4.0-SNAPSHOT",
        "[INFO] --------------------------------[ jar ]---------------------------------",
        "[INFO] --- maven-surefire-plugin:3.2.5:test (default-test) @ shop ---",
        "[INFO] ",
        "[INFO] -------------------------------------------------------",
        "[INFO]  T E S T S",
        "[INFO] -------------------------------------------------------",
    ]
    total = 0
    for c in range(classes):
        name = f"com.acme.shop.service.Service{c}Test"
        run = rng.randint(3, 12)
        total += run
        out.append(f"[INFO] Running {name}")
        if c == failing:
            out += [
                f"[ERROR] Tests run: {run}, Failures: 1, Errors: 0, Skipped: 0, Time elapsed: "
                f"0.21 s <<< FAILURE! -- in {name}",
                f"[ERROR] {name}.refundsPartialOrder -- Time elapsed: 0.02 s <<< FAILURE!",
                "org.opentest4j.AssertionFailedError: expected: <40.00> but was: <45.00>",
                "\tat org.junit.jupiter.api.AssertionFailureBuilder.build("
                "AssertionFailureBuilder.java:151)",
                "\tat org.junit.jupiter.api.AssertEquals.assertEquals(AssertEquals.java:182)",
                f"\tat {name}.refundsPartialOrder(Service{c}Test.java:77)",
                "\tat java.base/java.lang.reflect.Method.invoke(Method.java:580)",
                "\tat java.base/java.util.ArrayList.forEach(ArrayList.java:1596)",
                "",
            ]
        else:
            out.append(
                f"[INFO] Tests run: {run}, Failures: 0, Errors: 0, Skipped: 0, Time elapsed: "
                f"0.{rng.randint(10, 99)} s -- in {name}"
            )
    out += [
        "[INFO] ",
        "[INFO] Results:",
        "[INFO] ",
        "[ERROR] Failures: ",
        f"[ERROR]   Service{failing}Test.refundsPartialOrder:77 expected: <40.00> but was: <45.00>",
        "[INFO] ",
        f"[ERROR] Tests run: {total}, Failures: 1, Errors: 0, Skipped: 0",
        "[INFO] ",
        "[INFO] ------------------------------------------------------------------------",
        "[INFO] BUILD FAILURE",
        "[INFO] ------------------------------------------------------------------------",
        "[INFO] Total time:  14.212 s",
        "[ERROR] Failed to execute goal org.apache.maven.plugins:maven-surefire-plugin:3.2.5:test "
        "(default-test) on project shop: There are test failures.",
        "[ERROR] ",
        "[ERROR] -> [Help 1]",
    ]
    return "\n".join(out)


def unittest_verbose(seed: int, *, tests: int = 260) -> str:
    rng = random.Random(seed)
    failing = rng.randrange(tests)
    out = []
    for k in range(tests):
        name = f"test_rule_{k} (tests.test_pricing.PricingRulesTest.test_rule_{k})"
        out.append(f"{name} ... {'FAIL' if k == failing else 'ok'}")
    out += [
        "",
        "======================================================================",
        f"FAIL: test_rule_{failing} (tests.test_pricing.PricingRulesTest.test_rule_{failing})",
        "----------------------------------------------------------------------",
        "Traceback (most recent call last):",
        f'  File "/app/tests/test_pricing.py", line {100 + failing}, in test_rule_{failing}',
        "    self.assertEqual(apply_rules(cart), Decimal('9.90'))",
        "AssertionError: Decimal('10.90') != Decimal('9.90')",
        "",
        "----------------------------------------------------------------------",
        f"Ran {tests} tests in 0.412s",
        "",
        "FAILED (failures=1)",
    ]
    return "\n".join(out)


def junit_report(seed: int, *, suites: int = 12, cases: int = 25) -> tuple[str, str]:
    """A surefire XML report: one failing testcase; returns the XML and its test id."""
    rng = random.Random(seed)
    failing = (rng.randrange(suites), rng.randrange(cases))
    parts = ['<?xml version="1.0" encoding="UTF-8"?>']
    parts.append(f'<testsuites name="shop" tests="{suites * cases}" failures="1" errors="0">')
    for s in range(suites):
        name = f"com.acme.shop.Suite{s}Test"
        parts.append(
            f'  <testsuite name="{name}" tests="{cases}" failures="{int(s == failing[0])}" '
            f'errors="0" skipped="0" time="{rng.random():.3f}">'
        )
        for c in range(cases):
            head = f'    <testcase name="checksRule{c}" classname="{name}" time="0.00{c % 10}"'
            if (s, c) == failing:
                parts += [
                    head + ">",
                    '      <failure message="expected: &lt;3&gt; but was: &lt;4&gt;" '
                    'type="org.opentest4j.AssertionFailedError">'
                    "org.opentest4j.AssertionFailedError: expected: &lt;3&gt; but was: &lt;4&gt;",
                    "\tat org.junit.jupiter.api.AssertionUtils.fail(AssertionUtils.java:55)",
                    f"\tat {name}.checksRule{c}(Suite{s}Test.java:{40 + c})",
                    "\tat java.base/java.lang.reflect.Method.invoke(Method.java:580)",
                    "</failure>",
                    f"      <system-out>rule {c}: evaluating cart 7 items</system-out>",
                    "    </testcase>",
                ]
            else:
                parts.append(head + "/>")
        parts.append("  </testsuite>")
    parts.append("</testsuites>")
    s, c = failing
    return "\n".join(parts), f"com.acme.shop.Suite{s}Test.checksRule{c}"
