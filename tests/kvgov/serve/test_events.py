"""``EventLog``: events come back in the order they were recorded, numbered without gaps,
the oldest fall off past the bound, and ``since`` returns exactly what came after a seq."""

from __future__ import annotations

import threading
import time

import pytest

from kvgov.serve.events import EventLog


def test_events_keep_their_order_and_fields() -> None:
    log = EventLog()
    before = time.time()
    recorded = [log.record("request.started", id=f"r{i}", budget="a") for i in range(5)]
    got = log.since()
    assert got == recorded
    assert [e.seq for e in got] == [1, 2, 3, 4, 5]
    assert all(before <= e.at <= time.time() for e in got)
    assert [e.at for e in got] == sorted(e.at for e in got)
    assert got[2].as_dict() == {
        "seq": 3,
        "at": got[2].at,
        "kind": "request.started",
        "id": "r2",
        "budget": "a",
    }


def test_the_oldest_fall_off_past_the_bound() -> None:
    log = EventLog(max_events=3)
    for i in range(7):
        log.record("budget.opened", name=f"b{i}")
    got = log.since()
    assert [e.seq for e in got] == [5, 6, 7]  # numbering goes on: a reader sees the gap
    assert [e.fields["name"] for e in got] == ["b4", "b5", "b6"]


def test_since_returns_what_came_after() -> None:
    log = EventLog(max_events=4)
    for i in range(3):
        log.record("kv.offloaded", budget=f"b{i}")
    assert [e.seq for e in log.since(0)] == [1, 2, 3]
    assert [e.seq for e in log.since(1)] == [2, 3]
    assert log.since(3) == []
    assert log.since(99) == []  # a reader ahead of the log (a restarted server) sees none
    for i in range(3, 6):
        log.record("kv.restored", budget=f"b{i}")
    # Seq 1 and 2 fell off: a reader that last saw 1 gets what is kept, oldest first.
    assert [e.seq for e in log.since(1)] == [3, 4, 5, 6]
    assert [e.seq for e in log.since(4)] == [5, 6]


def test_threads_record_at_once_without_losing_or_repeating_a_seq() -> None:
    log = EventLog(max_events=10_000)
    threads_n, per_thread = 8, 250
    start = threading.Barrier(threads_n)

    def record(t: int) -> None:
        start.wait(timeout=10)
        for i in range(per_thread):
            log.record("request.finished", thread=t, i=i)

    threads = [threading.Thread(target=record, args=(t,)) for t in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    got = log.since()
    assert [e.seq for e in got] == list(range(1, threads_n * per_thread + 1))
    for t in range(threads_n):  # each thread's events in the order it recorded them
        assert [e.fields["i"] for e in got if e.fields["thread"] == t] == list(range(per_thread))


def test_a_log_must_keep_at_least_one_event() -> None:
    with pytest.raises(ValueError, match="max_events must be at least 1"):
        EventLog(max_events=0)


def test_one_tenants_flood_never_pushes_out_anothers_events() -> None:
    """Issue 32, item 13: 1,500 budgets opened by one tenant emptied another's live-page
    events when every tenant shared one bound."""
    log = EventLog(max_events=20)
    kept = log.record("budget.opened", tenant="tb", budget="mine")
    server = log.record("server.note", detail="no tenant")
    for i in range(1_500):
        log.record("budget.opened", tenant="ta", budget=f"flood-{i}")
    assert log.since(tenant="tb") == [kept]
    assert log.since(tenant="") == [server]
    flood = log.since(tenant="ta")
    assert len(flood) == 20 and flood[-1].fields["budget"] == "flood-1499"
    everything = log.since()
    assert everything[:2] == [kept, server]  # merged in seq order across tenants
    assert [e.seq for e in everything] == sorted(e.seq for e in everything)
    assert log.since(everything[-2].seq) == everything[-1:]
