"""What the live page shows at one instant: the memory map, the requests, the last events,
and the samples ``/metrics`` would expose at that instant.

With API keys the view is the caller's: its budgets (by its own names), its requests and
its events; other tenants show only as the ``tenants`` segment and a count of requests not
listed. Pool-wide figures stay whole (see ``kvgov.serve.metrics``). Without keys it shows
everything.

Built from one ``EngineSnapshot`` (read between two engine steps), so the map's segments
add up to the pool and agree with the samples. The device's KV pool is cut into
segments that never overlap:

- ``pinned``: blocks pinned for shared prefixes (a budget using one is not charged again);
- ``budget``: blocks only that budget holds (its requests and its retained context);
- ``shared``: blocks two or more budgets hold (a prefix-cache hit between agents);
- ``tenants``: with API keys, blocks other tenants' budgets hold and the caller's do not
  (one count, no names);
- ``other``: blocks in use by requests outside any budget;
- ``cached``: free blocks that still serve prefix-cache hits (evictable);
- ``empty``: free blocks with nothing in them.

Budgets of leases of governors that share a store (``lease-<process>.<n>``) are also
summed by process (``processes``): which agent process holds what.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from governor.store import lease_process
from kvgov.serve.events import EventLog
from kvgov.serve.metrics import families, samples
from kvgov.serve.tenancy import own_budgets, owns_salt, unscoped_budget

if TYPE_CHECKING:
    from engine.outputs import EngineSnapshot

__all__ = ["MAX_EVENTS", "live_view", "memory_map", "own_events", "own_requests"]

MAX_EVENTS = 50  # the page lists the last ones; the log keeps more


def memory_map(snapshot: EngineSnapshot, *, weights_bytes: int, tenant: str = "") -> dict[str, Any]:
    """The pool cut into segments; with API keys (``tenant`` set) only the caller's budgets
    are named, and every other tenant's blocks are one ``tenants`` segment."""
    m, cap, kv = snapshot.metrics, snapshot.capacity, snapshot.kv
    pinned = kv.pinned_block_ids
    own = own_budgets(tenant, kv.budgets)
    holders: Counter[int] = Counter()
    for held in kv.budgets.values():
        holders.update(held.device_block_ids - pinned)
    shared = {block for block, count in holders.items() if count > 1}
    mine: set[int] = set()  # distinct blocks the caller's budgets hold, pinned ones left out
    for held in own.values():
        mine |= held.device_block_ids - pinned
    segments: list[dict[str, Any]] = [
        {"kind": "pinned", "label": "shared prefixes (pinned)", "blocks": len(pinned)}
    ]
    for name, held in sorted(own.items()):
        alone = held.device_block_ids - pinned - shared
        segments.append({"kind": "budget", "label": name, "blocks": len(alone)})
    segments.append(
        {"kind": "shared", "label": "shared between budgets", "blocks": len(shared & mine)}
    )
    if tenant:  # a count, no names: what the pool holds is no secret, whose it is is
        others = len(holders.keys() - mine)
        segments.append({"kind": "tenants", "label": "other tenants", "blocks": others})
    budgeted = len(holders)  # distinct blocks budgets hold, pinned ones left out
    segments += [
        {
            "kind": "other",
            "label": "requests without a budget",
            "blocks": m.num_blocks_in_use - len(pinned) - budgeted,
        },
        {"kind": "cached", "label": "cached (free, evictable)", "blocks": m.num_blocks_cached},
        {"kind": "empty", "label": "empty", "blocks": m.num_blocks_free - m.num_blocks_cached},
    ]
    assert sum(s["blocks"] for s in segments) == m.num_blocks, segments
    host: list[dict[str, Any]] = [
        {"kind": "budget", "label": name, "blocks": held.num_host_blocks}
        for name, held in sorted(own.items())
        if held.num_host_blocks
    ]
    in_budgets = sum(held.num_host_blocks for held in kv.budgets.values())
    if tenant:
        others = in_budgets - sum(s["blocks"] for s in host)
        host.append({"kind": "tenants", "label": "other tenants", "blocks": others})
    host.append(
        {"kind": "other", "label": "swapped requests", "blocks": m.num_blocks_swapped - in_budgets}
    )
    return {
        "block_size": cap.block_size,
        "bytes_per_block": cap.bytes_per_block,
        "weights_bytes": weights_bytes,
        "kv_bytes": cap.num_blocks * cap.bytes_per_block,
        "num_blocks": m.num_blocks,
        "device": segments,
        "num_host_blocks": cap.num_host_blocks,
        "host": host,
        "budgets": [
            {
                "name": name,
                "device_blocks": len(held.device_block_ids),
                "device_tokens": held.num_device_tokens,
                "host_blocks": held.num_host_blocks,
                "host_tokens": held.num_host_tokens,
                "max_blocks": held.max_blocks,
            }
            for name, held in sorted(own.items())
        ],
        "processes": _processes(own),
    }


def _processes(own: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The budgets of governors that share a store (``governor.store``), by the process
    whose lease owns each: how many, the device blocks they hold, the blocks they may."""
    by_process: dict[str, list[Any]] = {}
    for name, held in own.items():
        process = lease_process(name)
        if process is not None:
            by_process.setdefault(process, []).append(held)
    return [
        {
            "process": process,
            "leases": len(helds),
            "device_blocks": sum(len(held.device_block_ids) for held in helds),
            "max_blocks": sum(held.max_blocks for held in helds),
        }
        for process, helds in sorted(by_process.items())
    ]


def own_requests(snapshot: EngineSnapshot, tenant: str) -> list[dict[str, Any]]:
    """The requests the caller may see, budget names unscoped. With API keys a request is
    the caller's when its cache salt is (the server salts every call with its tenant's),
    and never shows its salt, which holds the tenant id."""
    shown = []
    for request in snapshot.requests:
        if not owns_salt(tenant, request.cache_salt):
            continue
        row = asdict(request)
        del row["cache_salt"]  # a client's own salt is not the page's business
        if request.budget is not None:
            row["budget"] = unscoped_budget(tenant, request.budget)
        shown.append(row)
    return shown


def own_events(events: EventLog, tenant: str) -> list[dict[str, Any]]:
    """The last events the caller may see: its tenant's, and the server's own (no tenant)."""
    seen = [
        event.as_dict()
        for event in events.since(0)
        if not tenant or event.fields.get("tenant", "") in ("", tenant)
    ]
    return seen[-MAX_EVENTS:]


def live_view(
    snapshot: EngineSnapshot,
    *,
    model_name: str,
    weights_bytes: int,
    events: EventLog,
    instance_id: str,
    tenant: str = "",
) -> dict[str, Any]:
    """The page's JSON for a caller of ``tenant`` ("" without API keys: everything)."""
    exposed = families(snapshot, model_name=model_name, weights_bytes=weights_bytes, tenant=tenant)
    requests = own_requests(snapshot, tenant)
    return {
        "model": model_name,
        "instance_id": instance_id,
        "metrics": [asdict(sample) for sample in samples(exposed)],
        "memory": memory_map(snapshot, weights_bytes=weights_bytes, tenant=tenant),
        "requests": requests,
        "num_requests_not_listed": len(snapshot.requests) - len(requests),
        "events": own_events(events, tenant),
    }
