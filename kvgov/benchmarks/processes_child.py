"""One process of ``kvgov bench processes``'s ``leases_per_s``: two governors on a
``FakeBackend``, one on the shared ``RedisStore`` namespace and one on its own
``LocalStore``, acquiring and releasing leases one after another for the windows the
parent names.

``python -m kvgov.benchmarks.processes_child --redis URL --namespace NS`` prints one JSON
line once both governors are built and warm (``ready``), then reads orders on stdin, one
JSON line each: ``{"store": "redis" | "local", "start_at": T, "seconds": S}``. It waits
until ``time.monotonic()`` reads ``T`` (the clock is the machine's, so every child of a
window starts at the same instant), runs ``with governor.lease(...)`` back to back until
``T + S``, and prints what it did: ``count``, ``started`` and ``ended`` (that clock's
readings around the loop) and ``cpu_s`` (the CPU time of the whole process meanwhile, its
store's threads included). Its stdin closing ends it: both governors are closed (every
lease was released), then it exits.

Every lease is admitted at once: the budget holds 1,000 of them and each process holds
one at a time, so the window times the store's round trips, never a queue.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from governor import AgentSpec, FakeBackend, Governor, LocalStore, RedisStore

__all__ = ["CEILING_TOKENS", "NUM_BLOCKS", "WARMUP_LEASES", "lease_loop", "main"]

CEILING_TOKENS = 1_600  # 100 blocks of 16 tokens
NUM_BLOCKS = 112_000  # 1,000 leases at their ceilings, under the safety factor of 0.9
WARMUP_LEASES = 50


def lease_loop(governor: Governor, until: float) -> int:
    """Leases acquired and released one after another until ``time.monotonic()`` reads
    ``until`` (the one in flight then finishes): how many."""
    count = 0
    while time.monotonic() < until:
        with governor.lease("worker"):
            pass
        count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis", required=True)
    parser.add_argument("--namespace", required=True)
    args = parser.parse_args()
    agent = AgentSpec(name="worker", ceiling_tokens=CEILING_TOKENS)
    governors: dict[str, Governor] = {}
    try:
        for name, store in (
            ("redis", RedisStore(args.redis, namespace=args.namespace)),
            ("local", LocalStore()),
        ):
            backend = FakeBackend(num_blocks=NUM_BLOCKS)
            governors[name] = Governor(backend, agents=[agent], store=store)
        for governor in governors.values():
            for _ in range(WARMUP_LEASES):
                with governor.lease("worker"):
                    pass
        _say(ready=True)
        for line in sys.stdin:
            order = json.loads(line)
            governor = governors[order["store"]]
            start_at = float(order["start_at"])
            time.sleep(max(0.0, start_at - time.monotonic()))
            started, cpu = time.monotonic(), time.process_time()
            count = lease_loop(governor, until=start_at + float(order["seconds"]))
            ended, cpu = time.monotonic(), time.process_time() - cpu
            _say(store=order["store"], count=count, started=started, ended=ended, cpu_s=cpu)
    finally:
        for governor in governors.values():
            governor.close()


def _say(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
