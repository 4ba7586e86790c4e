"""``read_table``: the header, a summary of the columns, and the rows the call needs."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governor import TokenCounter
from policies.readers import Query, Tier, fit
from policies.readers.tables import read_table
from tests.policies.readers.samples import others

COUNTER = TokenCounter()


def kubectl_pods(seed: int, *, n: int = 150) -> tuple[str, int, int]:
    """``kubectl get pods``: one pod in CrashLoopBackOff with many restarts, one Pending."""
    rng = random.Random(seed)
    crashing, pending = rng.sample(range(n), 2)
    lines = ["NAME                                 READY   STATUS             RESTARTS        AGE"]
    for i in range(n):
        name = f"checkout-{rng.getrandbits(36):09x}-{rng.getrandbits(20):05x}"
        status, restarts, age = "Running", "0", f"{rng.randint(2, 40)}d"
        if i == crashing:
            status, restarts = "CrashLoopBackOff", "112 (3m12s ago)"
        elif i == pending:
            status, age = "Pending", "41s"
        lines.append(f"{name:<37}{'1/1':<8}{status:<19}{restarts:<16}{age}")
    return "\n".join(lines), crashing + 1, pending + 1


def ps_aux(seed: int, *, n: int = 300) -> tuple[str, int]:
    """``ps aux``: right-aligned numbers, single-space header gaps, one busy process."""
    rng = random.Random(seed)
    busy = rng.randrange(n)
    lines = ["USER         PID %CPU %MEM    VSZ   RSS TTY      STAT START   TIME COMMAND"]
    commands = ("/usr/sbin/sshd -D", "/usr/bin/python3 worker.py --queue default", "[kworker/0:1]")
    for i in range(n):
        cpu = 97.3 if i == busy else rng.choice((0.0, 0.0, 0.0, 0.1, 0.3))
        lines.append(
            f"{rng.choice(('root', 'www-data', 'postgres')):<8}{rng.randint(1, 99999):>8} "
            f"{cpu:>4} {rng.uniform(0, 2):>4.1f} {rng.randint(1000, 999999):>6} "
            f"{rng.randint(100, 99999):>5} ?        Ss   Mar01   0:{rng.randint(0, 59):02d} "
            f"{rng.choice(commands)}"
        )
    return "\n".join(lines), busy + 1


DF = """\
Filesystem      Size  Used Avail Use% Mounted on
udev            7.8G     0  7.8G   0% /dev
tmpfs           1.6G  2.1M  1.6G   1% /run
/dev/nvme0n1p2  468G  440G  4.5G  99% /
tmpfs           7.8G  124M  7.7G   2% /dev/shm
tmpfs           5.0M  4.0K  5.0M   1% /run/lock
/dev/nvme0n1p1  511M  6.1M  505M   2% /boot/efi
/dev/sdb1       1.8T  1.2T  600G  67% /mnt/data"""


def psql(seed: int, *, n: int = 400) -> tuple[str, list[int]]:
    """psql's aligned output with its ``(400 rows)`` footer; two refunded payments."""
    rng = random.Random(seed)
    refunded = sorted(rng.sample(range(n), 2))
    lines = [
        "  id  | customer_id |  amount  |  status  |       created_at",
        "------+-------------+----------+----------+------------------------",
    ]
    for i in range(n):
        status = "refunded" if i in refunded else "paid"
        lines.append(
            f" {1000 + i:>4} | cus_{rng.getrandbits(28):07x} | {rng.uniform(5, 500):8.2f} |"
            f" {status:<8} | 2026-02-{1 + i % 28:02d} {i % 24:02d}:00:00+00"
        )
    lines.append(f"({n} rows)")
    return "\n".join(lines), [i + 2 for i in refunded]


def mysql(seed: int, *, n: int = 300) -> str:
    rng = random.Random(seed)
    border = "+------+-----------+-------+-----------+"
    lines = ["mysql> SELECT id, user, score, region FROM scores;", border]
    lines += ["| id   | user      | score | region    |", border]
    for i in range(n):
        region = rng.choice(("us-east-1", "eu-west-1"))
        lines.append(f"| {i:<4} | user_{i:<4} | {rng.randint(50, 99):<5} | {region:<9} |")
    lines += [border, f"{n} rows in set (0.01 sec)"]
    return "\n".join(lines)


def markdown_table(seed: int, *, n: int = 200) -> tuple[str, int]:
    rng = random.Random(seed)
    slow = rng.randrange(n)
    lines = ["## Latency by service", "", "| Service | p99 (ms) | Owner |", "|---|---:|---|"]
    for i in range(n):
        lines.append(f"| svc-{i} | {9400 if i == slow else rng.randint(20, 80)} | team-{i % 4} |")
    return "\n".join(lines), slow + 4


def csv_export(seed: int, delimiter: str = ",", *, n: int = 500) -> tuple[str, list[int]]:
    rng = random.Random(seed)
    disputed = sorted(rng.sample(range(n), 2))
    lines = [delimiter.join(("order_id", "customer", "amount", "currency", "status", "created"))]
    for i in range(n):
        status = "disputed" if i in disputed else "completed"
        lines.append(
            delimiter.join(
                (
                    f"ord_{i:05d}",
                    f'"Doe{delimiter} Jane"' if i % 7 == 0 else f"cust_{rng.randint(1, 90)}",
                    f"{rng.uniform(1, 300):.2f}",
                    "EUR",
                    status,
                    f"2026-02-{1 + i % 28:02d}",
                )
            )
        )
    return "\n".join(lines), [i + 1 for i in disputed]


def test_the_crashing_and_pending_pods_are_kept_under_the_header() -> None:
    text, crashing, pending = kubectl_pods(1)
    lines = text.split("\n")
    reading = read_table(text, Query.of("shell", {"cmd": "kubectl get pods -n prod"}))
    assert reading is not None and reading.method == "table"
    fitted = fit(reading, 250, COUNTER)
    assert fitted is not None and fitted.tokens <= 250 < COUNTER.count(text) // 10
    kept = fitted.text.split("\n")
    oldest = max(int(line.split()[-1][:-1]) for line in lines[1:] if line.endswith("d"))
    assert kept[0] == (
        "[table: 150 rows, 5 columns; READY 1/1 150; "
        "STATUS Running 148, CrashLoopBackOff 1, Pending 1; "
        f"RESTARTS 0 149, 112 (3m12s ago) 1; AGE 41s-{oldest}d]"
    )
    assert kept[1] == lines[0]
    assert lines[crashing] in kept and lines[pending] in kept
    in_order = sorted((crashing, pending))
    assert kept.index(lines[in_order[0]]) < kept.index(lines[in_order[1]])
    ranks = {piece.text: piece.rank for piece in reading.pieces}
    assert ranks[lines[crashing]][0] == Tier.ALARM and ranks[lines[pending]][0] == Tier.STANDOUT


def test_a_threshold_in_the_question_picks_rows_in_the_column_with_its_unit() -> None:
    text, busy = ps_aux(2)
    lines = text.split("\n")
    reading = read_table(text, Query.of("shell", {"cmd": "ps aux"}, "what uses more than 50% CPU?"))
    assert reading is not None
    asked = [piece.text for piece in reading.pieces if piece.rank[0] == Tier.ASKED]
    assert asked == [lines[busy]]
    fitted = fit(reading, 200, COUNTER)
    assert fitted is not None and fitted.tokens <= 200 < COUNTER.count(text) // 20
    assert lines[busy] in fitted.text.split("\n")
    assert "%CPU 0.0-97.3" in fitted.text


@pytest.mark.parametrize(
    ("question", "mounts"),
    [
        ("Which filesystems have Use% above 90%?", ["/"]),
        ("anything with less than 1 GB available?", ["/run/lock", "/boot/efi"]),
        ("disks over 1.5 TB in size", ["/mnt/data"]),
    ],
)
def test_thresholds_compare_sizes_and_percentages_in_the_named_column(
    question: str, mounts: list[str]
) -> None:
    reading = read_table(DF, Query.of("shell", {"cmd": "df -h"}, question))
    assert reading is not None
    asked = [piece.text for piece in reading.pieces if piece.rank[0] == Tier.ASKED]
    assert [line.split()[-1] for line in asked] == mounts
    assert reading.pieces[1].text == DF.split("\n")[0]


def test_psql_keeps_its_header_rule_and_footer_and_the_rare_status() -> None:
    text, refunded = psql(3)
    lines = text.split("\n")
    reading = read_table(text, Query.of("sql", {"query": "select * from payments"}))
    assert reading is not None
    fitted = fit(reading, 200, COUNTER)
    assert fitted is not None and fitted.tokens <= 200 < COUNTER.count(text) // 20
    kept = fitted.text.split("\n")
    assert kept[0].startswith("[table: 400 rows, 5 columns; id 1000-1399; amount ")
    assert kept[0].endswith("status paid 398, refunded 2]")
    assert kept[1:3] == lines[:2] and kept[-1] == "(400 rows)"
    assert all(lines[i] in kept for i in refunded)


def test_a_mysql_box_keeps_its_borders_and_the_asked_row() -> None:
    text = mysql(4)
    lines = text.split("\n")
    asked = next(line for line in lines if "user_217 " in line)
    reading = read_table(text, Query.of("mysql", {"sql": "... WHERE user = 'user_217'"}))
    assert reading is not None
    fitted = fit(reading, 200, COUNTER)
    assert fitted is not None and fitted.tokens <= 200 < COUNTER.count(text) // 20
    kept = fitted.text.split("\n")
    assert kept[0] == lines[0]  # the statement above the box is kept as its title
    assert kept[2:5] == lines[1:4] and kept[-2:] == lines[-2:]
    assert asked in kept


def test_a_markdown_table_keeps_its_outlier() -> None:
    text, slow = markdown_table(5)
    lines = text.split("\n")
    reading = read_table(text, Query.of())
    assert reading is not None
    fitted = fit(reading, 160, COUNTER)
    assert fitted is not None and fitted.tokens <= 160 < COUNTER.count(text) // 10
    kept = fitted.text.split("\n")
    assert lines[0] in kept and lines[2] + "\n" + lines[3] in fitted.text
    assert lines[slow] in kept
    assert "p99 (ms) 20-9400" in fitted.text or "p99 (ms) 21-9400" in fitted.text


@pytest.mark.parametrize("delimiter", [",", "\t", ";"])
def test_delimited_exports_keep_the_header_and_rare_rows_as_printed(delimiter: str) -> None:
    text, disputed = csv_export(6, delimiter)
    lines = text.split("\n")
    reading = read_table(text, Query.of())
    assert reading is not None
    fitted = fit(reading, 200, COUNTER)
    assert fitted is not None and fitted.tokens <= 200 < COUNTER.count(text) // 20
    kept = fitted.text.split("\n")
    kind = "tsv" if delimiter == "\t" else "csv"
    assert kept[0].startswith(f"[{kind}: 500 rows, 6 columns;")
    assert "status completed 498, disputed 2" in kept[0]
    assert kept[1] == lines[0]
    assert all(lines[i] in kept for i in disputed)


def test_several_tables_each_keep_their_header() -> None:
    pods, _, _ = kubectl_pods(7, n=8)
    services = (
        "NAME                 TYPE        CLUSTER-IP     EXTERNAL-IP   PORT(S)   AGE\n"
        "service/checkout     ClusterIP   10.96.12.4     <none>        80/TCP    40d\n"
        "service/kubernetes   ClusterIP   10.96.0.1      <none>        443/TCP   90d"
    )
    text = pods + "\n\n" + services
    reading = read_table(text, Query.of())
    assert reading is not None
    headers = [p.text for p in reading.pieces if p.rank[0] == Tier.SHAPE and "[" not in p.text]
    assert headers == [pods.split("\n")[0], services.split("\n")[0]]
    assert [p.count for p in reading.pieces if p.what == "rows"] == [1] * 10


def test_a_coverage_report_keeps_its_total_and_the_modules_below_the_threshold() -> None:
    rng = random.Random(9)
    lines = [f"{'Name':<34}{'Stmts':>7}{'Miss':>7}{'Cover':>7}", "-" * 55]
    covers = []
    for i in range(120):
        stmts = rng.randint(40, 400)
        miss = rng.randint(0, stmts // 12)
        covers.append(100 * (stmts - miss) // stmts)
        lines.append(f"{f'src/shop/module_{i}.py':<34}{stmts:>7}{miss:>7}{f'{covers[-1]}%':>7}")
    lines += ["-" * 55, f"{'TOTAL':<34}{31337:>7}{1204:>7}{'96%':>7}"]
    text = "\n".join(lines)
    question = "Which modules have coverage below 93%?"
    reading = read_table(text, Query.of("shell", {"cmd": "pytest --cov=src"}, question))
    assert reading is not None
    asked = [piece.text for piece in reading.pieces if piece.rank[0] == Tier.ASKED]
    assert asked == [lines[i + 2] for i, cover in enumerate(covers) if cover < 93]
    assert [p.text for p in reading.pieces[-2:]] == lines[-2:]
    assert all(p.rank[0] == Tier.SHAPE for p in reading.pieces[-2:])


def test_an_exited_container_is_an_alarm_among_containers_up_for_hours() -> None:
    rng = random.Random(10)
    header = "CONTAINER ID   IMAGE          COMMAND                  CREATED       STATUS"
    header += "                       PORTS     NAMES"
    lines = [header]
    for i in range(40):
        status = f"Up {rng.randint(2, 9)} hours" if i != 17 else "Exited (137) 2 hours ago"
        lines.append(
            f"{rng.getrandbits(48):012x}   redis:7.2      "
            f'"docker-entrypoint.s…"   {rng.randint(2, 9)} hours ago   {status:<29}'
            f"6379/tcp  cache_{i}"
        )
    text = "[INFO] listing containers\n" + "\n".join(lines)
    reading = read_table(text, Query.of("shell", {"cmd": "docker ps -a"}))
    assert reading is not None
    assert reading.pieces[0].text == "[INFO] listing containers"  # a title, kept
    assert "STATUS Up # hours 39, Exited (#) # hours ago 1" in reading.pieces[1].text
    alarms = [piece.text for piece in reading.pieces if piece.rank[0] == Tier.ALARM]
    assert alarms == [lines[18]]


def test_every_row_is_an_original_line() -> None:
    for text in (kubectl_pods(8)[0], ps_aux(8)[0], DF, psql(8)[0], markdown_table(8)[0]):
        reading = read_table(text, Query.of())
        assert reading is not None
        lines = set(text.split("\n"))
        assert all(piece.text in lines for piece in reading.pieces if piece.what == "rows")


PROSE = (
    "The migration finished, but the indexes were rebuilt twice, which doubled the time.\n"
    "We should, in the next release, batch the writes, cache the lookups, and retry less.\n"
) * 30
PYTHON_LOG = "\n".join(
    f"2026-03-04 10:00:{i % 60:02d},{i * 7 % 1000:03d} - app.worker - INFO - batch {i} took "
    f"{i * 13 % 900} ms for tenant acme"
    for i in range(200)
)
LS_L = "total 1024\n" + "\n".join(
    f"-rw-r--r--  1 root root {i * 997 % 99999:>6} Mar  4 10:{i % 60:02d} file_{i}.py"
    for i in range(60)
)
DIFF_OF_A_TABLE = "diff --git a/docs/t.md b/docs/t.md\n--- a/docs/t.md\n+++ b/docs/t.md\n" + (
    "@@ -1,3 +1,3 @@\n | a | b |\n |---|---|\n-| 1 | 2 |\n+| 1 | 3 |\n" * 10
)
LS_GRID = "\n".join(
    f"{f'app_{i}.py':<14}{f'config_{i}.yaml':<18}{f'README_{i}.md':<14}test_{i}.py"
    for i in range(12)
)
JSON_LINES = "\n".join(f'{{"id": {i}, "level": "info", "msg": "ok"}}' for i in range(50))
BRACKET_LOG = "\n".join(f"[INFO] 2026-03-04 10:00:{i:02d} step {i}, done" for i in range(50))


@pytest.mark.parametrize("kind", ["diff", "log", "listing", "prose", "html", "json", "pytest"])
def test_other_outputs_are_not_tables(kind: str) -> None:
    assert read_table(others(4)[kind], Query.of()) is None


@pytest.mark.parametrize(
    "text", [PROSE, PYTHON_LOG, LS_L, LS_GRID, DIFF_OF_A_TABLE, JSON_LINES, BRACKET_LOG]
)
def test_prose_logs_listings_and_diffs_with_table_marks_are_not_tables(text: str) -> None:
    assert read_table(text, Query.of()) is None


@settings(max_examples=80, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("|+-, \t\nAB01.%:")), max_size=400))
def test_any_text_is_read_or_refused_and_fits(text: str) -> None:
    for prefix in ("", "NAME   READY   STATUS\n", "+----+----+\n| a  | b  |\n+----+----+\n"):
        reading = read_table(prefix + text, Query.of("t", {"q": "AB01"}, "above 5%"))
        if reading is not None:
            fitted = fit(reading, 40, COUNTER)
            assert fitted is None or fitted.tokens <= 40


def orders_export(seed: int, delimiter: str = ",", *, n: int = 200) -> tuple[str, list[str]]:
    """A SQL client's export of orders: ids of nine digits, amounts with two decimals (a
    decimal comma where ``;`` delimits, as European locales write them)."""
    rng = random.Random(seed)
    names = ("order_id", "created_at", "email", "status", "items", "amount", "currency", "country")
    lines = [delimiter.join(names)]
    for i in range(n):
        amount = f"{rng.uniform(5, 2000):.2f}"
        if delimiter == ";":
            amount = amount.replace(".", ",")
        fields = (
            str(rng.randint(10**8, 10**9 - 1)),
            f"2026-03-04 {i // 60 % 24:02d}:{i % 60:02d}:00",
            f"{rng.choice(('ana', 'li', 'sam', 'kim'))}{i}@example.com",
            rng.choice(("paid", "shipped", "pending", "refunded")),
            str(rng.randint(1, 6)),
            amount,
            rng.choice(("EUR", "USD")),
            rng.choice(("DE", "FR", "ES", "NL", "PL")),
        )
        lines.append(delimiter.join(fields))
    return "\n".join(lines), lines


@pytest.mark.parametrize("delimiter", [",", "\t", ";"])
def test_an_id_in_the_question_picks_its_row(delimiter: str) -> None:
    text, lines = orders_export(21, delimiter)
    row = lines[1 + random.Random(22).randrange(200)]
    order = row.split(delimiter)[0]
    question = f"Can you look up order {order} for me?"
    reading = read_table(text, Query.of("sql", {"query": "SELECT * FROM orders"}, question))
    assert reading is not None and reading.pieces[1].text == lines[0]
    assert [p.text for p in reading.pieces if p.rank[0] == Tier.ASKED] == [row]
    fitted = fit(reading, 200, COUNTER)
    assert fitted is not None and row in fitted.text.split("\n")


def test_decimal_commas_are_numbers_where_semicolons_delimit() -> None:
    text, lines = orders_export(23, ";")
    reading = read_table(text, Query.of("sql", {}, "Which orders have an amount over 1900?"))
    assert reading is not None and reading.pieces[0].text.startswith("[csv: 200 rows, 8 columns")
    amounts = {line: float(line.split(";")[5].replace(",", ".")) for line in lines[1:]}
    asked = [p.text for p in reading.pieces if p.rank[0] == Tier.ASKED]
    assert asked == [line for line, amount in amounts.items() if amount > 1900] != []


def test_a_threshold_in_percent_compares_a_column_named_in_percent() -> None:
    rng = random.Random(24)
    lines = ["hostname,zone,load_pct,swap_pct,fs_used_pct"]
    for i in range(150):
        used = 97.5 if i == 61 else round(rng.uniform(5, 85), 1)
        load, swap = round(rng.uniform(1, 99), 1), round(rng.uniform(10, 99), 1)
        lines.append(f"web-{i},{rng.choice(('zone-a', 'zone-b'))},{load},{swap},{used}")
    text = "\n".join(lines)
    question = "Which machines have their filesystem over 90% used?"
    reading = read_table(text, Query.of("read_file", {}, question))
    assert reading is not None
    assert [p.text for p in reading.pieces if p.rank[0] == Tier.ASKED] == [lines[62]]


def test_a_threshold_after_its_number_counts() -> None:
    text, crashing, _ = kubectl_pods(25)
    question = "Which pods have 100 restarts or more?"
    reading = read_table(text, Query.of("shell", {"cmd": "kubectl get pods"}, question))
    assert reading is not None
    asked = [p.text for p in reading.pieces if p.rank[0] == Tier.ASKED]
    assert asked == [text.split("\n")[crashing]]


def jobs_box(seed: int, *, n: int = 120) -> tuple[str, int]:
    """mysql's box around a jobs table: a few queued jobs, one failed with its error."""
    rng = random.Random(seed)
    failed = rng.randrange(n)
    border = "+--------+-----------+---------+----------------------------------+"
    lines = ["+--------+-----------+---------+----------------------------------+"]
    lines += ["| id     | queue     | status  | last_error                       |", border]
    for i in range(n):
        status = "failed" if i == failed else rng.choice(("done",) * 8 + ("queued",))
        error = "Deadlock found when trying to get" if i == failed else "NULL"
        lines.append(
            f"| {5000 + i:<6} | {rng.choice(('mail', 'exports')):<9} | {status:<7} | {error:<32} |"
        )
    lines += [border, f"{n} rows in set (0.03 sec)"]
    return "\n".join(lines), failed + 3


def test_a_term_naming_a_column_picks_no_row_and_the_frame_gives_way_to_an_alarm() -> None:
    text, failed = jobs_box(26)
    lines = text.split("\n")
    sql = "SELECT id, queue, status, last_error FROM jobs ORDER BY id"
    reading = read_table(text, Query.of("mysql", {"query": sql}, "Which jobs died, and why?"))
    assert reading is not None
    assert not [p for p in reading.pieces if p.rank[0] == Tier.ASKED]  # not "queued" rows
    ranks = {p.text: p.rank[0] for p in reading.pieces}
    assert ranks[lines[failed]] == Tier.ALARM
    assert ranks[lines[-1]] == ranks[lines[-2]] == Tier.CONTEXT  # a closing border, a count
    fitted = fit(reading, 150, COUNTER)
    assert fitted is not None and lines[failed] in fitted.text.split("\n")


def test_failures_in_a_quarter_of_the_rows_or_fewer_are_alarms() -> None:
    rng = random.Random(27)
    lines = ["NAME                 STATUS      AGE"]
    statuses = ["Completed"] * 34 + ["Failed"] * 6
    rng.shuffle(statuses)
    lines += [
        f"backup-{i:<14}{status:<12}{rng.randint(1, 9)}h" for i, status in enumerate(statuses)
    ]
    reading = read_table("\n".join(lines), Query.of("shell", {"cmd": "kubectl get jobs"}))
    assert reading is not None
    alarms = [p.text for p in reading.pieces if p.rank[0] == Tier.ALARM]
    assert alarms == [line for line in lines[1:] if "Failed" in line]


def test_the_summary_keeps_four_stats_the_most_telling() -> None:
    text, _ = orders_export(28)
    reading = read_table(text, Query.of())
    assert reading is not None
    summary = reading.pieces[0].text
    assert summary.count(";") == 4  # the size, then four columns
    assert "order_id" not in summary  # ids' range says least
    assert "amount " in summary and "status " in summary


def test_sizes_beside_paths_are_a_listing_not_a_table() -> None:
    rng = random.Random(29)
    du = "\n".join(
        f"{rng.choice(('4.0K', '12K', '1.1M', '640K', '3.2G'))}\t./src/module_{i}/file_{i}.py"
        for i in range(80)
    )
    assert read_table(du + "\n9.9G\t.", Query.of("shell", {"cmd": "du -ah ."})) is None


def test_the_folders_of_a_path_read_pick_no_row() -> None:
    rng = random.Random(30)
    lines = ["host,team,load_pct"]
    teams = ["reports"] * 4 + ["search", "api", "web"] * 30
    lines += [f"h{i},{team},{rng.randint(1, 99)}" for i, team in enumerate(teams)]
    text = "\n".join(lines)
    reading = read_table(text, Query.of("read_file", {"path": "/srv/reports/hosts.csv"}))
    assert reading is not None
    assert not [p for p in reading.pieces if p.rank[0] == Tier.ASKED]


def test_a_mark_the_question_says_values_crossed_is_a_threshold() -> None:
    rng = random.Random(31)
    lines = ["host;zone;cpu_pct;mem_pct"]
    for i in range(120):
        cpu = f"{rng.uniform(1, 85):.1f}".replace(".", ",")
        lines.append(f"db-{i};zone-{i % 3};{'93,4' if i == 77 else cpu};{rng.randint(10, 99)},0")
    question = "We were paged for CPU at 90% an hour ago. Which hosts crossed it?"
    reading = read_table("\n".join(lines), Query.of("read_file", {"path": "fleet.csv"}, question))
    assert reading is not None
    assert [p.text for p in reading.pieces if p.rank[0] == Tier.ASKED] == [lines[78]]


def test_ps_aux_with_values_wider_than_their_column_is_split_at_its_spaces() -> None:
    rng = random.Random(32)
    lines = ["USER         PID %CPU %MEM    VSZ   RSS TTY      STAT START   TIME COMMAND"]
    for i in range(80):  # as ps prints them: a wide value pushes the rest of its row right
        vsz, rss = rng.choice(((1689044, 556348), (22079, 693), (141926, 40642)))
        mem = 61.5 if i == 40 else rng.choice((0.0, 0.3, 1.2))
        lines.append(
            f"{rng.choice(('root', 'www-data', 'postgres')):<8} {rng.randint(100, 4_000_000):>7} "
            f"{rng.uniform(0, 9):>4.1f} {mem:>4.1f} {vsz:>7} {rss:>6} "
            f"{rng.choice(('?', 'pts/0', 'pts/12')):<8} {rng.choice(('Sl', 'S', 'I<', 'Ssl')):<4} "
            f"{rng.choice(('11:40', 'Mar04'))} {rng.randint(1, 9000)}:{rng.randint(0, 59):02d} "
            f"/usr/bin/worker --queue q{i}"
        )
    text = "\n".join(lines)
    reading = read_table(text, Query.of("shell", {"cmd": "ps aux"}, "What uses all the memory?"))
    assert reading is not None and reading.pieces[1].text == lines[0]
    assert "%MEM" in reading.pieces[0].text
    standouts = [p.text for p in reading.pieces if p.rank[0] == Tier.STANDOUT]
    assert lines[41] in standouts
