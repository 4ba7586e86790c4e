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
    assert '"managedFields": […3]' in line  # elided: the record stays one short line
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
