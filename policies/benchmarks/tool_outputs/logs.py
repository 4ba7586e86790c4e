"""Logs: an application's log (Python logging or Spring Boot's layout), nginx's access log,
the systemd journal.

Mostly routine lines (INFO requests, cache stats, cron sessions, a few routine WARNs); the
facts are the error lines a reader needs (a failed payment capture, a 502, an OOM kill, a
unit that failed) or the line about the request the question names. Lines are written in
order and stamped afterwards, so a planted line's time fits its place.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from policies.benchmarks.tool_outputs._common import (
    NOUNS,
    SERVICES,
    Clock,
    Unique,
    alnum,
    fill,
    hexid,
    ipv4,
    log_ms,
    login,
    num_chars,
    plant,
)
from policies.benchmarks.tool_outputs.case import Case, Fact

__all__ = ["FORMATS", "build"]

FORMATS = ("app", "nginx", "journald")
_CHARS_PER_TOKEN = {"app": 2.25, "nginx": 2.2, "journald": 2.5}
_Line = tuple[str, str, str]  # level, logger or unit, message


def build(rng: random.Random) -> Case:
    fmt = rng.choice(FORMATS)
    size = num_chars(rng, _CHARS_PER_TOKEN[fmt])
    text, tool, arguments, question, facts = _BUILDERS[fmt](rng, size)
    return Case("log", fmt, tool, arguments, question, text, tuple(facts))


# -- application log -------------------------------------------------------------------------
_ERRORS: tuple[tuple[str, Callable[[str], tuple[str, ...]]], ...] = (
    (
        "Failed to capture payment for order {id}: gateway timeout after 30000ms",
        lambda i: (i, "gateway timeout after 30000ms"),
    ),
    (
        "Could not send receipt for order {id}: SMTP 550 mailbox unavailable",
        lambda i: (i, "SMTP 550 mailbox unavailable"),
    ),
    (
        "Inventory reservation for order {id} failed: warehouse fra-2 returned 503",
        lambda i: (i, "warehouse fra-2 returned 503"),
    ),
    (
        "Refund for order {id} rejected by processor: charge already refunded",
        lambda i: (i, "charge already refunded"),
    ),
    (
        "Giving up on webhook for order {id} after 5 attempts: endpoint returned 410 Gone",
        lambda i: (i, "endpoint returned 410 Gone"),
    ),
)


def _app(rng: random.Random, size: int) -> tuple:
    service = rng.choice(SERVICES)
    spring = rng.random() < 0.5
    loggers = [f"{service}.{part}" for part in ("api", "db", "cache", "events", "jobs", "payments")]
    requests, orders = Unique(), Unique()
    new_request = lambda: requests(lambda: hexid(rng, 16))  # noqa: E731
    new_order = lambda: orders(lambda: f"ord_{alnum(rng, 12)}")  # noqa: E731

    def routine() -> _Line:
        rid = new_request()
        noun = rng.choice(NOUNS)
        level, message = rng.choice(
            (
                (
                    "INFO",
                    f"GET /api/v1/{noun}s/{rng.randint(1, 99_999)} 200 in {rng.randint(2, 300)}ms "
                    f"request_id={rid}",
                ),
                ("INFO", f"POST /api/v1/{noun}s 201 in {rng.randint(10, 600)}ms request_id={rid}"),
                ("INFO", f"published event {noun}.updated id={new_order()}"),
                ("INFO", f"cache hit ratio {rng.uniform(0.7, 0.99):.2f} over the last 60s"),
                (
                    "INFO",
                    f"pool stats: active={rng.randint(0, 20)} idle={rng.randint(0, 20)} waiting=0",
                ),
                ("DEBUG", f"loaded {noun} {rng.randint(1, 99_999)} from cache request_id={rid}"),
                ("INFO", f"scheduler tick: {rng.randint(0, 9)} jobs due"),
                (
                    "WARN",
                    f"slow query took {rng.randint(1_000, 2_900)}ms: SELECT * FROM {noun}s WHERE "
                    "id = $1",
                ),
                ("WARN", f"retrying payments call (attempt 1/3) request_id={rid}"),
            )
        )
        if level == "WARN" and rng.random() < 0.6:
            level, message = "INFO", f"GET /healthz 200 in {rng.randint(1, 4)}ms"
        return level, rng.choice(loggers), message

    lines: list[_Line] = fill(routine, size, lambda line: len(line[2]) + 55)
    chosen = rng.sample(_ERRORS, rng.randint(1, 2))
    asked = rng.random() < 0.5
    facts, targets = [], []
    for n, (template, needles) in enumerate(chosen):
        order, rid = new_order(), new_request()
        message = template.format(id=order) + f" request_id={rid}"
        plant(rng, lines, [("ERROR", f"{service}.payments", message)])
        for _ in range(rng.randint(1, 3)):  # the same request's earlier steps
            plant(
                rng,
                lines,
                [
                    (
                        "INFO",
                        f"{service}.api",
                        f"POST /api/v1/orders/{order}/"
                        f"{rng.choice(('capture', 'confirm'))} started request_id={rid}",
                    )
                ],
            )
        reason = "asked" if asked and n == 0 else "standout"
        facts.append(Fact((rid, *needles(order)), reason, message))
        targets.append(rid)
    if asked:
        facts = facts[:1]
        question = rng.choice(
            (
                f"A customer's request {targets[0]} failed around lunchtime. What happened?",
                f"Support escalated request_id {targets[0]}; find out why it errored.",
            )
        )
    else:
        question = rng.choice(
            (
                f"Are there errors in the {service} logs from the last hour?",
                f"{service} alerted on its error rate; what went wrong?",
            )
        )
    clock = Clock(rng, step_s=(0.0, 1.2))
    out = []
    for level, logger, message in lines:
        t = clock.tick()
        if spring:
            thread = f"nio-8080-exec-{rng.randint(1, 10)}"
            short = ".".join(p[0] for p in logger.split(".")[:-1]) + "." + logger.split(".")[-1]
            out.append(f"{log_ms(t, '.')} {level:>5} 1 --- [{thread:>15}] {short:<40} : {message}")
        else:
            out.append(f"{log_ms(t)} {level} [{logger}] {message}")
    arguments = {"command": f"kubectl logs deploy/{service} -n prod --since=1h"}
    return "\n".join(out) + "\n", "shell", arguments, question, facts


# -- nginx access log ------------------------------------------------------------------------
_AGENTS = (
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/124.0.0.0 Safari/537.36",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like "
    "Gecko) Version/17.4 Mobile/15E148 Safari/604.1",
    "Mozilla/5.0 (X11; Linux x86_64; rv:125.0) Gecko/20100101 Firefox/125.0",
    "okhttp/4.12.0",
    "python-requests/2.31.0",
    "kube-probe/1.29",
)


def _nginx(rng: random.Random, size: int) -> tuple:
    clients = [ipv4(rng, private=False) for _ in range(60)]
    paths = Unique()

    def request(ip: str, method: str, path: str, status: int) -> list:
        return [ip, method, path, status]

    def routine() -> list:
        noun = rng.choice(NOUNS)
        method, path, status = rng.choice(
            (
                ("GET", f"/api/v1/{noun}s?page={rng.randint(1, 40)}", 200),
                (
                    "GET",
                    f"/api/v1/{noun}s/{rng.randint(1, 99_999)}",
                    rng.choice((200, 200, 304, 404)),
                ),
                ("POST", f"/api/v1/{noun}s", rng.choice((201, 201, 400, 422))),
                ("GET", f"/static/js/main.{hexid(rng, 8)}.js", rng.choice((200, 304))),
                ("GET", "/healthz", 200),
                ("GET", f"/{noun}s/{rng.randint(1, 9_999)}", rng.choice((200, 301, 404))),
            )
        )
        return request(rng.choice(clients), method, path, status)

    entries = fill(routine, size, lambda e: len(e[2]) + 190)
    status = rng.choice((500, 502, 503, 504))
    if rng.random() < 0.5:
        ip = ipv4(rng, private=False)
        path = f"/api/v1/checkout/{alnum(rng, 10, lower=True)}/confirm"
        failed = request(ip, "POST", path, status)
        plant(rng, entries, [failed])
        for _ in range(rng.randint(2, 6)):  # the same client's other requests, all fine
            plant(rng, entries, [request(ip, "GET", f"/api/v1/carts/{rng.randint(1, 9_999)}", 200)])
        question = rng.choice(
            (
                f"A customer at {ip} says checkout failed. What did their request get back?",
                f"Find what {ip} hit when their checkout broke.",
            )
        )
        facts = [Fact((ip, path, str(status)), "asked", f"{ip} got {status} on POST {path}")]
    else:
        failed_list = []
        for _ in range(rng.randint(1, 2)):
            path = paths(
                lambda: (
                    f"/api/v1/uploads/{rng.choice(('avatar', 'invoice', 'import'))}/"
                    f"{rng.randint(10_000, 99_999)}"
                )
            )
            failed_list.append(request(rng.choice(clients), "PUT", path, status))
        plant(rng, entries, failed_list)
        question = rng.choice(
            (
                "Users report errors on uploads. Any 5xx responses in the access log?",
                "Did nginx return server errors in the last hour? Which requests?",
            )
        )
        facts = [
            Fact((e[2], str(status)), "standout", f"{e[1]} {e[2]} returned {status}")
            for e in failed_list
        ]
    clock = Clock(rng, step_s=(0.0, 0.6))
    out = []
    for ip, method, path, code in entries:
        t = clock.tick()
        slow = code >= 500
        rt = rng.uniform(30, 60) if slow and code == 504 else rng.uniform(0.001, 0.4)
        size_bytes = rng.randint(150, 600) if code >= 300 else rng.randint(400, 90_000)
        out.append(
            f'{ip} - - [{t:%d/%b/%Y:%H:%M:%S} +0000] "{method} {path} HTTP/1.1" {code} '
            f'{size_bytes} "-" "{rng.choice(_AGENTS)}" rt={rt:.3f} '
            f"uct=0.001 urt={rt - 0.001 if rt > 0.001 else 0:.3f}"
        )
    arguments = {"command": "tail -n 20000 /var/log/nginx/access.log"}
    return "\n".join(out) + "\n", "shell", arguments, question, facts


# -- systemd journal -------------------------------------------------------------------------
def _journald(rng: random.Random, size: int) -> tuple:
    host = f"{rng.choice(('web', 'app', 'worker'))}-{rng.randint(1, 40)}"
    unit = f"{rng.choice(SERVICES)}-sync"
    pid = rng.randint(1_000, 60_000)

    def routine() -> tuple[str, str]:
        session = rng.randint(100, 9_999)
        user = login(rng)
        return rng.choice(
            (
                (
                    "systemd[1]",
                    f"Started session-{session}.scope - Session {session} of User deploy.",
                ),
                ("systemd-logind[612]", f"New session {session} of user deploy."),
                (
                    "CRON[" + str(rng.randint(1_000, 60_000)) + "]",
                    "(root) CMD (/usr/local/bin/rotate-logs >/dev/null 2>&1)",
                ),
                (
                    "sshd[" + str(rng.randint(1_000, 60_000)) + "]",
                    f"Accepted publickey for {user} from {ipv4(rng)} port "
                    f"{rng.randint(30_000, 65_000)} ssh2: ED25519 SHA256:{alnum(rng, 43)}",
                ),
                (
                    f"{unit}[{pid}]",
                    f"synced {rng.randint(10, 900)} records in {rng.uniform(0.2, 9):.1f}s",
                ),
                (f"{unit}[{pid}]", f"next run in {rng.choice((30, 60, 120))}s"),
                (
                    "dockerd[911]",
                    f'level=info msg="ignoring event" container={hexid(rng, 64)} '
                    "module=libcontainerd namespace=moby topic=/tasks/delete "
                    'type="*events.TaskDelete"',
                ),
                ("kernel", f"eth0: renamed from veth{hexid(rng, 7)}"),
            )
        )

    entries = fill(routine, size, lambda e: len(e[1]) + 40)
    if rng.random() < 0.5:
        victim_pid = rng.randint(2_000, 4_000_000)
        victim = rng.choice(("gunicorn", "java", "node", "python3", "postgres"))
        kill = (
            "kernel",
            f"Out of memory: Killed process {victim_pid} ({victim}) total-vm:"
            f"{rng.randint(2, 9)}{rng.randint(100_000, 999_999)}kB, anon-rss:"
            f"{rng.randint(1, 8)}{rng.randint(100_000, 999_999)}kB, file-rss:0kB, shmem-rss:0kB, "
            f"UID:1000 pgtables:{rng.randint(1_000, 9_999)}kB oom_score_adj:0",
        )
        plant(rng, entries, [kill])
        question = rng.choice(
            (
                f"The app on {host} died overnight. What killed it?",
                f"Something restarted on {host} around 3am; check the journal.",
            )
        )
        facts = [
            Fact(
                (f"Killed process {victim_pid}", victim),
                "standout",
                f"the OOM killer killed {victim} ({victim_pid})",
            )
        ]
    else:
        cause = rng.choice(
            (
                "psycopg2.OperationalError: could not connect to server: Connection refused",
                "FATAL: password authentication failed for user sync",
                "error: failed to read /etc/sync/config.toml: permission denied",
            )
        )
        at = rng.randrange(len(entries) + 1)
        entries[at:at] = [
            (f"{unit}[{pid}]", cause),
            ("systemd[1]", f"{unit}.service: Main process exited, code=exited, status=1/FAILURE"),
            ("systemd[1]", f"{unit}.service: Failed with result 'exit-code'."),
        ]
        phrase = cause.split(": ", 1)[1] if cause.startswith("psycopg2") else cause
        question = rng.choice(
            (
                f"Why did {unit} stop on {host}?",
                f"{unit} isn't syncing anymore; what does the journal say?",
            )
        )
        facts = [
            Fact(
                (f"{unit}.service", "Failed with result 'exit-code'"),
                "asked",
                f"{unit}.service failed",
            ),
            Fact((unit, phrase), "asked", f"{unit} failed because: {cause}"),
        ]
    clock = Clock(rng, step_s=(0.0, 8.0))
    out = [
        f"{clock.tick():%b %d %H:%M:%S} {host} {source}: {message}" for source, message in entries
    ]
    arguments = {"command": "journalctl --since today --no-pager"}
    return "\n".join(out) + "\n", "shell", arguments, question, facts


_BUILDERS = {"app": _app, "nginx": _nginx, "journald": _journald}
