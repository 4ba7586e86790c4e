"""What the live page shows at one instant: the memory map, the requests, the last events,
and the samples ``/metrics`` would expose at that instant.

Built from one ``EngineSnapshot`` (read between two engine steps), so the map's segments
add up to the pool and agree with the samples. The device's KV pool is cut into
segments that never overlap:

- ``pinned``: blocks pinned for shared prefixes (a budget using one is not charged again);
- ``budget``: blocks only that budget holds (its requests and its retained context);
- ``shared``: blocks two or more budgets hold (a prefix-cache hit between agents);
- ``other``: blocks in use by requests outside any budget;
- ``cached``: free blocks that still serve prefix-cache hits (evictable);
- ``empty``: free blocks with nothing in them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from kvgov.serve.events import EventLog
from kvgov.serve.metrics import families, samples

if TYPE_CHECKING:
    from engine.outputs import EngineSnapshot

__all__ = ["MAX_EVENTS", "live_view", "memory_map"]

MAX_EVENTS = 50  # the page lists the last ones; the log keeps more


def memory_map(snapshot: EngineSnapshot, *, weights_bytes: int) -> dict[str, Any]:
    m, cap, kv = snapshot.metrics, snapshot.capacity, snapshot.kv
    pinned = kv.pinned_block_ids
    holders: Counter[int] = Counter()
    for held in kv.budgets.values():
        holders.update(held.device_block_ids - pinned)
    shared = {block for block, count in holders.items() if count > 1}
    segments: list[dict[str, Any]] = [
        {"kind": "pinned", "label": "shared prefixes (pinned)", "blocks": len(pinned)}
    ]
    for name, held in sorted(kv.budgets.items()):
        own = held.device_block_ids - pinned - shared
        segments.append({"kind": "budget", "label": name, "blocks": len(own)})
    budgeted = len(holders)  # distinct blocks budgets hold, pinned ones left out
    segments += [
        {"kind": "shared", "label": "shared between budgets", "blocks": len(shared)},
        {
            "kind": "other",
            "label": "requests without a budget",
            "blocks": m.num_blocks_in_use - len(pinned) - budgeted,
        },
        {"kind": "cached", "label": "cached (free, evictable)", "blocks": m.num_blocks_cached},
        {"kind": "empty", "label": "empty", "blocks": m.num_blocks_free - m.num_blocks_cached},
    ]
    assert sum(s["blocks"] for s in segments) == m.num_blocks, segments
    host = [
        {"kind": "budget", "label": name, "blocks": held.num_host_blocks}
        for name, held in sorted(kv.budgets.items())
        if held.num_host_blocks
    ]
    in_budgets = sum(s["blocks"] for s in host)
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
            for name, held in sorted(kv.budgets.items())
        ],
    }


def live_view(
    snapshot: EngineSnapshot,
    *,
    model_name: str,
    weights_bytes: int,
    events: EventLog,
    instance_id: str,
) -> dict[str, Any]:
    exposed = families(snapshot, model_name=model_name, weights_bytes=weights_bytes)
    return {
        "model": model_name,
        "instance_id": instance_id,
        "metrics": [asdict(sample) for sample in samples(exposed)],
        "memory": memory_map(snapshot, weights_bytes=weights_bytes),
        "requests": [asdict(request) for request in snapshot.requests],
        "events": [event.as_dict() for event in events.since(0)[-MAX_EVENTS:]],
    }
