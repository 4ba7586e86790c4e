"""Stack traces inside the log around them: Python tracebacks, Java with ``Caused by``, Node.js
errors, Go panics (sometimes with every goroutine dumped).

Two facts per trace: the exception (for Java, the root cause) as type and a phrase of its
message, and the innermost frame in the service's own code (library and runtime frames
around it), as ``file:line`` the way the runtime prints it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import datetime

from policies.benchmarks.tool_outputs._common import (
    NOUNS,
    SERVICES,
    VERBS,
    Clock,
    camel,
    fill,
    hexid,
    iso_ms,
    log_ms,
    num_chars,
    pascal,
    plant,
)
from policies.benchmarks.tool_outputs.case import Case, Fact

__all__ = ["FORMATS", "build"]

FORMATS = ("python", "java", "node", "go_panic")
_CHARS_PER_TOKEN = {"python": 2.0, "java": 2.4, "node": 1.45, "go_panic": 1.85}
_Trace = tuple[list[str], tuple[str, ...], tuple[str, ...], str]  # lines, exception, frame, what


def build(rng: random.Random) -> Case:
    fmt = rng.choice(FORMATS)
    size = num_chars(rng, _CHARS_PER_TOKEN[fmt])
    service = rng.choice(SERVICES)
    clock = Clock(rng, step_s=(0.0, 1.5))
    routine, trace = _BUILDERS[fmt]
    lines: list[str | list[str]] = fill(lambda: routine(rng, service), size, len)
    block, exception, frame, what = trace(rng, service)
    plant(rng, lines, [block])
    out: list[str] = []
    for line in lines:  # stamped in order, once planted
        stamp = clock.tick()
        if isinstance(line, list):
            out += [each.replace("{t}", _stamp(fmt, stamp)) for each in line]
        else:
            out.append(line.replace("{t}", _stamp(fmt, stamp)))
    where = rng.random() < 0.4
    question = rng.choice(
        (
            f"{service} crashed; what's the error and where in our code does it come from?",
            f"Find where in our code the {service} failure starts.",
        )
        if where
        else (
            f"Why did {service} fail?",
            f"The {what} failed again last night. What's the error?",
        )
    )
    facts = (
        Fact(exception, "standout", f"the exception: {' '.join(exception)}"),
        Fact(frame, "asked" if where else "standout", f"innermost own frame: {' '.join(frame)}"),
    )
    arguments = {
        "command": rng.choice(
            (
                f"kubectl logs deploy/{service} -n prod --previous",
                f"docker logs --tail 5000 {service}",
                f"tail -n 5000 /var/log/{service}/{service}.log",
            )
        )
    }
    return Case("stack_trace", fmt, "shell", arguments, question, "\n".join(out) + "\n", facts)


def _stamp(fmt: str, t: datetime) -> str:
    if fmt == "python":
        return log_ms(t)
    if fmt == "java":
        return log_ms(t, ".")
    return iso_ms(t)


def _own_frames(rng: random.Random, service: str, n: int) -> list[tuple[str, str, int]]:
    """``n`` distinct (module, function, line) of the service's own code, outermost first."""
    frames: list[tuple[str, str, int]] = []
    used: set[tuple[str, int]] = set()
    while len(frames) < n:
        module = rng.choice(("tasks", "export", "invoices", "handlers", "service", "store", "sync"))
        line = rng.randint(100, 999)  # three digits: no line number is a prefix of another
        if (module, line) not in used:
            used.add((module, line))
            frames.append((module, f"{rng.choice(VERBS)}_{rng.choice(NOUNS)}", line))
    return frames


# -- Python ----------------------------------------------------------------------------------
_PY_ERRORS = (
    ("ZeroDivisionError", "division by zero", "division by zero", ()),
    ("KeyError", "'fx_rate'", "'fx_rate'", ()),
    (
        "ValueError",
        "invalid literal for int() with base 10: 'N/A'",
        "invalid literal for int() with base 10",
        (),
    ),
    (
        "AttributeError",
        "'NoneType' object has no attribute 'currency'",
        "object has no attribute 'currency'",
        (),
    ),
    (
        "json.decoder.JSONDecodeError",
        "Expecting value: line 1 column 1 (char 0)",
        "Expecting value: line 1 column 1",
        (
            (
                "/usr/local/lib/python3.11/json/__init__.py",
                346,
                "loads",
                "return _default_decoder.decode(s)",
            ),
            (
                "/usr/local/lib/python3.11/json/decoder.py",
                355,
                "raw_decode",
                'raise JSONDecodeError("Expecting value", s, err.value) from None',
            ),
        ),
    ),
    (
        "psycopg2.errors.UniqueViolation",
        'duplicate key value violates unique constraint "invoices_pkey"\nDETAIL:  Key (id)=(88213) '
        "already exists.",
        "duplicate key value violates unique constraint",
        (
            (
                "/app/.venv/lib/python3.11/site-packages/sqlalchemy/engine/default.py",
                924,
                "do_execute",
                "cursor.execute(statement, parameters)",
            ),
        ),
    ),
)


def _py_routine(rng: random.Random, service: str) -> str:
    noun = rng.choice(NOUNS)
    return rng.choice(
        (
            f"{{t}} INFO [{service}.tasks] processed {rng.randint(1, 900)} {noun}s in "
            f"{rng.uniform(0.1, 9):.2f}s",
            f"{{t}} INFO [{service}.api] GET /api/{noun}s/{rng.randint(1, 9_999)} 200",
            f"{{t}} DEBUG [{service}.db] pool checkout took {rng.randint(0, 40)}ms",
            f"{{t}} INFO [celery.worker.strategy] Task {service}.tasks.sync_{noun}s"
            f"[{hexid(rng, 8)}-{hexid(rng, 4)}] received",
            f"{{t}} WARNING [{service}.client] retrying {noun} fetch after "
            f"{rng.choice(('ReadTimeout', 'ConnectTimeout'))} (attempt 1/3)",
        )
    )


def _py_trace(rng: random.Random, service: str) -> _Trace:
    kind, message, phrase, lib = rng.choice(_PY_ERRORS)
    own = _own_frames(rng, service, rng.randint(2, 5))
    job = own[0][1]
    lines = [
        f"{{t}} ERROR [{service}.worker] Unhandled exception in job {job}",
        "Traceback (most recent call last):",
        '  File "/app/.venv/lib/python3.11/site-packages/celery/app/trace.py", line 477, in '
        "trace_task",
        "    R = retval = fun(*args, **kwargs)",
    ]
    for module, function, line in own:
        lines += [
            f'  File "/app/{service}/{module}.py", line {line}, in {function}',
            f"    {camel(rng.choice(NOUNS))} = {rng.choice(VERBS)}_{rng.choice(NOUNS)}("
            f"{rng.choice(NOUNS)})",
        ]
    for path, line, function, source in lib:
        lines += [f'  File "{path}", line {line}, in {function}', f"    {source}"]
    lines += f"{kind}: {message}".split("\n")
    module, _, line = own[-1]
    short = kind.rsplit(".", 1)[-1]
    return lines, (short, phrase), (f"{service}/{module}.py", f"line {line}"), f"{job} job"


# -- Java ------------------------------------------------------------------------------------
_JAVA_CAUSES = (
    ("java.lang.IllegalStateException", "Invoice {id} has no currency", "has no currency", ()),
    (
        "java.lang.NullPointerException",
        'Cannot invoke "com.acme.billing.Account.getCurrency()" because "account" is null',
        "Account.getCurrency()",
        (),
    ),
    (
        "java.sql.SQLTransientConnectionException",
        "HikariPool-1 - Connection is not available, request timed out after 30000ms.",
        "Connection is not available",
        (
            "com.zaxxer.hikari.pool.HikariPool.createTimeoutException(HikariPool.java:696)",
            "com.zaxxer.hikari.pool.HikariPool.getConnection(HikariPool.java:197)",
            "com.zaxxer.hikari.HikariDataSource.getConnection(HikariDataSource.java:100)",
        ),
    ),
    (
        "java.lang.NumberFormatException",
        'For input string: "N/A"',
        "For input string",
        (
            "java.base/java.lang.NumberFormatException.forInputString(NumberFormatException.java:67)",
            "java.base/java.lang.Long.parseLong(Long.java:711)",
        ),
    ),
)
_SPRING_FRAMES = (
    "org.springframework.scheduling.support.DelegatingErrorHandlingRunnable.run("
    "DelegatingErrorHandlingRunnable.java:54)",
    "java.base/java.util.concurrent.Executors$RunnableAdapter.call(Executors.java:572)",
    "java.base/java.util.concurrent.FutureTask.runAndReset(FutureTask.java:358)",
    "java.base/java.util.concurrent.ThreadPoolExecutor.runWorker(ThreadPoolExecutor.java:1144)",
    "java.base/java.util.concurrent.ThreadPoolExecutor$Worker.run(ThreadPoolExecutor.java:642)",
    "java.base/java.lang.Thread.run(Thread.java:1583)",
)


def _java_routine(rng: random.Random, service: str) -> str:
    noun = rng.choice(NOUNS)
    thread = rng.choice(("scheduling-1", "nio-8080-exec-3", "nio-8080-exec-7", "main"))
    return rng.choice(
        (
            f"{{t}}  INFO 1 --- [{thread:>15}] c.a.{service[0]}.{pascal(noun)}Controller   : GET "
            f"/api/{noun}s/{rng.randint(1, 9_999)} -> 200 ({rng.randint(2, 300)} ms)",
            f"{{t}}  INFO 1 --- [{thread:>15}] c.a.{service[0]}.ExportJob            : exported "
            f"{rng.randint(1, 900)} {noun}s",
            f"{{t}} DEBUG 1 --- [{thread:>15}] o.s.jdbc.core.JdbcTemplate             : Executing "
            f"prepared SQL statement [select * from {noun}s where id = ?]",
            f"{{t}}  WARN 1 --- [{thread:>15}] com.zaxxer.hikari.pool.HikariPool        : "
            "HikariPool-1 - Thread starvation or clock leap detected (housekeeper "
            f"delta={rng.randint(60, 90)}s).",
        )
    )


def _java_trace(rng: random.Random, service: str) -> _Trace:
    kind, message, phrase, lib = rng.choice(_JAVA_CAUSES)
    message = message.format(id=f"inv_{rng.randint(10_000, 99_999)}")
    package = f"com.acme.{service}"
    own = _own_frames(rng, service, rng.randint(2, 4))
    classes = {m: f"{pascal(m)}{rng.choice(('Service', 'Job', 'Repository'))}" for m, _, _ in own}
    batch = f"{rng.randint(2023, 2024)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    top_module, top_function, top_line = own[0]
    lines = [
        "{t} ERROR 1 --- [   scheduling-1] o.s.s.s.TaskUtils$LoggingErrorHandler    : "
        "Unexpected error occurred in scheduled task",
        f"{package}.ExportFailedException: export of batch {batch} failed",
        f"\tat {package}.{classes[top_module]}.{camel(top_function)}({classes[top_module]}.java:"
        f"{top_line + 3})",
        *(f"\tat {frame}" for frame in _SPRING_FRAMES),
        f"Caused by: {kind}: {message}",
        *(f"\tat {frame}" for frame in lib),
    ]
    for module, function, line in reversed(own):  # innermost first
        lines.append(
            f"\tat {package}.{classes[module]}.{camel(function)}({classes[module]}.java:{line})"
        )
    lines.append(f"\t... {len(_SPRING_FRAMES)} common frames omitted")
    module, _, line = own[-1]
    short = kind.rsplit(".", 1)[1]
    return lines, (short, phrase), (f"{classes[module]}.java:{line}",), "scheduled export"


# -- Node.js ---------------------------------------------------------------------------------
_NODE_ERRORS = (
    (
        "TypeError",
        "Cannot read properties of undefined (reading 'currency')",
        "Cannot read properties of undefined",
        (),
    ),
    (
        "TypeError",
        "items.map is not a function",
        "items.map is not a function",
        ("Array.map (<anonymous>)",),
    ),
    ("RangeError", "Invalid time value", "Invalid time value", ("Date.toISOString (<anonymous>)",)),
    (
        "SyntaxError",
        "Unexpected token '<', \"<!DOCTYPE \"... is not valid JSON",
        "is not valid JSON",
        ("JSON.parse (<anonymous>)",),
    ),
    (
        "Error",
        "connect ECONNREFUSED 10.0.4.17:5432",
        "connect ECONNREFUSED 10.0.4.17:5432",
        ("TCPConnectWrap.afterConnect [as oncomplete] (node:net:1605:16)",),
    ),
)


def _node_routine(rng: random.Random, service: str) -> str:
    noun = rng.choice(NOUNS)
    return rng.choice(
        (
            f"{{t}} info: GET /api/{noun}s/{rng.randint(1, 9_999)} 200 {rng.randint(1, 300)}ms",
            f"{{t}} info: POST /api/{noun}s 201 {rng.randint(5, 500)}ms",
            f"{{t}} debug: cache set {noun}:{rng.randint(1, 9_999)} ttl=300",
            f"{{t}} warn: slow handler GET /api/{noun}s took {rng.randint(1_000, 2_500)}ms",
        )
    )


def _node_trace(rng: random.Random, service: str) -> _Trace:
    kind, message, phrase, lib = rng.choice(_NODE_ERRORS)
    own = _own_frames(rng, service, rng.randint(2, 4))
    cols = [rng.randint(3, 40) for _ in own]
    route = f"/api/{rng.choice(NOUNS)}s/:id"
    lines = [f"{{t}} error: Unhandled rejection in {route}", f"{kind}: {message}"]
    lines += [f"    at {frame}" for frame in lib]
    for (module, function, line), col in zip(reversed(own), reversed(cols), strict=True):
        lines.append(f"    at {camel(function)} (/app/src/{service}/{module}.js:{line}:{col})")
    lines += [
        "    at async Layer.handle [as handle_request] (/app/node_modules/express/lib/router/"
        "layer.js:95:5)",
        "    at async next (/app/node_modules/express/lib/router/route.js:149:13)",
    ]
    module, _, line = own[-1]
    return (
        lines,
        (kind, phrase),
        (f"src/{service}/{module}.js:{line}:{cols[-1]}",),
        f"{route} endpoint",
    )


# -- Go panic --------------------------------------------------------------------------------
_GO_PANICS = (
    "runtime error: invalid memory address or nil pointer dereference",
    "assignment to entry in nil map",
    "runtime error: index out of range [5] with length 5",
    "runtime error: slice bounds out of range [:12] with capacity 8",
)


def _go_routine(rng: random.Random, service: str) -> str:
    noun = rng.choice(NOUNS)
    return rng.choice(
        (
            f'time={{t}} level=INFO msg="request served" path=/api/{noun}s/{rng.randint(1, 9_999)} '
            f"status=200 dur={rng.randint(1, 300)}ms",
            f'time={{t}} level=INFO msg="job done" job=sync-{noun}s items={rng.randint(0, 900)}',
            f'time={{t}} level=DEBUG msg="cache miss" key={noun}:{rng.randint(1, 9_999)}',
            f'time={{t}} level=WARN msg="retrying" op=fetch-{noun} attempt=1 err="i/o timeout"',
        )
    )


def _go_trace(rng: random.Random, service: str) -> _Trace:
    message = rng.choice(_GO_PANICS)
    module = f"github.com/acme/{service}"
    own = _own_frames(rng, service, rng.randint(2, 4))

    def goroutine(number: int, state: str, frames: list[tuple[str, str, int]]) -> list[str]:
        out = [f"goroutine {number} [{state}]:"]
        for mod, function, line in reversed(frames):
            out += [
                f"{module}/internal/{mod}.(*{pascal(mod)}).{pascal(function)}("
                f"0xc000{hexid(rng, 6)}, {{0x{hexid(rng, 6)}, 0xc000{hexid(rng, 6)}}})",
                f"\t/app/internal/{mod}/{mod}.go:{line} +0x{hexid(rng, 3)}",
            ]
        out += [
            f"created by {module}/internal/jobs.(*Pool).Start in goroutine 1",
            f"\t/app/internal/jobs/pool.go:{rng.randint(30, 90)} +0x{hexid(rng, 3)}",
            "",
        ]
        return out

    lines = [f"panic: {message}"]
    if "nil pointer" in message:
        lines.append(
            f"[signal SIGSEGV: segmentation violation code=0x1 addr=0x18 pc=0x{hexid(rng, 6)}]"
        )
    lines += ["", *goroutine(rng.randint(100, 9_000), "running", own)]
    if rng.random() < 0.5:  # GOTRACEBACK=all: every other goroutine too
        for _ in range(rng.randint(3, 12)):
            others = [
                f
                for f in _own_frames(rng, service, rng.randint(1, 3))
                if (f[0], f[2]) not in {(o[0], o[2]) for o in own}
            ]
            lines += goroutine(
                rng.randint(2, 9_000),
                rng.choice(("IO wait", "select", "chan receive", "semacquire")),
                others,
            )
    lines += [
        "exit status 2",
        f'time={{t}} level=INFO msg="starting {service}" version=1.{rng.randint(0, 40)}.'
        f"{rng.randint(0, 9)} addr=:8080",
    ]
    mod, _, line = own[-1]
    phrase = message.removeprefix("runtime error: ")
    return lines, (phrase,), (f"internal/{mod}/{mod}.go:{line}",), f"{service} worker"


_BUILDERS: dict[str, tuple[Callable[[random.Random, str], str], Callable[..., _Trace]]] = {
    "python": (_py_routine, _py_trace),
    "java": (_java_routine, _java_trace),
    "node": (_node_routine, _node_trace),
    "go_panic": (_go_routine, _go_trace),
}
