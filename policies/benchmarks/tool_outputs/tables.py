"""Aligned text tables: psql, the mysql client's boxes, ``kubectl get pods``, ``ps aux`` and a
markdown reference table.

Columns are padded as each tool pads them (numbers right-aligned where the tool does).
The facts are the row the question names (a customer, a process, a variable) or the rows
that stand out (a failed job, a crash-looping pod, the process holding the memory).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from policies.benchmarks.tool_outputs._common import (
    NOUNS,
    SERVICES,
    Clock,
    Unique,
    alnum,
    email,
    fill,
    num_chars,
    plant,
)
from policies.benchmarks.tool_outputs.case import Case, Fact

__all__ = ["FORMATS", "build"]

FORMATS = ("psql", "mysql", "kubectl", "ps_aux", "markdown")
_CHARS_PER_TOKEN = {"psql": 1.7, "mysql": 1.9, "kubectl": 2.1, "ps_aux": 2.05, "markdown": 3.35}


def build(rng: random.Random) -> Case:
    fmt = rng.choice(FORMATS)
    size = num_chars(rng, _CHARS_PER_TOKEN[fmt])
    text, tool, arguments, question, facts = _BUILDERS[fmt](rng, size)
    return Case("table", fmt, tool, arguments, question, text, tuple(facts))


def _widths(rows: Sequence[Sequence[str]]) -> list[int]:
    return [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]


# -- psql ------------------------------------------------------------------------------------
_PLANS = ("free", "starter", "team", "business", "enterprise")


def _psql(rng: random.Random, size: int) -> tuple:
    header = ["id", "email", "plan", "seats", "mrr_cents", "created_at"]
    numeric = {0, 3, 4}
    emails, ids = Unique(), Unique()
    clock = Clock(rng, step_s=(600, 90_000))

    def row() -> list[str]:
        plan = rng.choice(_PLANS)
        seats = 1 if plan == "free" else rng.randint(2, 400)
        mrr = 0 if plan == "free" else seats * rng.choice((800, 1_200, 2_500, 4_900))
        return [
            ids(lambda: str(rng.randint(1_000, 99_999))),
            emails(lambda: email(rng)),
            plan,
            str(seats),
            str(mrr),
            "",
        ]

    rows = fill(row, size, lambda r: sum(len(c) + 3 for c in r) + 14)
    targets = [row() for _ in range(rng.choice((1, 1, 2)))]
    for t in targets:
        t[2] = rng.choice(_PLANS[1:])
        t[4] = str(int(t[3]) * rng.choice((800, 1_200, 2_500, 4_900)))
    plant(rng, rows, targets)
    for each in rows:
        each[5] = clock.tick().strftime("%Y-%m-%d %H:%M:%S+00")
    widths = _widths([header, *rows])
    lines = [
        "|".join(f" {h.center(w)} " for h, w in zip(header, widths, strict=True)).rstrip(),
        "+".join("-" * (w + 2) for w in widths),
    ]
    for r in rows:
        cells = [
            c.rjust(w) if i in numeric else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("|".join(f" {c} " for c in cells).rstrip())
    lines.append(f"({len(rows)} rows)")
    who = " and ".join(t[1] for t in targets)
    question = rng.choice(
        (
            f"Which plan is {who} on, and what do they pay per month?",
            f"Sales wants to know the plan and MRR for {who}.",
        )
    )
    arguments = {
        "query": "SELECT id, email, plan, seats, mrr_cents, created_at FROM accounts "
        "ORDER BY created_at;",
        "database": "billing",
    }
    facts = [
        Fact((t[1], t[2], t[4]), "asked", f"{t[1]} is on {t[2]} at {t[4]} cents") for t in targets
    ]
    return "\n".join(lines) + "\n", "sql_query", arguments, question, facts


# -- mysql -----------------------------------------------------------------------------------
_QUEUES = ("default", "mail", "exports", "webhooks", "thumbnails", "billing", "search-index")
_JOB_ERRORS = (
    "SMTPRecipientsRefused: 550 mailbox unavailable",
    "Lock wait timeout exceeded; try restarting transaction",
    "S3 upload failed: RequestTimeTooSkewed",
    "PDF renderer exited with status 139",
    "webhook endpoint returned 410 Gone",
    "MemoryError while resizing 48000x32000 image",
)


def _mysql(rng: random.Random, size: int) -> tuple:
    header = ["id", "queue", "status", "attempts", "last_error", "updated_at"]
    numeric = {0, 3}
    clock = Clock(rng, step_s=(0, 40))
    ids = iter(range(rng.randint(100_000, 900_000), 10**7))

    def row(error: str | None = None) -> list[str]:
        status = "failed" if error else rng.choice(("done",) * 6 + ("queued", "running"))
        attempts = rng.randint(5, 8) if error else rng.choice((1, 1, 1, 2))
        return [str(next(ids)), rng.choice(_QUEUES), status, str(attempts), error or "NULL", ""]

    rows = fill(row, size, lambda r: sum(len(c) + 3 for c in r) + 20)
    failed = [row(e) for e in rng.sample(_JOB_ERRORS, rng.randint(1, 3))]
    plant(rng, rows, failed)
    for offset, each in enumerate(rows):
        each[0] = str(int(rows[0][0]) + offset) if offset else each[0]
        each[5] = clock.tick().strftime("%Y-%m-%d %H:%M:%S")
    widths = _widths([header, *rows])
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(cells: Sequence[str], align: bool) -> str:
        padded = [
            c.rjust(w) if align and i in numeric else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "| " + " | ".join(padded) + " |"

    lines = [
        rule,
        line(header, False),
        rule,
        *(line(r, True) for r in rows),
        rule,
        f"{len(rows)} rows in set ({rng.uniform(0.01, 0.9):.2f} sec)",
    ]
    question = rng.choice(
        (
            "Some background jobs died overnight. Which ones, and why?",
            "The queue dashboard shows failures since yesterday; what errors do the failed "
            "jobs have?",
        )
    )
    arguments = {
        "query": "SELECT id, queue, status, attempts, last_error, updated_at FROM jobs "
        "WHERE updated_at > NOW() - INTERVAL 1 DAY ORDER BY id;",
        "database": "worker",
    }
    facts = [Fact((r[0], r[4]), "standout", f"job {r[0]} failed: {r[4]}") for r in failed]
    return "\n".join(lines) + "\n", "sql_query", arguments, question, facts


# -- kubectl ---------------------------------------------------------------------------------
_BAD_STATES = (
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "OOMKilled",
    "Error",
    "CreateContainerConfigError",
)
_NAMESPACES = ("prod", "staging", "kube-system", "monitoring", "ingress-nginx", "payments")


def _kubectl(rng: random.Random, size: int) -> tuple:
    header = [
        "NAMESPACE",
        "NAME",
        "READY",
        "STATUS",
        "RESTARTS",
        "AGE",
        "IP",
        "NODE",
        "NOMINATED NODE",
        "READINESS GATES",
    ]
    nodes = [
        f"ip-10-0-{rng.randrange(256)}-{rng.randrange(256)}.ec2.internal"
        for _ in range(rng.randint(4, 16))
    ]
    names = Unique()

    def age() -> str:
        return rng.choice(
            (f"{rng.randint(2, 59)}m", f"{rng.randint(1, 23)}h", f"{rng.randint(1, 90)}d")
        )

    def row(state: str = "Running") -> list[str]:
        app = rng.choice(SERVICES)
        name = names(lambda: f"{app}-{alnum(rng, 10, lower=True)}-{alnum(rng, 5, lower=True)}")
        if state == "Running":
            restarts = rng.choice(("0", "0", "0", f"{rng.randint(1, 3)} ({age()} ago)"))
            ready = "1/1" if rng.random() < 0.7 else "2/2"
        else:
            restarts = f"{rng.randint(12, 300)} ({rng.randint(1, 5)}m ago)"
            ready = "0/1"
        if state == "Running" and rng.random() < 0.05:
            state, ready, restarts = "Completed", "0/1", "0"
        return [
            rng.choice(_NAMESPACES),
            name,
            ready,
            state,
            restarts,
            age(),
            f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}",
            rng.choice(nodes),
            "<none>",
            "<none>",
        ]

    rows = fill(row, size, lambda r: sum(len(c) + 3 for c in r))
    broken = [row(rng.choice(_BAD_STATES)) for _ in range(rng.randint(1, 3))]
    plant(rng, rows, broken)
    rows.sort(key=lambda r: _NAMESPACES.index(r[0]))  # kubectl groups by namespace
    widths = _widths([header, *rows])
    lines = [
        "   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    ]
    question = rng.choice(
        (
            "Something in the cluster is unhealthy. Which pods are failing?",
            "Our on-call page says pods are not ready; which ones and what state are they in?",
            "Before the deploy, is every pod healthy?",
        )
    )
    facts = [Fact((r[1], r[3]), "standout", f"pod {r[1]} is {r[3]}") for r in broken]
    return (
        "\n".join(lines) + "\n",
        "shell",
        {"command": "kubectl get pods -A -o wide"},
        question,
        facts,
    )


# -- ps aux ----------------------------------------------------------------------------------
_DAEMONS = (
    ("root", "/sbin/init"),
    ("root", "/lib/systemd/systemd-journald"),
    ("root", "/usr/sbin/sshd -D"),
    ("root", "/usr/bin/containerd"),
    ("root", "/usr/bin/dockerd -H fd:// --containerd=/run/containerd/containerd.sock"),
    ("www-data", "nginx: worker process"),
    ("postgres", "postgres: checkpointer"),
    ("postgres", "postgres: walwriter"),
    ("postgres", "postgres: app shop 10.0.3.4(51234) idle"),
    ("app", "/srv/app/.venv/bin/python -m gunicorn shop.wsgi:app -w 8 -b 0.0.0.0:8000"),
    ("app", "celery -A shop worker -Q default --concurrency=4"),
    ("root", "/usr/sbin/cron -f"),
    ("syslog", "/usr/sbin/rsyslogd -n -iNONE"),
    ("root", "/usr/lib/snapd/snapd"),
    ("redis", "/usr/bin/redis-server 127.0.0.1:6379"),
    ("node", "node /srv/web/server.js"),
)
_WANTED = (
    ("the nightly pg_dump", "/usr/bin/pg_dump -Fc -f /backups/shop.dump shop", "pg_dump"),
    ("the rsync backup", "rsync -a --delete /data/ backup01:/srv/data/", "rsync"),
    ("the database migration", "/srv/app/.venv/bin/python manage.py migrate --noinput", "migrate"),
    ("the ffmpeg transcode", "ffmpeg -i /tmp/upload-77.mov -c:v libx264 out.mp4", "ffmpeg"),
)


def _ps_aux(rng: random.Random, size: int) -> tuple:
    pids = Unique()

    def row(user: str, command: str, cpu: float, mem: float, stat: str) -> str:
        pid = pids(lambda: str(rng.randint(2, 4_194_000)))
        rss = int(mem * 160_000) + rng.randint(0, 9_000)
        return (
            f"{user[:8]:<8} {pid:>7} {cpu:4.1f} {mem:4.1f} {rss * 3 + 20_000:>7} {rss:>6} "
            f"{'?':<8} {stat:<4} {rng.choice(('Mar03', 'Mar04', '09:12', '11:40')):>5} "
            f"{rng.randint(0, 900)}:{rng.randint(0, 59):02d} {command}"
        )

    def routine() -> str:
        if rng.random() < 0.45:
            kind = rng.choice(
                (
                    "kworker/",
                    "ksoftirqd/",
                    "migration/",
                    "rcu_gp",
                    "kthreadd",
                    "jbd2/nvme0n1p1-8",
                    "xfsaild/dm-0",
                )
            )
            name = (
                kind + f"{rng.randint(0, 63)}:{rng.randint(0, 3)}-events"
                if kind.endswith("/")
                else kind
            )
            return row("root", f"[{name}]", 0.0, 0.0, rng.choice(("I<", "S", "I")))
        user, command = rng.choice(_DAEMONS)
        return row(
            user, command, rng.uniform(0, 9), rng.uniform(0, 4.5), rng.choice(("Ss", "Sl", "S"))
        )

    lines = fill(routine, size, len)
    if rng.random() < 0.5:
        words, command, needle = rng.choice(_WANTED)
        target = row("app", command, rng.uniform(20, 99), rng.uniform(0.5, 6), "R")
        plant(rng, lines, [target])
        pid = target.split()[1]
        question = rng.choice(
            (
                f"Is {words} still running? What's its PID?",
                f"I need to kill {words}; find its process id.",
            )
        )
        facts = [Fact((pid, needle), "asked", f"{words} runs as PID {pid}")]
    else:
        hog = row(
            "app",
            "/srv/app/.venv/bin/python -m shop.jobs.reindex --all",
            rng.uniform(40, 99),
            rng.uniform(35, 72),
            "R",
        )
        plant(rng, lines, [hog])
        pid, mem = hog.split()[1], hog.split()[3]
        question = rng.choice(
            (
                "The box is swapping hard. What's using all the memory?",
                "Memory alert on this host; which process is the culprit?",
            )
        )
        facts = [
            Fact((pid, mem, "shop.jobs.reindex"), "standout", f"PID {pid} holds {mem}% memory")
        ]
    head = "USER         PID %CPU %MEM    VSZ   RSS TTY      STAT START   TIME COMMAND"
    return head + "\n" + "\n".join(lines) + "\n", "shell", {"command": "ps aux"}, question, facts


# -- markdown --------------------------------------------------------------------------------
_ATTRS = {
    "TIMEOUT": (
        "how long to wait for a {n} before giving up",
        "timeout",
        ("10s", "30s", "45s", "2m", "90s", "5s"),
    ),
    "TTL": ("how long a {n} stays cached", "cache lifetime", ("5m", "15m", "1h", "12h", "7d")),
    "MAX": ("the most {n}s handled at once", "limit", ("8", "16", "64", "256", "1000")),
    "DIR": (
        "where {n} files are written",
        "directory",
        ("/var/lib/{p}/{n}s", "/tmp/{p}-{n}", "./data/{n}s"),
    ),
    "RETRIES": ("how often a failed {n} is retried", "retry count", ("3", "5", "7", "10")),
    "ENABLED": ("whether {n} processing is on", "switch", ("true", "false")),
    "INTERVAL": ("how often {n}s are flushed", "flush interval", ("250ms", "1s", "10s", "60s")),
    "URL": (
        "the endpoint {n}s are sent to",
        "endpoint",
        ("http://localhost:4318", "https://hooks.{p}.internal/{n}"),
    ),
}


_AREAS = ("HTTP", "DB", "QUEUE", "CACHE", "WORKER", "EXPORT", "AUTH", "MAIL", "SEARCH", "STORAGE")


def _markdown(rng: random.Random, size: int) -> tuple:
    prefix = rng.choice(("LANTERN", "QUILL", "TIDEPOOL", "HARBOR", "KESTREL"))
    names = Unique()

    def variable() -> tuple[str, str, str, str]:
        name = names(
            lambda: (
                f"{prefix}_{rng.choice(_AREAS)}_{rng.choice(NOUNS).upper()}_"
                f"{rng.choice(tuple(_ATTRS))}"
            )
        )
        _, _, noun, attr = name.split("_")
        noun = noun.lower()
        what, _, defaults = _ATTRS[attr]
        default = rng.choice(defaults).format(p=prefix.lower(), n=noun)
        note = rng.choice(
            (
                "",
                " Set to `0` to disable.",
                " Read once at startup.",
                " Overrides the config file.",
                " Deprecated since 3.0.",
            )
        )
        return (
            name,
            default,
            what.format(n=noun).capitalize() + "." + note,
            f"{noun}|{attr}|{name.split('_')[1].lower()}",
        )

    rows = fill(variable, size, lambda r: len(r[0]) + len(r[1]) + len(r[2]) + 14)
    target = variable()
    plant(rng, rows, [target])
    noun, attr, area = target[3].split("|")
    lines = [
        f"# {prefix.title()} configuration reference",
        "",
        f"Every setting can be given as an environment variable prefixed with `{prefix}_`. "
        "Values with units accept `ms`, `s`, `m`, `h` and `d`.",
        "",
        "| Variable | Default | Description |",
        "| --- | --- | --- |",
    ]
    lines += [
        f"| `{name}` | `{default}` | {description} |" for name, default, description, _ in rows
    ]
    lines += ["", "Unknown variables with the prefix are logged as a warning at startup."]
    question = rng.choice(
        (
            f"What's the default value of {target[0]}?",
            f"What {_ATTRS[attr][1]} does {prefix.title()}'s {area} layer use for {noun}s by "
            "default?",
        )
    )
    arguments = {"path": "docs/reference/environment.md"}
    facts = [Fact((target[0], target[1]), "asked", f"{target[0]} defaults to {target[1]}")]
    return "\n".join(lines) + "\n", "read_file", arguments, question, facts


_BUILDERS = {
    "psql": _psql,
    "mysql": _mysql,
    "kubectl": _kubectl,
    "ps_aux": _ps_aux,
    "markdown": _markdown,
}
