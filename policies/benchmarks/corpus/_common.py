"""What the generators share: the words they draw names and prose from, and Python
tracebacks (a service log's and a pasted one in an issue thread)."""

from __future__ import annotations

import random

__all__ = [
    "CASES",
    "NOUNS",
    "PACKAGES",
    "PARAMS",
    "PREDICATES",
    "PROJECTS",
    "SUBJECTS",
    "TAILS",
    "VERBS",
    "hex_digits",
    "identifier",
    "paragraph",
    "python_traceback",
    "sentence",
]

PROJECTS = ("orders", "billing", "ingest", "catalog", "notify", "ledger", "search")
PACKAGES = (
    "api",
    "auth",
    "cache",
    "cli",
    "config",
    "db",
    "events",
    "export",
    "http",
    "jobs",
    "metrics",
    "models",
    "payments",
    "queue",
    "reports",
    "scheduler",
    "storage",
    "sync",
    "users",
    "webhooks",
)
VERBS = (
    "parse",
    "create",
    "update",
    "delete",
    "retry",
    "validate",
    "serialize",
    "render",
    "load",
    "merge",
    "resolve",
    "refresh",
    "cancel",
    "export",
    "list",
    "fetch",
)
NOUNS = (
    "order",
    "invoice",
    "user",
    "session",
    "token",
    "config",
    "event",
    "batch",
    "report",
    "webhook",
    "payment",
    "customer",
    "shipment",
    "refund",
    "schedule",
    "snapshot",
)
CASES = (
    "",
    "_empty",
    "_invalid",
    "_unicode",
    "_timeout",
    "_concurrent",
    "_large",
    "_missing_key",
    "_expired",
)
PARAMS = ("sqlite", "postgres", "utf8", "latin1", "json", "yaml", "v1", "v2", "1-2", "0-None")
# Prose uses error words ("retries failed requests") the way real documentation does.
SUBJECTS = (
    "The scheduler",
    "Each worker",
    "The client library",
    "This option",
    "The cache",
    "A request",
    "The migration",
    "Your deployment",
    "The gateway",
    "The exporter",
    "Every job",
    "The retry policy",
    "The webhook endpoint",
    "The CLI",
)
PREDICATES = (
    "retries failed requests",
    "stores the configuration file",
    "drops idle connections",
    "batches incoming events",
    "validates the session token",
    "streams large payloads",
    "compresses archived reports",
    "forwards the original headers",
    "rejects malformed payloads",
    "refreshes expired credentials",
    "writes a snapshot of the queue",
)
TAILS = (
    "before the timeout expires",
    "when the queue is full",
    "for up to five minutes",
    "unless it is disabled explicitly",
    "on every deploy",
    "in the background",
    "as described below",
    "by default",
    "once per region",
    "after the lease is released",
    "while a migration is running",
    "for each tenant",
)


def identifier(rng: random.Random) -> str:
    return f"{rng.choice(VERBS)}_{rng.choice(NOUNS)}{rng.choice(CASES)}"


def hex_digits(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789abcdef") for _ in range(n))


def sentence(rng: random.Random) -> str:
    return f"{rng.choice(SUBJECTS)} {rng.choice(PREDICATES)} {rng.choice(TAILS)}."


def paragraph(rng: random.Random) -> str:
    return " ".join(sentence(rng) for _ in range(rng.randint(2, 7)))


def python_traceback(rng: random.Random, project: str, exception: str) -> str:
    """A marked traceback: every line an error line."""
    lines = ["!Traceback (most recent call last):"]
    for _ in range(rng.randint(2, 6)):
        where = f"/srv/{project}/{rng.choice(PACKAGES)}/{identifier(rng)}.py"
        lines.append(f'!  File "{where}", line {rng.randint(12, 900)}, in {identifier(rng)}')
        lines.append(f"!    return {identifier(rng)}(payload, timeout=self.timeout)")
    return "\n".join([*lines, f"!{exception.format(project=project)}"])
