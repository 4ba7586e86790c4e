"""Service logs with stack traces: a Spring Boot service's (Java, with a cause) or a Python
worker's (a chained traceback), among routine request lines and a few slow-query
warnings.
"""

from __future__ import annotations

import random

from policies.benchmarks.corpus._common import (
    NOUNS,
    PACKAGES,
    PROJECTS,
    VERBS,
    python_traceback,
)
from policies.benchmarks.corpus._writer import Call, Writer

__all__ = ["generate"]

_JAVA_PACKAGES = (
    "org.springframework.web.servlet",
    "org.apache.catalina.core",
    "com.zaxxer.hikari.pool",
    "org.hibernate.engine.jdbc",
    "com.acme.orders.service",
    "java.base/java.lang.reflect",
)


def _java_frame(rng: random.Random) -> str:
    cls = rng.choice(NOUNS).title() + rng.choice(("Service", "Handler", "Pool", "Filter"))
    method = f"{cls}.{rng.choice(VERBS)}{rng.choice(NOUNS).title()}"
    return f"!\tat {rng.choice(_JAVA_PACKAGES)}.{method}({cls}.java:{rng.randint(20, 1500)})"


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


def generate(rng: random.Random, out: Writer, tokens: int, variant: int) -> Call:
    project, java, chars = rng.choice(PROJECTS), variant % 2 == 1, int(tokens * 2.6)
    where = sorted(rng.uniform(0.05, 1.0) * chars for _ in range(rng.choice((1, 1, 2, 3))))
    second = 0
    while out.chars < chars or where:
        second += rng.randint(0, 3)
        stamp = f"2026-11-30 {9 + second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}"
        stamp += f"{'.' if java else ','}{rng.randint(0, 999):03d}"
        worker = f"worker-{rng.randint(1, 8)}"
        thread = f"http-nio-8080-exec-{rng.randint(1, 20)}" if java else worker
        logger = f"c.a.{project}.{rng.choice(PACKAGES)}.{rng.choice(NOUNS).title()}Controller"
        if where and out.chars >= where[0]:
            where.pop(0)
            if java:
                frames = "\n".join(_java_frame(rng) for _ in range(rng.randint(4, 16)))
                cause = "\n".join(_java_frame(rng) for _ in range(4))
                fields = {"frames": frames, "cause": cause, "more": rng.randint(40, 120)}
                out.add_marked(_JAVA_ERROR, stamp=stamp, thread=thread, logger=logger, **fields)
            else:
                traceback = python_traceback(rng, project, "httpx.ReadTimeout: timed out")
                chained = python_traceback(rng, project, "{project}.jobs.JobFailed: gave up")
                fields = {"traceback": traceback, "chained": chained, "job": rng.randint(1, 9999)}
                out.add_marked(_PYTHON_ERROR, stamp=stamp, thread=thread, project=project, **fields)
            continue
        warn = rng.random() < 0.01
        level = "WARN " if warn else rng.choice(("DEBUG", "INFO ", "INFO ", "INFO "))
        request = f"GET /api/{rng.choice(NOUNS)}s/{rng.randint(1, 99999)}"
        message = f"{request} -> 200 ({rng.randint(2, 300)} ms)"
        if warn:
            message = f"slow query on {rng.choice(NOUNS)}s: {rng.randint(800, 9000)} ms"
        if java:
            out.add(f"{stamp} {level} 4242 --- [{thread}] {logger} : {message}", error=warn)
        else:
            level = "WARNING" if warn else level.strip()
            out.add(f"{stamp} {level} [{thread}] {project}.http: {message}", error=warn)
    command = f"kubectl logs deploy/{project}-{'api' if java else 'worker'} --since=2h"
    return "java" if java else "python", "bash", {"command": command}
