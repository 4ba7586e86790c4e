"""Realistic tool outputs of each kind for the readers' tests, each with one line an agent
would ask for, planted by the test (a seed places it)."""

from __future__ import annotations

import json
import random
import re

SERVICES = ("payments.worker", "http", "cache", "auth.session", "orders.api")


def git_diff(seed: int, *, files: int = 12, planted: str = "+RETRY_TIMEOUT_S = 90") -> str:
    rng = random.Random(seed)
    where = (rng.randrange(files), rng.randrange(4))
    parts = []
    for f in range(files):
        name = f"src/service/module_{f}.py"
        parts += [f"diff --git a/{name} b/{name}", f"index 3f2a{f:02d}..9c8d{f:02d} 100644"]
        parts += [f"--- a/{name}", f"+++ b/{name}"]
        for h in range(4):
            body = [f" def helper_{f}_{h}_{k}(value):" for k in range(3)]
            for k in range(3):
                body += [
                    f"-    return compute(value, {k})",
                    f"+    return compute(value, {k}, strict=True)",
                ]
            if (f, h) == where:
                body += ["-RETRY_TIMEOUT_S = 30", planted]
            body += [f"     pass  # {k}" for k in range(3)]
            old = sum(1 for line in body if line[0] in " -")
            new = sum(1 for line in body if line[0] in " +")
            start = rng.randint(1, 400)
            parts.append(f"@@ -{start},{old} +{start},{new} @@ def handler_{h}():")
            parts += body
    return "\n".join(parts)


def app_log(seed: int, *, entries: int = 900, planted: str | None = None) -> str:
    rng = random.Random(seed)
    at = rng.randrange(entries)
    lines = []
    for i in range(entries):
        stamp = f"2026-03-04T10:{i // 60 % 60:02d}:{i % 60:02d}.{rng.randint(0, 999):03d}Z"
        r = rng.random()
        if i == at and planted is not None:
            lines.append(f"{stamp} {planted}")
        elif r < 0.5:
            lines.append(f"{stamp} INFO  http GET /health 200 {rng.randint(1, 9)}ms")
        elif r < 0.8:
            order = f"ord_{rng.randint(10_000, 99_999)}"
            took = rng.randint(20, 400)
            lines.append(f"{stamp} INFO  payments.worker processed order_id={order} in {took}ms")
        elif r < 0.95:
            lines.append(f"{stamp} DEBUG cache hit key=user:{rng.randint(1, 9999)}")
        else:
            lines.append(
                f"{stamp} WARN  payments.worker slow upstream latency={rng.randint(900, 3000)}ms"
            )
    return "\n".join(lines)


def find_listing(seed: int, *, entries: int = 1500, planted: str | None = None) -> str:
    rng = random.Random(seed)
    dirs = (
        "src/app/models",
        "src/app/views",
        "src/lib/util",
        "tests/unit",
        "docs/guide",
        "deploy/k8s",
    )
    paths = []
    for i in range(entries):
        name = f"{rng.choice(('user', 'order', 'cart', 'auth'))}_{i}"
        paths.append(f"./{rng.choice(dirs)}/{name}.{rng.choice(('py', 'md', 'yaml'))}")
    if planted is not None:
        paths.insert(rng.randrange(entries), planted)
    return "\n".join(paths)


WORDS = re.findall(
    r"\w+",
    "the service handles requests from clients and stores results in a cache layer which is "
    "configured by operators during deployment of new versions",
)


def paragraphs(seed: int, n: int = 40) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        sentences = [
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 20))).capitalize() + "."
            for _ in range(5)
        ]
        out.append(" ".join(sentences))
    return out


def markdown(seed: int, planted: str) -> str:
    paras = paragraphs(seed)
    paras.insert(random.Random(seed).randrange(len(paras)), planted)
    return "# Operator guide\n\n" + "\n\n".join(paras)


def html_page(seed: int, planted: str) -> str:
    paras = paragraphs(seed)
    paras.insert(random.Random(seed).randrange(len(paras)), planted)
    body = "\n".join(f"<h2>Section {i}</h2>\n<p>{p}</p>" for i, p in enumerate(paras))
    return (
        "<!DOCTYPE html><html><head><title>Operator guide</title><script>var x = 1;</script>"
        f"</head><body><nav>Home | Docs</nav>{body}<footer>(c) 2026</footer></body></html>"
    )


def json_body(seed: int) -> str:
    rng = random.Random(seed)
    items = [
        {"id": f"ch_{rng.randint(10**8, 10**9)}", "status": "ok", "amount": rng.randint(1, 999)}
        for _ in range(300)
    ]
    return json.dumps({"object": "list", "data": items, "has_more": False}, indent=2)


def csv_export(seed: int) -> str:
    rng = random.Random(seed)
    rows = ["host,disk_used_pct,load_1m,region"]
    rows += [
        f"web-{i:03d},{rng.randint(20, 85)},{rng.random() * 4:.2f},eu-west-1" for i in range(400)
    ]
    return "\n".join(rows)


def pytest_run(seed: int) -> str:
    rng = random.Random(seed)
    lines = ["============================= test session starts =============================="]
    lines += [
        f"tests/test_api.py::test_case_{i} PASSED{' ' * 20}[{i * 100 // 400:3d}%]"
        for i in range(400)
    ]
    lines.append(
        f"========================= 400 passed in {rng.randint(2, 9)}.31s ========================="
    )
    return "\n".join(lines)


def others(seed: int) -> dict[str, str]:
    """One output of every kind, for "this reader does not claim it" checks."""
    return {
        "diff": git_diff(seed),
        "log": app_log(seed),
        "listing": find_listing(seed),
        "prose": markdown(seed, "A planted sentence about nothing in particular here."),
        "html": html_page(seed, "A planted sentence about nothing in particular here."),
        "json": json_body(seed),
        "csv": csv_export(seed),
        "pytest": pytest_run(seed),
    }
