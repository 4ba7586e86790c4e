"""JSON API responses with long arrays: a batch job's results, a Kubernetes pod list, an
issue list; indented as ``jq`` prints them, or compact. The ``"key": value`` lines that
report a failure are the error lines.
"""

from __future__ import annotations

import json
import random

from policies.benchmarks.corpus._common import (
    PROJECTS,
    hex_digits,
    paragraph,
    sentence,
)
from policies.benchmarks.corpus._writer import Call, Writer

__all__ = ["generate"]


def _json_item(rng: random.Random, flavour: str, n: int, project: str, error: set[str]) -> object:
    """One array item; the ``"key": value`` renderings that report an error go in ``error``."""

    def failure(**fields: str) -> dict[str, str]:
        error.update(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in fields.items())
        return fields

    if flavour == "batch":
        item: dict[str, object] = {
            "id": f"task-{n:05d}",
            "input": f"s3://{project}-in/{hex_digits(rng, 12)}.csv",
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
        name = f"{project}-{hex_digits(rng, 10)}-{hex_digits(rng, 5)}"
        ip = f"10.4.{n // 250}.{n % 250}"
        status = {"phase": "Running", "podIP": ip, "containerStatuses": [container | state]}
        return {"metadata": {"name": name, "namespace": "prod"}, "status": status}
    user = {"login": f"dev{rng.randint(1, 400)}", "type": "User"}
    labels = [{"name": rng.choice(("bug", "enhancement", "triage"))}]
    issue = {"number": 4000 + n, "title": sentence(rng)[:-1], "state": "open", "user": user}
    return issue | {"labels": labels, "comments": rng.randint(0, 30), "body": paragraph(rng)}


def generate(rng: random.Random, out: Writer, tokens: int, variant: int) -> Call:
    project = rng.choice(PROJECTS)
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
