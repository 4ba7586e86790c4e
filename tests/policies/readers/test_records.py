"""``read_json``: the envelope, a summary per collection, and the records the call needs."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governor import TokenCounter
from policies.readers import Query, Tier, fit
from policies.readers.records import read_json
from tests.policies.readers.samples import others

COUNTER = TokenCounter()


def charges(seed: int, *, n: int = 500) -> tuple[str, list[dict[str, object]]]:
    """A Stripe-like list: a few failed charges with a failure message, one huge amount."""
    rng = random.Random(seed)
    failed = set(rng.sample(range(n), 3))
    huge = rng.choice([i for i in range(n) if i not in failed])
    data: list[dict[str, object]] = []
    for i in range(n):
        charge: dict[str, object] = {
            "id": f"ch_3P{rng.getrandbits(40):010x}",
            "object": "charge",
            "amount": 2_500_000 if i == huge else rng.randint(120, 99_800),
            "currency": "usd",
            "customer": f"cus_{rng.getrandbits(32):08x}",
            "status": "succeeded",
            "created": f"2026-0{1 + i % 3}-{1 + i % 28:02d}T{i % 24:02d}:00:00Z",
            "metadata": {"order_id": f"ord_{i}"},
        }
        if i in failed:
            charge["status"] = "failed"
            charge["failure_message"] = "Your card was declined."
        data.append(charge)
    text = json.dumps({"object": "list", "data": data, "has_more": True, "url": "/v1/charges"})
    return text, data


def pod_list(seed: int, *, n: int = 40) -> tuple[str, str]:
    """``kubectl get pods -o json``: one evicted pod among running ones; its name."""
    rng = random.Random(seed)
    evicted = rng.randrange(n)
    items = []
    for i in range(n):
        status: dict[str, object] = {
            "phase": "Running",
            "podIP": f"10.1.{i}.4",
            "startTime": f"2026-03-0{1 + i % 9}T10:00:00Z",
            "containerStatuses": [
                {"name": "app", "ready": True, "restartCount": 0, "image": "registry/app:1.4.2"}
            ],
        }
        if i == evicted:
            status.update(phase="Failed", reason="Evicted", message="The node was low on memory.")
        items.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"checkout-{rng.getrandbits(24):06x}",
                    "namespace": "prod",
                    "uid": f"{rng.getrandbits(64):016x}",
                    "labels": {"app": "checkout", "tier": "backend"},
                    "managedFields": [{"manager": "kubelet", "operation": "Update"}] * 3,
                },
                "spec": {
                    "containers": [{"name": "app", "image": "registry/app:1.4.2", "ports": [80]}],
                    "nodeName": f"node-{i % 4}",
                },
                "status": status,
            }
        )
    doc = {"apiVersion": "v1", "kind": "List", "items": items, "metadata": {"resourceVersion": ""}}
    return json.dumps(doc, indent=4), items[evicted]["metadata"]["name"]  # type: ignore[index]


def request_log(seed: int, *, n: int = 400) -> tuple[str, int]:
    """Structured JSON log lines; one 500 with an error, one line that is not JSON."""
    rng = random.Random(seed)
    broken = rng.randrange(n)
    lines = []
    for i in range(n):
        entry: dict[str, object] = {
            "ts": f"2026-03-04T10:{i // 60 % 60:02d}:{i % 60:02d}Z",
            "level": "info",
            "path": f"/api/orders/{rng.randint(1000, 9999)}",
            "status": 200,
            "duration_ms": rng.randint(4, 60),
        }
        if i == broken:
            entry.update(level="error", status=500, error="upstream connect timeout")
        lines.append(json.dumps(entry))
    lines.insert(rng.randrange(n), "panic: runtime error: invalid memory address")
    return "\n".join(lines), broken


def test_failed_records_and_the_asked_record_are_kept_with_the_envelope() -> None:
    text, data = charges(1)
    asked = data[random.Random(9).randrange(len(data))]
    order = asked["metadata"]["order_id"]  # type: ignore[index]
    query = Query.of("stripe", {"order": order}, "Why did the charges fail?")
    reading = read_json(text, query)
    assert reading is not None and reading.method == "json"
    fitted = fit(reading, 600, COUNTER)
    assert fitted is not None and fitted.tokens <= 600 < COUNTER.count(text) // 20
    kept = fitted.text.split("\n")
    assert kept[0] == '{"object": "list", "data": [… data: 500 records], "has_more": true, ' + (
        '"url": "/v1/charges"}'
    )
    assert kept[1].startswith('[array "data": 500 records; keys id, object, amount,')
    assert "status succeeded 497, failed 3" in kept[1]
    assert f"amount {min(int(c['amount']) for c in data)}-2500000" in kept[1]  # type: ignore[call-overload]
    for charge in data:
        if charge["status"] == "failed" or charge["id"] == asked["id"]:
            assert json.dumps(charge, separators=(", ", ": ")) in kept
    assert fitted.elided == (("records", len(data) - sum(1 for line in kept if "ch_3P" in line)),)


def test_tiers_asked_then_failed_then_outlier_then_first_then_rest() -> None:
    text, data = charges(2, n=60)
    reading = read_json(text, Query.of("stripe", {"order": "ord_5"}))
    assert reading is not None
    tiers = {piece.text: piece.rank[0] for piece in reading.pieces}
    as_json = {charge["id"]: json.dumps(charge, separators=(", ", ": ")) for charge in data}
    for charge in data:
        tier = tiers[as_json[charge["id"]]]
        if charge["metadata"] == {"order_id": "ord_5"}:  # not ord_50 to ord_59
            assert tier == Tier.ASKED
        elif charge["status"] == "failed":
            assert tier == Tier.ALARM
        elif charge["amount"] == 2_500_000:
            assert tier == Tier.STANDOUT
        elif charge is data[0]:
            assert tier == Tier.CONTEXT
        else:
            assert tier == Tier.REST


def test_a_long_record_keeps_what_makes_it_stand_out_and_its_name() -> None:
    text, evicted = pod_list(3)
    reading = read_json(text, Query.of("shell", {"cmd": "kubectl get pods -n prod -o json"}))
    assert reading is not None
    fitted = fit(reading, 350, COUNTER)
    assert fitted is not None and fitted.tokens <= 350 < COUNTER.count(text) // 10
    assert '"kind": "List"' in fitted.text and "[… items: 40 records]" in fitted.text
    assert "status.phase Running 39, Failed 1" in fitted.text
    line = next(line for line in fitted.text.split("\n") if evicted in line)
    assert '"phase": "Failed", ' in line and '"reason": "Evicted"' in line
    assert '"…": "+2 keys"' in line and len(line) < 400  # short form: what it left out counted
    assert all(len(piece.text) < 700 for piece in reading.pieces)


def test_a_nested_collection_is_found_and_named_by_its_path() -> None:
    rng = random.Random(4)
    hits = [
        {"_id": f"{rng.getrandbits(48):012x}", "_source": {"latency_ms": rng.randint(20, 80)}}
        for _ in range(80)
    ]
    hits[33]["_source"]["latency_ms"] = 9400  # type: ignore[index]
    doc = {"took": 5, "timed_out": False, "hits": {"total": {"value": 80}, "hits": hits}}
    reading = read_json(json.dumps(doc), Query.of())
    assert reading is not None
    fitted = fit(reading, 150, COUNTER)
    assert fitted is not None
    assert '"hits": [… hits.hits: 80 records]' in fitted.text
    assert '[array "hits.hits": 80 records; keys _id, _source;' in fitted.text
    assert json.dumps(hits[33], separators=(", ", ": ")) in fitted.text


def test_json_lines_keep_the_error_and_the_line_that_is_not_json() -> None:
    text, broken = request_log(5)
    lines = text.split("\n")
    records = [line for line in lines if line.startswith("{")]
    reading = read_json(text, Query.of("logs", {"service": "orders"}, "what failed?"))
    assert reading is not None
    fitted = fit(reading, 200, COUNTER)
    assert fitted is not None and fitted.tokens <= 200
    kept = fitted.text.split("\n")
    assert kept[0].startswith("[json lines: 400 records; keys ts, level, path, status,")
    assert records[broken] in kept  # the line as printed
    assert "panic: runtime error: invalid memory address" in kept


def test_documents_one_after_another_are_records_and_a_short_trailer_is_kept() -> None:
    stream = "\n".join(json.dumps({"name": f"pkg{i}", "size": i * 10}, indent=2) for i in range(9))
    reading = read_json(stream, Query.of())
    assert reading is not None
    assert reading.pieces[0].text.startswith("[json lines: 9 records; keys name, size; size 0-80")
    assert reading.pieces[1].text == '{"name": "pkg0", "size": 0}'
    text, _ = charges(6, n=20)
    reading = read_json(text + "\n\nHTTP 200 OK (0.42 s)\n", Query.of())
    assert reading is not None and reading.pieces[-1].text == "HTTP 200 OK (0.42 s)"


def test_a_document_without_collections_becomes_path_lines() -> None:
    config = {
        "name": "storefront",
        "server": {"host": "0.0.0.0", "port": 8080, "tls": {"cert": "/etc/tls/cert.pem"}},
        "database": {
            f"replica_{i}": {"host": f"db-{i}.internal", "max_connections": 50 + i, "ssl": True}
            for i in range(6)
        },
        "features": [f"flag_{i}" for i in range(40)],
    }
    config["database"]["replica_3"]["max_connections"] = 500  # type: ignore[index]
    text = json.dumps(config, indent=2)
    reading = read_json(text, Query.of("read", {"path": "config.json", "key": "replica_3"}))
    assert reading is not None
    lines = [piece.text for piece in reading.pieces]
    assert lines[0] == "[object: 4 keys; name, server, database, features]"
    assert "name: storefront" in lines
    assert (
        'server: {"host": "0.0.0.0", "port": 8080, "tls": {"cert": "/etc/tls/cert.pem"}}' in lines
    )
    asked = [piece.text for piece in reading.pieces if piece.rank[0] == Tier.ASKED]
    assert asked == [
        'database.replica_3: {"host": "db-3.internal", "max_connections": 500, "ssl": true}'
    ]
    assert any(line.startswith("features[0..") for line in lines)
    fitted = fit(reading, 90, COUNTER)
    assert fitted is not None and fitted.tokens <= 90 < COUNTER.count(text) // 5
    assert asked[0] in fitted.text


@pytest.mark.parametrize("kind", ["diff", "log", "listing", "prose", "html", "csv", "pytest"])
def test_other_outputs_are_not_json(kind: str) -> None:
    assert read_json(others(3)[kind], Query.of()) is None


@pytest.mark.parametrize(
    "text",
    [
        "\n".join(f"[INFO] 2026-03-04 10:00:{i:02d} step {i} done" for i in range(40)),
        "\n".join(f"[{i}/40] Compiling module_{i}.rs" for i in range(40)),
        '[2026-03-04T10:00:00Z] {"event": "start"}\n[2026-03-04T10:00:01Z] {"event": "stop"}',
        '{"partial": [1, 2, 3\nTraceback (most recent call last):\n  File "x.py", line 1',
        "{{ template }} renders {name}\n" * 20,
        "\n".join(['{"ok": true} trailing words'] * 10),
    ],
)
def test_text_that_only_starts_like_json_is_not_claimed(text: str) -> None:
    assert read_json(text, Query.of()) is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=8) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=60,
)


@settings(max_examples=80, deadline=None)
@given(json_values.filter(lambda v: isinstance(v, (dict, list))), st.integers(5, 300))
def test_any_json_document_is_read_and_fits(value: object, budget: int) -> None:
    reading = read_json(json.dumps(value, indent=1), Query.of("t", {"q": "abcd"}, "which abcd"))
    assert reading is not None and reading.pieces
    fitted = fit(reading, budget, COUNTER)
    assert fitted is None or fitted.tokens <= budget


@settings(max_examples=80, deadline=None)
@given(st.text(alphabet=st.sampled_from(list('{}[]":,\n 0123abc\\')), max_size=300))
def test_any_text_is_read_or_refused_and_fits(text: str) -> None:
    reading = read_json("{" + text, Query.of("t", {"q": "abc"}))
    if reading is not None:
        fitted = fit(reading, 50, COUNTER)
        assert fitted is None or fitted.tokens <= 50


def check_runs(seed: int, *, n: int = 24) -> tuple[str, str]:
    """A GitHub check-runs page: long records (urls, node ids, the app), one failed run."""
    rng = random.Random(seed)
    sha = f"{rng.getrandbits(160):040x}"
    failed = rng.randrange(n)
    runs = []
    for i in range(n):
        run_id = rng.randint(10**10, 10**11)
        name = f"{rng.choice(('test', 'lint', 'build'))} (py3.{10 + i % 3}, shard {i}/{n})"
        runs.append(
            {
                "id": run_id,
                "name": name,
                "node_id": f"CR_kwDO{rng.getrandbits(96):024x}",
                "head_sha": sha,
                "external_id": f"{rng.getrandbits(128):032x}",
                "url": f"https://api.github.com/repos/acme/shop/check-runs/{run_id}",
                "html_url": f"https://github.com/acme/shop/actions/runs/{run_id}/job/{i}",
                "status": "completed",
                "conclusion": "failure" if i == failed else "success",
                "started_at": f"2026-03-04T10:{i:02d}:00Z",
                "completed_at": f"2026-03-04T10:{i:02d}:42Z",
                "output": {"title": None, "summary": None, "annotations_count": int(i == failed)},
                "app": {"id": 15368, "slug": "github-actions", "owner": {"login": "github"}},
                "pull_requests": [],
            }
        )
    return json.dumps({"total_count": n, "check_runs": runs}), runs[failed]["name"]


def test_a_long_record_is_short_its_identity_and_state_first_urls_and_hashes_left_out() -> None:
    text, failed = check_runs(11)
    reading = read_json(text, Query.of("http", {"url": "https://api.github.com/repos/acme/shop"}))
    assert reading is not None
    alarms = [p.text for p in reading.pieces if p.rank[0] == Tier.ALARM]
    assert len(alarms) == 1 and f'"name": "{failed}"' in alarms[0]
    line = alarms[0]
    assert line.startswith('{"id": ') and '"conclusion": "failure"' in line
    for left_out in ("node_id", "head_sha", "external_id", "html_url", "https://", "CR_kwDO"):
        assert left_out not in line
    assert '"…": "+' in line and COUNTER.count(line) < 80
    fitted = fit(reading, 200, COUNTER)
    assert fitted is not None and failed in fitted.text and COUNTER.count(text) > 4_000


def test_the_summary_names_few_keys_and_the_most_telling_fields() -> None:
    text, _ = check_runs(12)
    reading = read_json(text, Query.of())
    assert reading is not None
    summary = reading.pieces[1].text
    keys = summary.split("; keys ")[1].split(";")[0].split(", ")
    assert len(keys) <= 9 and keys[-1].startswith("+") and keys[:2] == ["id", "name"]
    assert "conclusion success 23, failure 1" in summary
    assert "head_sha" not in summary.split("; keys ")[1]  # a hash names nothing: not described
    assert COUNTER.count(summary) < 60


def crash_looping_pods(seed: int, *, n: int = 7) -> tuple[str, str]:
    """``kubectl get pods -o json`` where every pod is Running and one container waits in
    CrashLoopBackOff after an OOM kill: the state is three levels into a list."""
    rng = random.Random(seed)
    bad = rng.randrange(n)
    items = []
    for i in range(n):
        name = f"api-{rng.getrandbits(32):08x}-{rng.getrandbits(20):05x}"
        container: dict[str, object] = {
            "name": "api",
            "image": f"registry.internal/api:{rng.getrandbits(28):07x}",
            "ready": True,
            "restartCount": rng.randint(0, 1),
            "state": {"running": {"startedAt": "2026-03-04T09:00:00Z"}},
            "lastState": {},
        }
        if i == bad:
            container.update(
                ready=False,
                restartCount=41,
                state={"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m0s"}},
                lastState={"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
            )
        items.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": "prod", "uid": f"{rng.getrandbits(64):x}"},
                "spec": {"nodeName": f"node-{i % 3}", "containers": [{"name": "api"}]},
                "status": {"phase": "Running", "containerStatuses": [container]},
            }
        )
    doc = {"apiVersion": "v1", "kind": "List", "items": items}
    return json.dumps(doc, indent=2), items[bad]["metadata"]["name"]  # type: ignore[index]


def test_a_state_deep_in_a_list_makes_its_record_an_alarm_and_is_shown() -> None:
    text, bad = crash_looping_pods(13)
    reading = read_json(text, Query.of("shell", {"cmd": "kubectl get pods -n prod -o json"}))
    assert reading is not None
    alarms = [p.text for p in reading.pieces if p.rank[0] == Tier.ALARM]
    assert len(alarms) == 1 and bad in alarms[0]
    assert '"reason": "CrashLoopBackOff"' in alarms[0] and '"reason": "OOMKilled"' in alarms[0]
    fitted = fit(reading, 300, COUNTER)
    assert fitted is not None and "CrashLoopBackOff" in fitted.text


def test_a_term_in_every_record_picks_none_out() -> None:
    text, _ = crash_looping_pods(14)  # every pod is in "prod", as the call asked
    reading = read_json(text, Query.of("shell", {"cmd": "kubectl get pods -n prod -o json"}))
    assert reading is not None
    assert not [p for p in reading.pieces if p.rank[0] == Tier.ASKED]


def issues(seed: int, *, n: int = 30) -> tuple[str, dict[str, object]]:
    """A GitHub issues page; one issue's title says what the question asks about."""
    rng = random.Random(seed)
    topics = ("flaky upload test", "dark mode colours", "slow search page", "docs typo")
    asked_at = rng.randrange(n)
    found: dict[str, object] = {}
    page = []
    for i in range(n):
        number = 900 + i
        title = f"{rng.choice(topics)} in {rng.choice(('web', 'ios', 'android'))}"
        if i == asked_at:
            title = "Webhook retries ignore the configured backoff"
        issue = {
            "url": f"https://api.github.com/repos/acme/shop/issues/{number}",
            "html_url": f"https://github.com/acme/shop/issues/{number}",
            "id": rng.randint(10**9, 10**10),
            "node_id": f"I_kwDO{rng.getrandbits(80):020x}",
            "number": number,
            "title": title,
            "user": {"login": f"user{rng.randint(1, 99)}", "id": rng.randint(1, 10**7)},
            "state": "open",
            "assignee": {"login": rng.choice(("mlee", "okafor", "tsato"))},
            "comments": rng.randint(0, 30),
            "created_at": f"2026-02-{1 + i % 28:02d}T10:00:00Z",
            "body": "Steps to reproduce: " + " ".join(rng.choice(topics) for _ in range(30)),
        }
        if i == asked_at:
            found = issue
        page.append(issue)
    return json.dumps(page), found


def test_a_record_whose_words_the_question_uses_is_asked_for_and_shows_who_has_it() -> None:
    text, issue = issues(15)
    question = "Has anyone reported webhook retries ignoring the backoff, and who is assigned?"
    reading = read_json(text, Query.of("http", {"url": "/repos/acme/shop/issues"}, question))
    assert reading is not None
    asked = sorted((p for p in reading.pieces if p.rank[0] == Tier.ASKED), key=lambda p: p.rank)
    assert asked and f'"number": {issue["number"]}' in asked[0].text
    assignee = issue["assignee"]["login"]  # type: ignore[index]
    fitted = fit(reading, 250, COUNTER)
    assert fitted is not None and f'"login": "{assignee}"' in fitted.text


def test_an_identifier_in_the_question_picks_its_records_and_the_failed_one_comes_first() -> None:
    rng = random.Random(16)
    lines = []
    for i in range(120):
        request = f"req_{rng.getrandbits(60):015x}"
        lines.append(
            {"ts": f"10:{i // 60:02d}:{i % 60:02d}", "level": "info", "request_id": request}
        )
    wanted = lines[70]["request_id"]
    lines[40]["request_id"] = lines[95]["request_id"] = wanted  # three lines of one request
    lines[95].update(level="error", event="charge declined", error="card_declined")
    text = "\n".join(json.dumps(line) for line in lines)
    reading = read_json(text, Query.of("logs", {}, f"Did request {wanted} fail, and why?"))
    assert reading is not None
    asked = sorted((p for p in reading.pieces if p.rank[0] == Tier.ASKED), key=lambda p: p.rank)
    assert len(asked) == 3 and all(wanted in p.text for p in asked)
    assert '"error": "card_declined"' in asked[0].text


def spans(seed: int, *, n: int = 40, errored: int = 4) -> tuple[str, list[int]]:
    """OpenTelemetry spans as JSON lines; a few errored, more than a rare value's share."""
    rng = random.Random(seed)
    bad = sorted(rng.sample(range(n), errored))
    lines = []
    for i in range(n):
        status: dict[str, str] = {"code": "STATUS_CODE_UNSET"}
        if i in bad:
            status = {"code": "STATUS_CODE_ERROR", "message": "upstream connect error"}
        span = {
            "trace_id": f"{rng.getrandbits(128):032x}",
            "span_id": f"{rng.getrandbits(64):016x}",
            "name": rng.choice(("GET /cart", "SELECT carts", "redis GET session")),
            "duration_ms": round(rng.uniform(1, 40), 2),
            "status": status,
            "resource": {"service.name": "cart", "host.name": f"cart-{rng.getrandbits(24):06x}"},
        }
        lines.append(json.dumps(span, separators=(",", ":")))
    return "\n".join(lines), bad


def test_failures_a_quarter_of_the_records_share_are_alarms() -> None:
    text, bad = spans(17)
    assert len(bad) > 40 // 20  # more than a rare value's share
    reading = read_json(text, Query.of("read_file", {"path": "/export/spans.jsonl"}))
    assert reading is not None
    records = [p for p in reading.pieces if p.what == "records"]
    alarms = [i for i, p in enumerate(records) if p.rank[0] == Tier.ALARM]
    assert alarms == bad
    assert all("upstream connect error" in records[i].text for i in bad)
    text, _ = spans(18, errored=20)  # half the spans failed: failures are usual here
    reading = read_json(text, Query.of())
    assert reading is not None and not [p for p in reading.pieces if p.rank[0] == Tier.ALARM]


def test_the_question_finds_its_words_in_other_inflections() -> None:
    rng = random.Random(19)
    events = ("upload finished", "thumbnail written", "upload started", "quota checked")
    lines = [
        {
            "ts": f"10:00:{i % 60:02d}",
            "tenant": f"t{rng.randint(1, 9)}",
            "event": rng.choice(events),
        }
        for i in range(90)
    ]
    lines[57]["event"] = "upload throttling enabled"
    text = "\n".join(json.dumps(line) for line in lines)
    reading = read_json(text, Query.of("logs", {}, "Were any uploads throttled this morning?"))
    assert reading is not None
    asked = [p.text for p in reading.pieces if p.rank[0] == Tier.ASKED]
    assert asked == [json.dumps(lines[57])]


def test_an_acronym_in_the_question_is_a_word_to_find() -> None:
    text, _ = issues(20)
    page = json.loads(text)
    page[7]["title"] = "SSO login loops back to the start page"
    reading = read_json(json.dumps(page), Query.of("http", {}, "Any open issue about SSO?"))
    assert reading is not None
    asked = [p.text for p in reading.pieces if p.rank[0] == Tier.ASKED]
    assert len(asked) == 1 and '"number": 907' in asked[0]


def test_bounds_and_pages_of_the_call_are_not_terms() -> None:
    text, data = charges(21, n=40)
    created = data[0]["created"]  # the first charge is exactly at the bound asked
    query = Query.of("stripe", {"path": "/v1/charges", "params": {"created[gte]": created}})
    reading = read_json(text, query)
    assert reading is not None
    assert not [p for p in reading.pieces if p.rank[0] == Tier.ASKED]


def test_who_and_where_ask_for_people_and_places_and_a_key_the_question_names() -> None:
    rng = random.Random(22)
    events = []
    for i in range(30):  # CloudTrail's order of keys: who and where come after much else
        user = f"user{rng.randint(1, 9)}"
        events.append(
            {
                "eventVersion": "1.09",
                "userIdentity": {
                    "type": "IAMUser",
                    "principalId": f"AIDA{rng.getrandbits(64):016X}",
                    "arn": f"arn:aws:iam::123456789012:user/{user}",
                    "accountId": "123456789012",
                    "accessKeyId": f"AKIA{rng.getrandbits(64):016X}",
                    "userName": user,
                },
                "eventTime": f"2026-03-04T10:{i:02d}:00Z",
                "eventSource": "s3.amazonaws.com",
                "eventName": rng.choice(("GetObject", "PutObject", "HeadObject")),
                "awsRegion": "eu-west-1",
                "sourceIPAddress": f"203.0.113.{rng.randint(1, 254)}",
                "userAgent": "aws-cli/2.15.30 Python/3.11.8 Linux/6.1 exe/x86_64.debian.12",
                "requestParameters": {
                    "bucketName": rng.choice(("logs-eu", "media-eu")),
                    "Host": "s3.eu-west-1.amazonaws.com",
                    "key": f"uploads/{rng.getrandbits(64):016x}.bin",
                },
                "responseElements": None,
                "requestID": f"{rng.getrandbits(64):016X}",
                "eventID": f"{rng.getrandbits(128):032x}",
                "readOnly": False,
                "eventType": "AwsApiCall",
                "recipientAccountId": "123456789012",
            }
        )
    events[12].update(errorCode="AccessDenied", errorMessage="Access Denied")
    text = "\n".join(json.dumps(event) for event in events)
    question = "Who was denied, from where, and on which bucket?"
    reading = read_json(text, Query.of("shell", {"cmd": "jq -c .Records[]"}, question))
    assert reading is not None
    denied = next(p.text for p in reading.pieces if "AccessDenied" in p.text)
    assert events[12]["userIdentity"]["userName"] in denied  # type: ignore[index]
    assert events[12]["sourceIPAddress"] in denied
    assert f'"bucketName": "{events[12]["requestParameters"]["bucketName"]}"' in denied  # type: ignore[index]


def test_where_values_fail_the_failure_comes_first_and_other_reasons_room_allowing() -> None:
    rng = random.Random(23)
    data = []
    for i in range(40):
        charge: dict[str, object] = {
            "id": f"ch_{rng.getrandbits(80):020x}",
            "object": "charge",
            "created": f"2026-03-04T{i // 4:02d}:{i % 60:02d}:00Z",
            "customer": f"cus_{rng.getrandbits(64):016x}",
            "payment_method": f"pm_{rng.getrandbits(96):024x}",
            "receipt_url": f"https://pay.example.com/receipts/{rng.getrandbits(96):024x}",
            "amount": rng.randint(500, 9000),
            "amount_refunded": 0,
            "captured": True,
            "paid": True,
            "balance_transaction": f"txn_{rng.getrandbits(80):020x}",
            "receipt_number": f"{rng.randint(1000, 9999)}-{rng.randint(1000, 9999)}",
            "description": "Subscription renewal",
            "status": "succeeded",
            "failure_code": None,
        }
        data.append(charge)
    data[9].update(
        status="failed",
        failure_code="expired_card",
        captured=False,
        paid=False,
        balance_transaction=None,
        receipt_number=None,
    )
    reading = read_json(json.dumps({"data": data}), Query.of("stripe", {"path": "/v1/charges"}))
    assert reading is not None
    failed = next(p.text for p in reading.pieces if p.rank[0] == Tier.ALARM)
    assert '"status": "failed"' in failed and '"failure_code": "expired_card"' in failed
    assert COUNTER.count(failed) < 70
