"""Test-runner logs: ``pytest -v`` (warnings, failures with their tracebacks and captured
logs, a short summary) and ``go test -v ./...``. A verdict line is a summary, never an
error line.
"""

from __future__ import annotations

import random

from policies.benchmarks.corpus._common import (
    NOUNS,
    PACKAGES,
    PARAMS,
    PROJECTS,
    VERBS,
    identifier,
)
from policies.benchmarks.corpus._writer import Call, Writer

__all__ = ["generate"]

_FAILURES = (
    ("ConfigError", "{project}.errors.ConfigError: missing key: port"),
    ("KeyError", "KeyError: 'customer_id'"),
    ("ConnectError", "httpx.ConnectError: [Errno 111] Connection refused"),
    (
        "IntegrityError",
        "sqlalchemy.exc.IntegrityError: (psycopg.errors.UniqueViolation) "
        'duplicate key value violates unique constraint "orders_external_id_key"',
    ),
    ("TimeoutError", "TimeoutError: lease not granted within 5.0 s (queue depth 14)"),
    (
        "ValidationError",
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for Invoice",
    ),
)


_PYTEST_WARNING = """\
{node}
!  /home/dev/{project}/src/{where}: DeprecationWarning: \
datetime.datetime.utcnow() is deprecated and scheduled for removal in a future version. Use \
timezone-aware objects to represent datetimes in UTC: datetime.datetime.now(datetime.UTC).
    stamp = datetime.utcnow()
"""
_PYTEST_LOG = """\
------------------------------ Captured log call -------------------------------
!WARNING  {project}.pool:pool.py:61 connection {connection} unhealthy, retrying in 0.5 s
!ERROR    {project}.client:client.py:88 giving up after 3 attempts"""
_PYTEST_FAILURE = """\
{title:_^80}

    def {function}(client, tmp_path):
        payload = make_{noun}(tmp_path, status="pending")
        result = client.{verb}(payload)
>       assert result.status_code == 200

!{path}:{line}: in {function}
    return self._send(request, timeout={timeout})
_ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _

    def _send(self, request, timeout):
        with self._pool.connection() as conn:
>           return conn.execute(request)
!E           {exception}

!{source}:{source_line}: {kind}"""


def _pytest_log(rng: random.Random, out: Writer, tokens: int) -> Call:
    project = rng.choice(PROJECTS)
    num_tests = max(30, (int(tokens * 3.9) - 3_000) // 84)
    failing = set(rng.sample(range(num_tests), rng.choice((0, 1, 1, 2, 2, 3))))
    out.add(f"{' test session starts ':=^80}\nplatform linux -- Python 3.11.9, pytest-8.3.2")
    out.add(f"rootdir: /home/dev/{project}\ncollecting ... collected {num_tests} items\n")
    nodes, failed, counts = [], [], {"PASSED": 0, "SKIPPED": 0, "XFAIL": 0}
    module = ""
    for i in range(num_tests):
        if i == 0 or rng.random() < 0.08:
            module = f"tests/{rng.choice(PACKAGES)}/test_{rng.choice(NOUNS)}s.py"
        param = f"[{rng.choice(PARAMS)}]" if rng.random() < 0.3 else ""
        nodes.append(f"{module}::test_{identifier(rng)}{param}")
        roll = rng.random()
        outcome = "SKIPPED" if roll < 0.02 else "XFAIL" if roll < 0.025 else "PASSED"
        if i in failing:
            outcome = "FAILED"
            failed.append(nodes[-1])
        else:
            counts[outcome] += 1
        line = f"{nodes[-1]} {outcome}"
        out.add(f"{line:<73}[{(i + 1) * 100 // num_tests:3d}%]", error=outcome == "FAILED")
    out.add()
    num_warnings = rng.randint(0, 3)
    if num_warnings:
        out.add(f"{' warnings summary ':=^80}")
        for _ in range(num_warnings):
            where = f"{project}/{rng.choice(PACKAGES)}/clock.py:{rng.randint(10, 300)}"
            out.add_marked(_PYTEST_WARNING, node=rng.choice(nodes), project=project, where=where)
        out.add("-- Docs: https://docs.pytest.org/en/stable/how-to/capture-warnings.html")
    if failed:
        out.add(f"{' FAILURES ':=^80}")
    summaries = []
    for node in failed:
        path, test = node.split("::")
        function = test.split("[")[0]
        kind, exception = rng.choice(_FAILURES)
        exception = exception.format(project=project)
        source = f"src/{project}/{rng.choice(PACKAGES)}/{rng.choice(NOUNS)}.py"
        fields: dict[str, object] = {"title": f" {test} ", "path": path, "kind": kind}
        fields |= {"noun": rng.choice(NOUNS), "verb": rng.choice(VERBS), "function": function}
        fields |= {"line": rng.randint(20, 400), "timeout": rng.randint(1, 30)}
        fields |= {"exception": exception, "source": source, "source_line": rng.randint(20, 400)}
        out.add_marked(_PYTEST_FAILURE, **fields)
        if rng.random() < 0.6:
            out.add_marked(_PYTEST_LOG, project=project, connection=rng.randint(1, 40))
        summaries.append(f"FAILED {node} - {exception}")
    if failed:
        out.add(f"{' short test summary info ':=^80}")
        out.add("\n".join(summaries), error=True)
    parts = [f"{len(failed)} failed"] if failed else []
    parts += [f"{n} {outcome.lower()}" for outcome, n in counts.items() if n]
    parts += [f"{num_warnings} warnings"] if num_warnings else []
    out.add(f"{' ' + ', '.join(parts) + f' in {rng.uniform(5, 300):.2f}s ':=^80}")
    return "pytest", "bash", {"command": f"cd /home/dev/{project} && python -m pytest -v"}


def _go_test_log(rng: random.Random, out: Writer, tokens: int) -> Call:
    project, chars = rng.choice(PROJECTS), int(tokens * 3.6)
    any_failed = False
    while out.chars < chars:
        package = f"github.com/acme/{project}/internal/{rng.choice(PACKAGES)}"
        failed = False
        for _ in range(rng.randint(4, 25)):
            test = f"Test{rng.choice(VERBS).title()}{rng.choice(NOUNS).title()}"
            file = f"{rng.choice(NOUNS)}_test.go"
            fails = rng.random() < 0.012
            out.add(f"=== RUN   {test}")
            for _ in range(rng.randint(0, 2)):
                seeded = f"seeded {rng.randint(2, 500)} {rng.choice(NOUNS)}s"
                out.add(f"    {file}:{rng.randint(20, 300)}: {seeded} in {rng.randint(1, 90)}ms")
            subtests = [f"{test}/{identifier(rng)}" for _ in range(rng.randint(0, 4))]
            for sub in subtests:
                out.add(f"=== RUN   {sub}")
            if fails:  # go test prints a failure's messages before its verdict
                status = rng.choice(("failed", "pending"))
                got = f"{rng.choice(NOUNS)} {rng.randint(1000, 9999)}: got status {status}"
                host = f"10.0.{rng.randint(0, 9)}.{rng.randint(2, 250)}:5432"
                refused = f"dial tcp {host}: connect: connection refused"
                out.add(f"    {file}:{rng.randint(20, 300)}: {got}, want settled", error=True)
                out.add(f"    {file}:{rng.randint(20, 300)}: {refused}", error=True)
            verdict = "FAIL" if fails else "PASS"
            out.add(f"--- {verdict}: {test} ({rng.uniform(0, 2):.2f}s)", error=fails)
            for sub in subtests:
                out.add(f"    --- PASS: {sub} ({rng.uniform(0, 0.1):.2f}s)")
            failed |= fails
        if failed:
            out.add(f"FAIL\nFAIL\t{package}\t{rng.uniform(0.01, 9):.3f}s", error=True)
        else:
            out.add(f"PASS\nok  \t{package}\t{rng.uniform(0.01, 9):.3f}s")
        any_failed |= failed
    out.add("FAIL" if any_failed else "PASS", error=any_failed)
    return "go_test", "bash", {"command": "go test -v ./..."}


def generate(rng: random.Random, out: Writer, tokens: int, variant: int) -> Call:
    return (_go_test_log if variant % 3 == 1 else _pytest_log)(rng, out, tokens)
