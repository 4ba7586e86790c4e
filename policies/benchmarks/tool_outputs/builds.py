"""Compiler and linter output: tsc, ESLint (stylish), cargo build, Maven, golangci-lint.

Many warnings (or, for tsc, many errors in other files) and one or two errors that break
the build; each tool prints them in its own layout (tsc's ``file(line,col)``, ESLint's
per-file blocks, rustc's ``-->`` locations, Maven's ``[line,col]`` and its recap at the
end). A fact is an error's location and its code or message.
"""

from __future__ import annotations

import random
from functools import partial

from policies.benchmarks.tool_outputs._code import code_line, source_path
from policies.benchmarks.tool_outputs._common import (
    NOUNS,
    SERVICES,
    Unique,
    camel,
    fill,
    num_chars,
    pascal,
    plant,
)
from policies.benchmarks.tool_outputs.case import Case, Fact

__all__ = ["FORMATS", "build"]

FORMATS = ("tsc", "eslint", "cargo", "maven", "golangci_lint")
_CHARS_PER_TOKEN = {"tsc": 3.8, "eslint": 3.5, "cargo": 3.6, "maven": 3.45, "golangci_lint": 3.7}
_FAILED_BUILD = (
    "Why did the build fail?",
    "CI's build step is red. What's the actual error?",
    "The build broke after the dependency bump; find what fails to compile.",
)


def build(rng: random.Random) -> Case:
    fmt = rng.choice(FORMATS)
    size = num_chars(rng, _CHARS_PER_TOKEN[fmt])
    text, arguments, question, facts = _BUILDERS[fmt](rng, size)
    return Case("build_output", fmt, "shell", arguments, question, text, tuple(facts))


def _loc(rng: random.Random) -> tuple[int, int]:
    """A line and column; fixed widths, so no location is a prefix of another."""
    return rng.randint(100, 999), rng.randint(10, 79)


# -- tsc -------------------------------------------------------------------------------------
_TS_ERRORS = (
    ("TS2322", "Type 'string' is not assignable to type 'number'."),
    (
        "TS2345",
        "Argument of type 'string | undefined' is not assignable to parameter of type 'string'.",
    ),
    ("TS2339", "Property '{attr}' does not exist on type '{Type}'."),
    ("TS7006", "Parameter '{attr}' implicitly has an 'any' type."),
    ("TS2532", "Object is possibly 'undefined'."),
    ("TS18048", "'{var}.{attr}' is possibly 'undefined'."),
    ("TS2304", "Cannot find name '{Type}'."),
    ("TS2554", "Expected 2 arguments, but got 1."),
)


def _tsc(rng: random.Random, size: int) -> tuple:
    pretty = rng.random() < 0.5
    paths = Unique()

    def error(path: str) -> tuple[str, str, list[str]]:
        code, message = rng.choice(_TS_ERRORS)
        noun = rng.choice(NOUNS)
        message = message.format(
            attr=rng.choice(("id", "total", "currency", "items")),
            Type=pascal(noun),
            var=camel(noun),
        )
        line, col = _loc(rng)
        if not pretty:
            where = f"{path}({line},{col})"
            return where, code, [f"{where}: error {code}: {message}"]
        where = f"{path}:{line}:{col}"
        source = code_line(rng, "typescript")
        return (
            where,
            code,
            [
                f"{where} - error {code}: {message}",
                "",
                f"{line} {source}",
                " " * (len(str(line)) + col) + "~" * 6,
                "",
            ],
        )

    def file_errors() -> list[tuple[str, str, list[str]]]:
        path = paths(lambda: source_path(rng, "typescript"))
        return [error(path) for _ in range(rng.choice((1, 1, 2, 3, 5)))]

    blocks = fill(file_errors, size, lambda b: sum(len(x) for e in b for x in e[2]))
    asked_path = paths(lambda: source_path(rng, "typescript"))
    target = [error(asked_path)]
    plant(rng, blocks, [target])
    lines = [line for b in blocks for e in b for line in e[2]]
    num_errors = sum(len(b) for b in blocks)
    lines.append(f"Found {num_errors} errors in {len(blocks)} files.")
    if pretty:
        lines += ["", "Errors  Files"]
        for b in blocks:
            first = b[0][0].rsplit(":", 1)[0]  # the table shows file:line, no column
            lines.append(f"{len(b):>6}  {first}")
    where, code, _ = target[0]
    question = rng.choice(
        (
            f"Why doesn't {asked_path} compile?",
            f"tsc reports a type error in {asked_path}; what is it exactly?",
        )
    )
    arguments = {"command": "npx tsc --noEmit -p tsconfig.json" + (" --pretty" if pretty else "")}
    return (
        "\n".join(lines) + "\n",
        arguments,
        question,
        [Fact((where, code), "asked", f"{where}: {code}")],
    )


# -- ESLint ----------------------------------------------------------------------------------
_WARN_RULES = (
    ("'{name}' is defined but never used", "@typescript-eslint/no-unused-vars"),
    (
        "React Hook useEffect has a missing dependency: '{name}'. Either include it or remove the "
        "dependency array",
        "react-hooks/exhaustive-deps",
    ),
    ("Unexpected console statement", "no-console"),
    ("Unexpected any. Specify a different type", "@typescript-eslint/no-explicit-any"),
    ("'{name}' is never reassigned. Use 'const' instead", "prefer-const"),
    ("There should be at least one empty line between import groups", "import/order"),
)
_ERROR_RULES = (
    (
        'React Hook "useEffect" is called conditionally. React Hooks must be called in the exact '
        "same order in every component render",
        "react-hooks/rules-of-hooks",
    ),
    ("'{name}' is not defined", "no-undef"),
    (
        "Promises must be awaited, end with a call to .catch, or end with a call to .then with a "
        "rejection handler",
        "@typescript-eslint/no-floating-promises",
    ),
    ("Unable to resolve path to module './{name}'", "import/no-unresolved"),
    ("Unreachable code", "no-unreachable"),
)


def _eslint(rng: random.Random, size: int) -> tuple:
    app = f"{rng.choice(SERVICES)}-web"
    root = f"/home/runner/work/{app}/{app}"
    paths = Unique()

    def problem(severity: str) -> tuple[int, int, str, str, str]:
        message, rule = rng.choice(_WARN_RULES if severity == "warning" else _ERROR_RULES)
        line, col = _loc(rng)
        return line, col, severity, message.format(name=camel(rng.choice(NOUNS), "data")), rule

    def file_block() -> tuple[str, list[tuple[int, int, str, str, str]]]:
        path = paths(lambda: source_path(rng, "typescript"))
        return path, sorted(problem("warning") for _ in range(rng.randint(1, 8)))

    blocks = fill(file_block, size, lambda b: 90 * len(b[1]) + 60)
    errors = []
    for _ in range(rng.randint(1, 2)):
        path, problems = rng.choice(blocks) if rng.random() < 0.5 else file_block()
        bad = problem("error")
        problems.append(bad)
        problems.sort()
        errors.append((path, bad))
        if (path, problems) not in blocks:
            plant(rng, blocks, [(path, problems)])
    lines = []
    for path, problems in blocks:
        lines += ["", f"{root}/{path}"]
        loc_width = max(len(f"{p[0]}:{p[1]}") for p in problems)
        msg_width = max(len(p[3]) for p in problems)
        for line, col, severity, message, rule in problems:
            lines.append(
                f"  {f'{line}:{col}':>{loc_width}}  {severity:<7}  {message:<{msg_width}}  {rule}"
            )
    num_errors = len(errors)
    num_warnings = sum(len(p) for _, p in blocks) - num_errors
    lines += [
        "",
        f"\u2716 {num_errors + num_warnings} problems ({num_errors} errors, "
        f"{num_warnings} warnings)",
        f"  0 errors and {rng.randint(1, max(1, num_warnings // 4))} warnings potentially "
        "fixable with the `--fix` option.",
        "",
    ]
    facts = [
        Fact((path, f"{bad[0]}:{bad[1]}", bad[4]), "standout", f"{path}:{bad[0]}:{bad[1]} {bad[4]}")
        for path, bad in errors
    ]
    question = rng.choice(
        (
            "Lint is failing in CI; what are the errors?",
            "Can you run the linter and tell me what blocks the merge?",
        )
    )
    return "\n".join(lines), {"command": "npx eslint . --ext .ts,.tsx"}, question, facts


# -- cargo build -----------------------------------------------------------------------------
_RUST_WARNINGS = (
    (
        "unused variable: `{name}`",
        "help: if this is intentional, prefix it with an underscore: `_{name}`",
        "#[warn(unused_variables)]",
    ),
    ("unused import: `crate::{name}`", "help: remove the unused import", "#[warn(unused_imports)]"),
    ("field `{name}` is never read", "", "#[warn(dead_code)]"),
    ("variable does not need to be mutable", "help: remove this `mut`", "#[warn(unused_mut)]"),
)
_RUST_ERRORS = (
    ("E0308", "mismatched types", "expected `u64`, found `i64`"),
    ("E0425", "cannot find value `{name}` in this scope", "not found in this scope"),
    (
        "E0599",
        "no method named `{name}` found for struct `{Type}` in the current scope",
        "method not found in `{Type}`",
    ),
    ("E0382", "borrow of moved value: `{name}`", "value borrowed here after move"),
)


def _cargo(rng: random.Random, size: int) -> tuple:
    crate = rng.choice(("shop", "ledger", "ingest", "pricing"))
    locations = Unique()

    def block(kind: str) -> tuple[str, str, list[str]]:
        path = source_path(rng, "rust")
        line, col = _loc(rng)
        where = locations(lambda: f"{path}:{line}:{col}")
        name = f"{rng.choice(NOUNS)}_{rng.choice(('id', 'total', 'count', 'cfg'))}"
        source = _rust_line(rng, name)
        pad = " " * len(str(line))
        if kind == "warning":
            title, help_, lint = rng.choice(_RUST_WARNINGS)
            head = f"warning: {title.format(name=name)}"
            tail = (
                [f"{pad} |", f"{pad} = note: `{lint}` on by default"] if rng.random() < 0.3 else []
            )
            note = help_.format(name=name)
            return (
                where,
                "",
                [
                    head,
                    f"{pad}--> {where}",
                    f"{pad} |",
                    f"{line} |     {source}",
                    f"{pad} |     {'^' * 6} {note}".rstrip(),
                    *tail,
                    "",
                ],
            )
        code, title, label = rng.choice(_RUST_ERRORS)
        title = title.format(name=name, Type=pascal(rng.choice(NOUNS)))
        label = label.format(Type=pascal(rng.choice(NOUNS)))
        return (
            where,
            code,
            [
                f"error[{code}]: {title}",
                f"{pad}--> {where}",
                f"{pad} |",
                f"{line} |     {source}",
                f"{pad} |     {'^' * 8} {label}",
                "",
                f"For more information about this error, try `rustc --explain {code}`.",
                "",
            ],
        )

    blocks = fill(lambda: block("warning"), size, lambda b: sum(len(x) + 1 for x in b[2]))
    errors = [block("error") for _ in range(rng.randint(1, 2))]
    plant(rng, blocks, errors)
    lines = [f"   Compiling {crate} v0.{rng.randint(1, 9)}.0 (/app)"]
    lines += [line for b in blocks for line in b[2]]
    lines += [
        f"warning: `{crate}` (lib) generated {len(blocks) - len(errors)} warnings",
        f"error: could not compile `{crate}` (lib) due to {len(errors)} previous "
        f"error{'s' if len(errors) > 1 else ''}; {len(blocks) - len(errors)} warnings emitted",
    ]
    facts = [Fact((code, where), "standout", f"{code} at {where}") for where, code, _ in errors]
    question = rng.choice(_FAILED_BUILD)
    return "\n".join(lines) + "\n", {"command": "cargo build --release"}, question, facts


def _rust_line(rng: random.Random, name: str) -> str:
    other = rng.choice(NOUNS)
    return rng.choice(
        (
            f"let {name} = {other}.{rng.choice(('total', 'len', 'id'))}();",
            f"let mut {name} = Vec::with_capacity({other}s.len());",
            f"use crate::{name};",
            f"{name}: {pascal(other)},",
            f"let {name}: u64 = compute_{other}(&items)?;",
            f"self.{name}.insert({other}.id, {other}.clone());",
        )
    )


# -- Maven -----------------------------------------------------------------------------------
_JAVA_WARNINGS = (
    "{method}() in com.acme.{svc}.{Type} has been deprecated",
    "unchecked call to add(E) as a member of the raw type java.util.List",
    "[removal] finalize() in java.lang.Object has been deprecated and marked for removal",
    "non-varargs call of varargs method with inexact argument type for last parameter;",
    "unchecked conversion",
)


def _maven(rng: random.Random, size: int) -> tuple:
    base = "/home/runner/work/shop/shop"
    modules = [f"{svc}-service" for svc in rng.sample(SERVICES, 8)]
    locations = Unique()

    def java_path(svc: str) -> str:
        return (
            f"{base}/{svc}/src/main/java/com/acme/{svc.split('-')[0]}/"
            f"{pascal(rng.choice(NOUNS))}{rng.choice(('Service', 'Controller', 'Repository'))}.java"
        )

    def warning(svc: str) -> str:
        line, col = _loc(rng)
        path = java_path(svc)
        text = rng.choice(_JAVA_WARNINGS).format(
            method=camel("get", rng.choice(NOUNS)),
            svc=svc.split("-")[0],
            Type=pascal(rng.choice(NOUNS)),
        )
        return f"[WARNING] {path}:[{line},{col}] {text}"

    per_module = max(1, size // (len(modules) * 170))
    bodies = {
        m: [warning(m) for _ in range(rng.randint(per_module // 2, per_module * 3 // 2 + 1))]
        for m in modules
    }
    failing = rng.sample(modules, rng.randint(1, 2))
    errors = []
    for module in failing:
        path = java_path(module)
        line, col = _loc(rng)
        name = path.rsplit("/", 1)[1]
        where = locations(partial(str, f"{name}:[{line},{col}]"))  # one value, drawn once
        symbol = f"{camel(rng.choice(('total', 'find', 'to')), rng.choice(NOUNS))}()"
        errors.append((module, f"{path}:[{line},{col}] cannot find symbol", where, symbol))
    lines = [
        "[INFO] Scanning for projects...",
        "[INFO] " + "-" * 72,
        "[INFO] Reactor Build Order:",
        "[INFO] ",
        *(f"[INFO] {m:<60} [jar]" for m in modules),
        "[INFO] ",
    ]
    for module in modules:
        lines += [
            f"[INFO] --- compiler:3.11.0:compile (default-compile) @ {module} ---",
            "[INFO] Changes detected - recompiling the module! :source",
            f"[INFO] Compiling {rng.randint(40, 600)} source files with javac [debug release 17] "
            "to target/classes",
        ]
        body = list(bodies[module])
        mine = [e for e in errors if e[0] == module]
        lines += body
        if mine:
            lines += [
                "[INFO] -------------------------------------------------------------",
                "[ERROR] COMPILATION ERROR : ",
                "[INFO] -------------------------------------------------------------",
            ]
            for _, message, _, symbol in mine:
                lines += [
                    f"[ERROR] {message}",
                    f"  symbol:   method {symbol}",
                    f"  location: variable {rng.choice(NOUNS)} of type com.acme."
                    f"{module.split('-')[0]}.{pascal(rng.choice(NOUNS))}",
                ]
            lines += [
                f"[INFO] {len(mine)} error{'s' if len(mine) > 1 else ''}",
                "[INFO] -------------------------------------------------------------",
            ]
    lines += ["[INFO] " + "-" * 72, "[INFO] Reactor Summary for shop 1.4.0-SNAPSHOT:", "[INFO] "]
    for module in modules:
        state = "FAILURE" if module in failing else "SUCCESS"
        lines.append(f"[INFO] {module + ' ':.<53} {state} [{rng.uniform(0.3, 40):7.3f} s]")
    lines += ["[INFO] " + "-" * 72, "[INFO] BUILD FAILURE", "[INFO] " + "-" * 72]
    for module, message, _, _ in errors:
        lines += [
            f"[ERROR] Failed to execute goal org.apache.maven.plugins:maven-compiler-plugin:"
            f"3.11.0:compile (default-compile) on project {module}: Compilation failure",
            f"[ERROR] {message}",
        ]
    lines += [
        "[ERROR] -> [Help 1]",
        "[ERROR] ",
        "[ERROR] Re-run Maven using the -X switch to enable full debug logging.",
    ]
    facts = [
        Fact((where, "cannot find symbol"), "standout", f"{where} cannot find {symbol}")
        for _, _, where, symbol in errors
    ]
    question = rng.choice(_FAILED_BUILD)
    return "\n".join(lines) + "\n", {"command": "mvn -B -fae package -DskipTests"}, question, facts


# -- golangci-lint ---------------------------------------------------------------------------
_GO_FINDINGS = (
    ("Error return value of `{call}` is not checked", "errcheck"),
    ("ineffectual assignment to err", "ineffassign"),
    ("SA1019: {call} has been deprecated since Go 1.16: use os.ReadFile instead", "staticcheck"),
    ("S1002: should omit comparison to bool constant, can be simplified to `ok`", "gosimple"),
    ("func `{name}` is unused", "unused"),
    ("exported function {Name} should have comment or be unexported", "revive"),
    ("printf: fmt.Sprintf format %d has arg {name} of wrong type string", "govet"),
)
_GO_ERRORS = (
    "undefined: sqlx.NamedExecContext",
    "cannot use total (variable of type int64) as int value in argument to format",
    "{name} declared and not used",
    "too many arguments in call to s.store.Save",
)


def _golangci(rng: random.Random, size: int) -> tuple:
    locations = Unique()

    def finding(error: bool = False) -> tuple[str, str, list[str]]:
        path = source_path(rng, "go")
        line, col = _loc(rng)
        where = locations(lambda: f"{path}:{line}:{col}")
        name = camel(rng.choice(("load", "save", "parse")), rng.choice(NOUNS))
        if error:
            message, linter = rng.choice(_GO_ERRORS).format(name=name), "typecheck"
        else:
            message, linter = rng.choice(_GO_FINDINGS)
            message = message.format(
                call="ioutil.ReadFile" if "SA" in message else f"s.{name}",
                name=name,
                Name=name[0].upper() + name[1:],
            )
        source = code_line(rng, "go")
        return (
            where,
            message,
            [f"{where}: {message} ({linter})", source, "\t" * source.count("\t") + " " * 2 + "^"],
        )

    findings = fill(finding, size, lambda f: sum(len(x) + 1 for x in f[2]))
    errors = [finding(error=True) for _ in range(rng.randint(1, 2))]
    plant(rng, findings, errors)
    lines = [line for f in findings for line in f[2]]
    facts = [
        Fact((where, message), "standout", f"{where}: {message}") for where, message, _ in errors
    ]
    question = rng.choice(_FAILED_BUILD)
    return "\n".join(lines) + "\n", {"command": "golangci-lint run ./..."}, question, facts


_BUILDERS = {
    "tsc": _tsc,
    "eslint": _eslint,
    "cargo": _cargo,
    "maven": _maven,
    "golangci_lint": _golangci,
}
