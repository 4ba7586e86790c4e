"""CSV and TSV exports: query results (orders) and fleet metrics (one row per host).

Three dialects: ``csv`` (comma, quoted only where needed), ``tsv`` (tab) and
``csv_semicolon`` (a European spreadsheet export: semicolons and decimal commas). The facts
are the row the question names (an order id) or the rows over a threshold it names
("which hosts are above 90% disk?"), among near misses just under it.
"""

from __future__ import annotations

import csv
import io
import random

from policies.benchmarks.tool_outputs._common import (
    REGIONS,
    SERVICES,
    Clock,
    Unique,
    email,
    fill,
    num_chars,
    plant,
)
from policies.benchmarks.tool_outputs.case import Case, Fact

__all__ = ["FORMATS", "build"]

FORMATS = ("csv", "tsv", "csv_semicolon")
_CHARS_PER_TOKEN = {"csv": 1.85, "tsv": 2.05, "csv_semicolon": 2.0}
_DELIMITERS = {"csv": ",", "tsv": "\t", "csv_semicolon": ";"}


def build(rng: random.Random) -> Case:
    fmt = rng.choice(FORMATS)
    size = num_chars(rng, _CHARS_PER_TOKEN[fmt])
    decimal = "," if fmt == "csv_semicolon" else "."
    table = rng.choice((_orders, _fleet))
    header, rows, tool, arguments, question, facts = table(rng, size, decimal)
    out = io.StringIO()
    writer = csv.writer(out, delimiter=_DELIMITERS[fmt], lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    if fmt == "tsv" and tool == "sql_query":
        arguments["format"] = "tsv"
    elif fmt == "tsv":
        arguments["path"] = arguments["path"].replace(".csv", ".tsv")
    return Case("csv", fmt, tool, arguments, question, out.getvalue(), tuple(facts))


def _num(value: float, decimal: str, places: int = 2) -> str:
    return f"{value:.{places}f}".replace(".", decimal)


_STATUSES = (
    "paid",
    "paid",
    "paid",
    "shipped",
    "shipped",
    "delivered",
    "refunded",
    "pending",
    "cancelled",
)
_PRODUCTS = (
    "Walnut desk, 140 cm",
    "Standing mat",
    "Monitor arm (dual)",
    "Cable tray",
    "Desk lamp",
    "Ergonomic chair",
    "Footrest",
    "Laptop stand",
    "Whiteboard, 90x60",
)


def _orders(rng: random.Random, size: int, decimal: str) -> tuple:
    clock = Clock(rng, step_s=(10, 900))
    ids = Unique()
    header = [
        "order_id",
        "created_at",
        "customer_email",
        "status",
        "items",
        "first_item",
        "amount",
        "currency",
        "country",
    ]

    def row() -> list[str]:
        return [
            ids(lambda: str(rng.randint(100_000_000, 999_999_999))),
            "",  # stamped in order once planted
            email(rng),
            rng.choice(_STATUSES),
            str(rng.randint(1, 6)),
            rng.choice(_PRODUCTS),
            _num(rng.uniform(9, 1_900), decimal),
            rng.choice(("EUR", "EUR", "USD", "GBP")),
            rng.choice(("DE", "FR", "NL", "US", "GB", "ES", "IT", "PL")),
        ]

    rows = fill(row, size, lambda r: len(",".join(r)) + 20)
    targets = [row() for _ in range(rng.choice((1, 1, 2)))]
    plant(rng, rows, targets)
    for each in rows:
        each[1] = clock.tick().strftime("%Y-%m-%d %H:%M:%S")
    since = rows[0][1][:10]
    numbers = " and ".join(t[0] for t in targets)
    question = rng.choice(
        (
            f"What's the status and total of order {numbers}?",
            f"A customer is asking about order {numbers}. Has it shipped, and how much was it?",
        )
    )
    arguments = {
        "query": "SELECT o.id AS order_id, o.created_at, c.email AS customer_email, "
        "o.status, o.item_count AS items, o.first_item, o.amount, o.currency, o.country "
        f"FROM orders o JOIN customers c ON c.id = o.customer_id WHERE o.created_at >= "
        f"'{since}' ORDER BY o.created_at",
        "database": "shop",
    }
    facts = [
        Fact((t[0], t[3], t[6]), "asked", f"order {t[0]} is {t[3]}, {t[6]} {t[7]}") for t in targets
    ]
    return header, rows, "sql_query", arguments, question, facts


_ROLES = ("web", "api", "worker", "db", "cache", "kafka", "search", "batch")
_METRICS = {"disk": "disk_used_pct", "memory": "mem_used_pct", "CPU": "cpu_pct"}


def _fleet(rng: random.Random, size: int, decimal: str) -> tuple:
    hosts = Unique()
    header = [
        "host",
        "region",
        "service",
        "cpu_pct",
        "mem_used_pct",
        "disk_used_pct",
        "load1",
        "uptime_days",
    ]
    metric = rng.choice(tuple(_METRICS))
    column = header.index(_METRICS[metric])
    threshold = rng.choice((85, 90, 95))

    def row(over: bool = False) -> list[str]:
        region = rng.choice(REGIONS)
        host = hosts(lambda: f"{rng.choice(_ROLES)}-{region}-{rng.randint(1, 400):03d}")
        values = [rng.uniform(3, 80), rng.uniform(20, 88), rng.uniform(10, 84)]
        if rng.random() < 0.08:  # near misses just under the threshold, in the asked column
            values[column - 3] = rng.uniform(threshold - 6, threshold - 0.1)
        for other in range(3):  # other columns may be high: not what was asked
            if other != column - 3 and rng.random() < 0.04:
                values[other] = rng.uniform(threshold + 0.5, 99.9)
        if over:
            values[column - 3] = rng.uniform(threshold + 0.5, 99.8)
        elif values[column - 3] >= threshold - 0.1:
            values[column - 3] = rng.uniform(threshold - 30, threshold - 6)
        cells = [_num(v, decimal, 1) for v in values]
        return [
            host,
            region,
            rng.choice(SERVICES),
            *cells,
            _num(rng.uniform(0.1, 16), decimal),
            str(rng.randint(1, 400)),
        ]

    rows = fill(row, size, lambda r: len(",".join(r)))
    targets = [row(over=True) for _ in range(rng.randint(1, 3))]
    plant(rng, rows, targets)
    question = rng.choice(
        (
            f"Which hosts are above {threshold}% {metric}?",
            f"We got a {metric} alert at {threshold}%. Which machines crossed it?",
        )
    )
    day = Clock(rng).now.strftime("%Y-%m-%d")
    arguments = {"path": f"/srv/reports/fleet/{day}.csv"}
    facts = [Fact((t[0], t[column]), "asked", f"{t[0]} at {t[column]}% {metric}") for t in targets]
    return header, rows, "read_file", arguments, question, facts
