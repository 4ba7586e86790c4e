"""``read_log``: what went wrong and what the call names, with a summary of the rest."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governor import TokenCounter
from policies.readers import Query, fit
from policies.readers.logs import read_log
from tests.policies.readers.samples import app_log, others

COUNTER = TokenCounter()
FAILED = "ERROR payments.worker order_id=ord_48213 charge failed: card_declined (code 402)"


@pytest.mark.parametrize("seed", range(4))
def test_the_error_is_kept_and_the_rest_summarized(seed: int) -> None:
    text = app_log(seed, planted=FAILED)
    query = Query.of("logs", {"service": "payments", "since": "1h"}, "Why did charges fail?")
    reading = read_log(text, query)
    assert reading is not None and reading.method == "log"
    fitted = fit(reading, 250, COUNTER)
    assert fitted is not None and fitted.tokens <= 250
    planted = next(line for line in text.split("\n") if FAILED in line)
    assert planted in fitted.text.split("\n")
    summary = fitted.text.split("\n")[0]
    lines = text.split("\n")
    warnings = sum(1 for line in lines if " WARN " in line)
    assert f"WARN {warnings:,}" in summary and "ERROR 1" in summary
    assert (
        f"log: {len(lines):,} entries, {lines[0].split()[0]} to {lines[-1].split()[0]}" in summary
    )
    health = sum(1 for line in lines if "GET /health" in line)
    repeated = next(p.text for p in reading.pieces if p.text.startswith("[most repeated: "))
    assert f"[most repeated: {health:,}x 'INFO  http GET /health # #'" in repeated


def test_an_entry_naming_the_call_comes_before_errors() -> None:
    text = app_log(7, planted="INFO  payments.worker refund issued order_id=ord_77001")
    noisy = (
        text
        + "\n"
        + "\n".join(
            f"2026-03-04T11:00:{k:02d}.000Z ERROR cache.client timeout after 5000ms"
            for k in range(40)
        )
    )
    query = Query.of("logs", {"order_id": "ord_77001"})
    fitted = fit(read_log(noisy, query) or pytest.fail("not read"), 120, COUNTER)
    assert fitted is not None and "refund issued order_id=ord_77001" in fitted.text


def test_continuation_lines_stay_with_their_entry() -> None:
    text = app_log(
        3, planted="ERROR upload failed\n    at storage.put (bucket=reports)\n    retry 3/3"
    )
    reading = read_log(text, Query.of())
    assert reading is not None
    entry = next(piece for piece in reading.pieces if "upload failed" in piece.text)
    assert entry.text.endswith("upload failed\n    at storage.put (bucket=reports)\n    retry 3/3")


def test_access_log_server_errors_are_alarms() -> None:
    lines = [
        f"10.0.0.{k % 250} - - [04/Mar/2026:10:{k // 60 % 60:02d}:{k % 60:02d} +0000] "
        f'"GET /api/items/{k} HTTP/1.1" {503 if k == 417 else 200} 512 "-" "curl/8.5"'
        for k in range(600)
    ]
    fitted = fit(read_log("\n".join(lines), Query.of()) or pytest.fail("not read"), 160, COUNTER)
    assert fitted is not None and lines[417] in fitted.text


@pytest.mark.parametrize("kind", ["diff", "listing", "prose", "html", "json", "csv", "pytest"])
def test_other_outputs_are_not_logs(kind: str) -> None:
    assert read_log(others(2)[kind], Query.of()) is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=60), max_size=40), st.integers(5, 80))
def test_any_lines_are_read_or_refused_and_fit(extra: list[str], budget: int) -> None:
    text = app_log(1, entries=30) + "\n" + "\n".join(extra)
    reading = read_log(text, Query.of("t", {"q": "ord_1"}, "why"))
    if reading is not None:
        fitted = fit(reading, budget, COUNTER)
        assert fitted is None or fitted.tokens <= budget


def test_trouble_in_words_is_an_alarm_where_entries_have_no_level() -> None:
    lines = [
        f"Jun 03 19:{k // 60:02d}:{k % 60:02d} app-34 sshd[{1000 + k}]: Accepted publickey for "
        f"u{k} from 10.0.{k % 200}.9 port {40000 + k} ssh2: ED25519 SHA256:Kg{k:04d}abcDEFghiJ"
        for k in range(300)
    ]
    oom = "Jun 03 19:18:31 app-34 kernel: Out of memory: Killed process 1350015 (postgres)"
    lines.insert(201, oom)
    reading = read_log(
        "\n".join(lines), Query.of(None, None, "Something restarted; check the journal.")
    )
    fitted = fit(reading or pytest.fail("not read"), 120, COUNTER)
    assert fitted is not None and oom in fitted.text
    assert "301 entries" in fitted.text.split("\n")[0]  # the keys differ: one message repeated
    assert "[most repeated: 300x '# sshd[#]: Accepted publickey for # from # port" in fitted.text
