"""A deterministic corpus of realistic agent tool outputs, with ground-truth error labels.

``build_corpus(seed=0, num_documents=50)`` returns documents of five categories in turn:
test-runner logs (``pytest -v``, ``go test -v``: failures, tracebacks, warnings), JSON API
responses with long arrays (a batch job's results, a Kubernetes pod list, an issue list;
indented as ``jq`` prints them, or compact), directory listings (``find``, ``ls -la``),
service logs with Python and Java stack traces, and web pages as text (an issue
thread, documentation, an article). Each category's sizes are stratified log-uniformly
over about 2,000-40,000 tokens (cl100k; 7,000-180,000 characters), like real tool outputs.

The builder labels each error, warning and traceback line as it writes it
(``Document.error_lines``; in templates, a line marked "!"), so that a benchmark judges a
summarizer by this ground truth and never by the summarizer's own patterns. Blank lines
are never labelled, and a verdict (``3 failed, 69 passed``) is a summary, not an error
line. The same seed always gives the same corpus.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType

__all__ = ["MAX_TOKENS", "MIN_TOKENS", "Category", "Document", "build_corpus"]

MIN_TOKENS = 2_000
MAX_TOKENS = 40_000


class Category(Enum):
    TEST_LOG = "test_log"
    JSON_API = "json_api"
    DIRECTORY_LISTING = "directory_listing"
    STACK_TRACE = "stack_trace"
    WEB_PAGE = "web_page"


@dataclass(frozen=True, slots=True)
class Document:
    """One tool output, the call that produced it, and which of its lines are errors."""

    name: str  # category, stratum and flavour: "test_log-03-pytest"
    category: Category
    tool_name: str
    arguments: Mapping[str, str]
    text: str
    error_lines: tuple[int, ...]  # indexes into text.split("\n"), ascending

    @property
    def error_texts(self) -> tuple[str, ...]:
        lines = self.text.split("\n")
        return tuple(lines[i] for i in self.error_lines)


def build_corpus(*, seed: int = 0, num_documents: int = 50) -> tuple[Document, ...]:
    """``num_documents`` documents, the categories in turn."""
    if num_documents < 0:
        raise ValueError(f"num_documents must be 0 or more, got {num_documents}")
    categories = list(Category)
    per_category = math.ceil(num_documents / len(categories))
    documents = []
    for index in range(num_documents):
        category, stratum = categories[index % len(categories)], index // len(categories)
        rng = random.Random(f"kvgov-corpus:{seed}:{index}")
        share = (stratum + rng.random()) / per_category
        tokens = round(MIN_TOKENS * (MAX_TOKENS / MIN_TOKENS) ** share)
        out = _Writer()
        flavour, tool, arguments = _GENERATORS[category](rng, out, tokens, stratum)
        name, text = f"{category.value}-{stratum:02d}-{flavour}", "\n".join(out.lines)
        frozen = MappingProxyType(arguments)
        documents.append(Document(name, category, tool, frozen, text, tuple(out.errors)))
    return tuple(documents)


@dataclass(slots=True)
class _Writer:
    lines: list[str] = field(default_factory=list)
    errors: list[int] = field(default_factory=list)
    chars: int = 0

    def add(self, text: str = "", *, error: bool = False) -> None:
        """One line, or several separated by newlines, all labelled alike."""
        for line in text.split("\n"):
            if error and line.strip():
                self.errors.append(len(self.lines))
            self.lines.append(line)
            self.chars += len(line) + 1

    def add_marked(self, template: str, **fields: object) -> None:
        """Lines of the filled ``template``; those starting with "!" are error lines."""
        for line in template.format(**fields).split("\n"):
            self.add(line.removeprefix("!"), error=line.startswith("!"))


_Call = tuple[str, str, dict[str, str]]  # flavour, tool name, arguments
_Generator = Callable[[random.Random, _Writer, int, int], _Call]  # rng, out, tokens, variant

_PROJECTS = ("orders", "billing", "ingest", "catalog", "notify", "ledger", "search")
_PACKAGES = ("api", "auth", "cache", "cli", "config", "db", "events", "export", "http", "jobs",
             "metrics", "models", "payments", "queue", "reports", "scheduler", "storage", "sync",
             "users", "webhooks")  # fmt: skip
_VERBS = ("parse", "create", "update", "delete", "retry", "validate", "serialize", "render", "load",
          "merge", "resolve", "refresh", "cancel", "export", "list", "fetch")  # fmt: skip
_NOUNS = ("order", "invoice", "user", "session", "token", "config", "event", "batch", "report",
          "webhook", "payment", "customer", "shipment", "refund", "schedule",
          "snapshot")  # fmt: skip
_CASES = ("", "_empty", "_invalid", "_unicode", "_timeout", "_concurrent", "_large", "_missing_key",
          "_expired")  # fmt: skip
_PARAMS = ("sqlite", "postgres", "utf8", "latin1", "json", "yaml", "v1", "v2", "1-2",
           "0-None")  # fmt: skip
_FAILURES = (
    ("ConfigError", "{project}.errors.ConfigError: missing key: port"),
    ("KeyError", "KeyError: 'customer_id'"),
    ("ConnectError", "httpx.ConnectError: [Errno 111] Connection refused"),
    ("IntegrityError", "sqlalchemy.exc.IntegrityError: (psycopg.errors.UniqueViolation) "
     'duplicate key value violates unique constraint "orders_external_id_key"'),
    ("TimeoutError", "TimeoutError: lease not granted within 5.0 s (queue depth 14)"),
    ("ValidationError", "pydantic_core._pydantic_core.ValidationError: 1 validation error "
     "for Invoice"),
)  # fmt: skip
# Prose uses error words ("retries failed requests") the way real documentation does.
_SUBJECTS = ("The scheduler", "Each worker", "The client library", "This option", "The cache",
             "A request", "The migration", "Your deployment", "The gateway", "The exporter",
             "Every job", "The retry policy", "The webhook endpoint", "The CLI")  # fmt: skip
_PREDICATES = ("retries failed requests", "stores the configuration file", "drops idle connections",
               "batches incoming events", "validates the session token", "streams large payloads",
               "compresses archived reports", "forwards the original headers",
               "rejects malformed payloads", "refreshes expired credentials",
               "writes a snapshot of the queue")  # fmt: skip
_TAILS = ("before the timeout expires", "when the queue is full", "for up to five minutes",
          "unless it is disabled explicitly", "on every deploy", "in the background",
          "as described below", "by default", "once per region", "after the lease is released",
          "while a migration is running", "for each tenant")  # fmt: skip
_JAVA_PACKAGES = ("org.springframework.web.servlet", "org.apache.catalina.core",
                  "com.zaxxer.hikari.pool", "org.hibernate.engine.jdbc", "com.acme.orders.service",
                  "java.base/java.lang.reflect")  # fmt: skip


def _name(rng: random.Random) -> str:
    return f"{rng.choice(_VERBS)}_{rng.choice(_NOUNS)}{rng.choice(_CASES)}"


def _hex(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789abcdef") for _ in range(n))


def _sentence(rng: random.Random) -> str:
    return f"{rng.choice(_SUBJECTS)} {rng.choice(_PREDICATES)} {rng.choice(_TAILS)}."


def _paragraph(rng: random.Random) -> str:
    return " ".join(_sentence(rng) for _ in range(rng.randint(2, 7)))


def _python_traceback(rng: random.Random, project: str, exception: str) -> str:
    """A marked traceback: every line an error line."""
    lines = ["!Traceback (most recent call last):"]
    for _ in range(rng.randint(2, 6)):
        where = f"/srv/{project}/{rng.choice(_PACKAGES)}/{_name(rng)}.py"
        lines.append(f'!  File "{where}", line {rng.randint(12, 900)}, in {_name(rng)}')
        lines.append(f"!    return {_name(rng)}(payload, timeout=self.timeout)")
    return "\n".join([*lines, f"!{exception.format(project=project)}"])


def _java_frame(rng: random.Random) -> str:
    cls = rng.choice(_NOUNS).title() + rng.choice(("Service", "Handler", "Pool", "Filter"))
    method = f"{cls}.{rng.choice(_VERBS)}{rng.choice(_NOUNS).title()}"
    return f"!\tat {rng.choice(_JAVA_PACKAGES)}.{method}({cls}.java:{rng.randint(20, 1500)})"


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


def _pytest_log(rng: random.Random, out: _Writer, tokens: int) -> _Call:
    project = rng.choice(_PROJECTS)
    num_tests = max(30, (int(tokens * 3.9) - 3_000) // 84)
    failing = set(rng.sample(range(num_tests), rng.choice((0, 1, 1, 2, 2, 3))))
    out.add(f"{' test session starts ':=^80}\nplatform linux -- Python 3.11.9, pytest-8.3.2")
    out.add(f"rootdir: /home/dev/{project}\ncollecting ... collected {num_tests} items\n")
    nodes, failed, counts = [], [], {"PASSED": 0, "SKIPPED": 0, "XFAIL": 0}
    module = ""
    for i in range(num_tests):
        if i == 0 or rng.random() < 0.08:
            module = f"tests/{rng.choice(_PACKAGES)}/test_{rng.choice(_NOUNS)}s.py"
        param = f"[{rng.choice(_PARAMS)}]" if rng.random() < 0.3 else ""
        nodes.append(f"{module}::test_{_name(rng)}{param}")
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
            where = f"{project}/{rng.choice(_PACKAGES)}/clock.py:{rng.randint(10, 300)}"
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
        source = f"src/{project}/{rng.choice(_PACKAGES)}/{rng.choice(_NOUNS)}.py"
        fields: dict[str, object] = {"title": f" {test} ", "path": path, "kind": kind}
        fields |= {"noun": rng.choice(_NOUNS), "verb": rng.choice(_VERBS), "function": function}
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


def _go_test_log(rng: random.Random, out: _Writer, tokens: int) -> _Call:
    project, chars = rng.choice(_PROJECTS), int(tokens * 3.6)
    any_failed = False
    while out.chars < chars:
        package = f"github.com/acme/{project}/internal/{rng.choice(_PACKAGES)}"
        failed = False
        for _ in range(rng.randint(4, 25)):
            test = f"Test{rng.choice(_VERBS).title()}{rng.choice(_NOUNS).title()}"
            file = f"{rng.choice(_NOUNS)}_test.go"
            fails = rng.random() < 0.012
            out.add(f"=== RUN   {test}")
            for _ in range(rng.randint(0, 2)):
                seeded = f"seeded {rng.randint(2, 500)} {rng.choice(_NOUNS)}s"
                out.add(f"    {file}:{rng.randint(20, 300)}: {seeded} in {rng.randint(1, 90)}ms")
            subtests = [f"{test}/{_name(rng)}" for _ in range(rng.randint(0, 4))]
            for sub in subtests:
                out.add(f"=== RUN   {sub}")
            if fails:  # go test prints a failure's messages before its verdict
                status = rng.choice(("failed", "pending"))
                got = f"{rng.choice(_NOUNS)} {rng.randint(1000, 9999)}: got status {status}"
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


def _test_log(rng: random.Random, out: _Writer, tokens: int, variant: int) -> _Call:
    return (_go_test_log if variant % 3 == 1 else _pytest_log)(rng, out, tokens)


def _json_item(rng: random.Random, flavour: str, n: int, project: str, error: set[str]) -> object:
    """One array item; the ``"key": value`` renderings that report an error go in ``error``."""

    def failure(**fields: str) -> dict[str, str]:
        error.update(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in fields.items())
        return fields

    if flavour == "batch":
        item: dict[str, object] = {
            "id": f"task-{n:05d}",
            "input": f"s3://{project}-in/{_hex(rng, 12)}.csv",
            "duration_ms": rng.randint(40, 9000),
        }
        if rng.random() > 0.03:
            return item | {"status": "succeeded", "rows_written": rng.randint(0, 90000)}
        code = rng.choice(("DEADLINE_EXCEEDED", "PERMISSION_DENIED", "INVALID_ARGUMENT"))
        message = f"task-{n:05d}: upstream inventory-svc returned {code} after {n % 29 + 2} s"
        return item | {"status": "failed", "error": failure(code=code, message=message)}
    if flavour == "pods":
        crashing = rng.random() < 0.03
        started = f"2026-11-{rng.randint(1, 30):02d}T{rng.randint(0, 23):02d}:14:07Z"
        message = f"back-off 5m0s restarting failed container=api pod={project}-{n}"
        waiting = {"waiting": failure(reason="CrashLoopBackOff", message=message)}
        state = {"state": waiting if crashing else {"running": {"startedAt": started}}}
        container = {"name": "api", "ready": not crashing, "restartCount": 7 * crashing}
        name, ip = f"{project}-{_hex(rng, 10)}-{_hex(rng, 5)}", f"10.4.{n // 250}.{n % 250}"
        status = {"phase": "Running", "podIP": ip, "containerStatuses": [container | state]}
        return {"metadata": {"name": name, "namespace": "prod"}, "status": status}
    user = {"login": f"dev{rng.randint(1, 400)}", "type": "User"}
    labels = [{"name": rng.choice(("bug", "enhancement", "triage"))}]
    issue = {"number": 4000 + n, "title": _sentence(rng)[:-1], "state": "open", "user": user}
    return issue | {"labels": labels, "comments": rng.randint(0, 30), "body": _paragraph(rng)}


def _json_api(rng: random.Random, out: _Writer, tokens: int, variant: int) -> _Call:
    project = rng.choice(_PROJECTS)
    flavour = ("batch", "pods", "issues")[variant % 3]
    pretty = flavour in ("batch", "pods") or rng.random() < 0.5
    ratio = 2.9 if flavour == "batch" else 3.4 if pretty else 4.4  # characters per token
    indent, chars = 2 if pretty else None, int(tokens * ratio)
    items: list[object] = []
    error: set[str] = set()
    size = 0
    while size < chars:
        items.append(_json_item(rng, flavour, len(items), project, error))
        size += len(json.dumps(items[-1], indent=indent)) + (6 if pretty else 2)
    body: dict[str, object] = {"total": len(items), "items": items}
    if flavour == "batch":
        failed = sum('"status": "failed"' in json.dumps(item) for item in items)
        status = "completed_with_errors" if failed else "succeeded"
        body = {"job": f"{project}-nightly", "status": status, "failed": failed, "results": items}
    elif flavour == "pods":
        body = {"apiVersion": "v1", "kind": "List", "items": items, "metadata": {}}
    for line in json.dumps(body, indent=indent, ensure_ascii=False).split("\n"):
        out.add(line, error=line.strip().rstrip(",") in error)
    return flavour, "http_get", {"url": f"https://api.acme.dev/v2/{project}/{flavour}?limit=1000"}


def _repo_paths(rng: random.Random, chars: int) -> list[str]:
    project, paths, size = rng.choice(_PROJECTS), [], 0
    while size < chars:
        root = rng.choice(("src", "tests", "docs", "node_modules", ".git/objects", "data"))
        if root == ".git/objects":
            path = f".git/objects/{_hex(rng, 2)}/{_hex(rng, 38)}"
        elif root == "node_modules":
            path = f"node_modules/{rng.choice(_NOUNS)}-{rng.choice(_VERBS)}/dist/{_name(rng)}.js"
        elif root == "data":
            path = f"data/exports/part-{len(paths):05d}-{_hex(rng, 8)}.snappy.parquet"
        else:
            path = f"{root}/{project}/{rng.choice(_PACKAGES)}/{_name(rng)}.py"
        paths.append(path)
        size += len(path) + 3
    return sorted(set(paths))


def _directory_listing(rng: random.Random, out: _Writer, tokens: int, variant: int) -> _Call:
    flavour = ("find", "ls")[variant % 2]
    chars = int(tokens * (3.2 if flavour == "find" else 2.03))
    folders = ("var/lib", "secrets", "build/cache")
    denied = [f"./{rng.choice(folders)}/{rng.choice(_NOUNS)}" for _ in range(rng.randint(0, 2))]
    if flavour == "ls":
        for path in denied:
            out.add(f"ls: cannot open directory '{path}': Permission denied", error=True)
        out.add(f"total {chars // 9}")
        while out.chars < chars:
            size, day = rng.randint(2_000, 90_000_000), rng.randint(1, 30)
            when = f"Nov {day:2d} {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"
            name = f"part-{len(out.lines):05d}-{_hex(rng, 8)}-c000.snappy.parquet"
            out.add(f"-rw-r--r--  1 etl  etl  {size:>9} {when} {name}")
        return flavour, "bash", {"command": "ls -la data/exports"}
    paths = _repo_paths(rng, chars)
    where = sorted(rng.sample(range(len(paths)), len(denied)))
    for i, path in enumerate(paths):
        if i in where:
            out.add(f"find: '{denied[where.index(i)]}': Permission denied", error=True)
        out.add(f"./{path}")
    return flavour, "bash", {"command": "find . -type f"}


_JAVA_ERROR = """\
!{stamp} ERROR 4242 --- [{thread}] {logger} : request failed
!org.springframework.dao.DataAccessResourceFailureException: Unable to acquire JDBC Connection
{frames}
!Caused by: java.sql.SQLTransientConnectionException: HikariPool-1 - Connection is not \
available, request timed out after 30000ms.
{cause}
!\t... {more} more"""
_PYTHON_ERROR = """\
!{stamp} ERROR [{thread}] {project}.jobs: job {job} failed
{traceback}

!During handling of the above exception, another exception occurred:

{chained}"""


def _stack_trace(rng: random.Random, out: _Writer, tokens: int, variant: int) -> _Call:
    project, java, chars = rng.choice(_PROJECTS), variant % 2 == 1, int(tokens * 2.6)
    where = sorted(rng.uniform(0.05, 1.0) * chars for _ in range(rng.choice((1, 1, 2, 3))))
    second = 0
    while out.chars < chars or where:
        second += rng.randint(0, 3)
        stamp = f"2026-11-30 {9 + second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}"
        stamp += f"{'.' if java else ','}{rng.randint(0, 999):03d}"
        worker = f"worker-{rng.randint(1, 8)}"
        thread = f"http-nio-8080-exec-{rng.randint(1, 20)}" if java else worker
        logger = f"c.a.{project}.{rng.choice(_PACKAGES)}.{rng.choice(_NOUNS).title()}Controller"
        if where and out.chars >= where[0]:
            where.pop(0)
            if java:
                frames = "\n".join(_java_frame(rng) for _ in range(rng.randint(4, 16)))
                cause = "\n".join(_java_frame(rng) for _ in range(4))
                fields = {"frames": frames, "cause": cause, "more": rng.randint(40, 120)}
                out.add_marked(_JAVA_ERROR, stamp=stamp, thread=thread, logger=logger, **fields)
            else:
                traceback = _python_traceback(rng, project, "httpx.ReadTimeout: timed out")
                chained = _python_traceback(rng, project, "{project}.jobs.JobFailed: gave up")
                fields = {"traceback": traceback, "chained": chained, "job": rng.randint(1, 9999)}
                out.add_marked(_PYTHON_ERROR, stamp=stamp, thread=thread, project=project, **fields)
            continue
        warn = rng.random() < 0.01
        level = "WARN " if warn else rng.choice(("DEBUG", "INFO ", "INFO ", "INFO "))
        request = f"GET /api/{rng.choice(_NOUNS)}s/{rng.randint(1, 99999)}"
        message = f"{request} -> 200 ({rng.randint(2, 300)} ms)"
        if warn:
            message = f"slow query on {rng.choice(_NOUNS)}s: {rng.randint(800, 9000)} ms"
        if java:
            out.add(f"{stamp} {level} 4242 --- [{thread}] {logger} : {message}", error=warn)
        else:
            level = "WARNING" if warn else level.strip()
            out.add(f"{stamp} {level} [{thread}] {project}.http: {message}", error=warn)
    command = f"kubectl logs deploy/{project}-{'api' if java else 'worker'} --since=2h"
    return "java" if java else "python", "bash", {"command": command}


def _web_page(rng: random.Random, out: _Writer, tokens: int, variant: int) -> _Call:
    project, flavour = rng.choice(_PROJECTS), ("issue", "docs", "article")[variant % 3]
    chars, pasted = int(tokens * (4.7 if flavour == "issue" else 5.3)), rng.randint(1, 2)
    title = f"Worker crashes after upgrade · Issue #{rng.randint(100, 9999)} · acme/{project}"
    if flavour != "issue":
        title = f"{project.title()}: how we cut p99 latency in half · {flavour}"
    out.add(f"{title}\n\nSkip to content\nProduct  Solutions  Docs  Pricing  Blog  Sign in\n")
    section = 0
    while out.chars < chars - 100:
        section += 1
        if flavour == "issue":
            ago = f"{rng.randint(1, 30)} days ago"
            out.add(f"dev{rng.randint(1, 400)} commented {ago}\n\n{_paragraph(rng)}")
            if pasted and (section == 1 or rng.random() < 0.1):
                pasted -= 1
                traceback = _python_traceback(rng, project, "KeyError: 'customer_id'")
                out.add_marked("\n```\n{traceback}\n```", traceback=traceback)
            out.add(f"\n👍 {rng.randint(0, 20)}  ❤️ {rng.randint(0, 5)}")
        else:
            heading = f"## {section}. {rng.choice(_VERBS).title()} the {rng.choice(_NOUNS)}"
            out.add(f"{heading}\n")
            for _ in range(rng.randint(1, 4)):
                out.add(f"{_paragraph(rng)}\n")
            if rng.random() < 0.3:
                out.add("| Option | Default | Description |\n|---|---|---|")
                for _ in range(rng.randint(3, 10)):
                    out.add(f"| `{_name(rng)}` | `{rng.randint(1, 600)}` | {_sentence(rng)} |")
        out.add()
    out.add("Related: Quickstart · API reference · Changelog · Status\n\n© 2026 Acme, Inc.")
    return flavour, "fetch", {"url": f"https://docs.acme.dev/{project}/{flavour}"}


_GENERATORS: Mapping[Category, _Generator] = MappingProxyType(
    {
        Category.TEST_LOG: _test_log,
        Category.JSON_API: _json_api,
        Category.DIRECTORY_LISTING: _directory_listing,
        Category.STACK_TRACE: _stack_trace,
        Category.WEB_PAGE: _web_page,
    }
)
