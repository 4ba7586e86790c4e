"""The live page sums the budgets of governors that share a store by the agent process
whose leases own them (``lease-<process>.<n>``, ``governor.store.lease_process``)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from governor.store import lease_process
from kvgov.serve import create_app
from tests.kvgov.serve.api_support import fresh_backend

A, B = "0123456789ab", "ba9876543210"


def test_lease_process_reads_the_store_s_budget_names() -> None:
    assert lease_process(f"lease-{A}.0") == A
    assert lease_process(f"lease-{B}.17") == B
    for other in ("lease-3", f"lease-{A}", f"lease-{A}.x", f"{A}.0", "lease-0123456789aZ.1", ""):
        assert lease_process(other) is None


def test_the_live_view_lists_budgets_by_process() -> None:
    backend = fresh_backend()
    try:
        names = {f"lease-{A}.0": 4, f"lease-{A}.1": 6, f"lease-{B}.0": 5, "lease-7": 3}
        for name, blocks in names.items():
            backend.open_budget(name, max_blocks=blocks)
        with TestClient(create_app(backend)) as client:
            view = client.get("/kvgov/v1/live").json()
        processes = view["memory"]["processes"]
        assert processes == [
            {"process": A, "leases": 2, "device_blocks": 0, "max_blocks": 10},
            {"process": B, "leases": 1, "device_blocks": 0, "max_blocks": 5},
        ]  # lease-7 is an in-process governor's: no process to name
        for name in names:
            backend.close_budget(name)
    finally:
        backend.close()
