"""One agent process of the multi-process tests: a Governor on a RemoteBackend (kvgov
serve) with a RedisStore, running ``--agents`` agents on threads, each one lease of
``--turns`` model calls. It prints JSON lines as things happen (flushed, so a test that
kills or pauses it reads what happened before): its store id first, then each agent's
admission and end (``finished``, ``expired`` with LeaseExpired, ``unavailable`` with
StoreUnavailable, or ``error``)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
import traceback
from pathlib import Path

from backends.remote import RemoteBackend
from governor import (
    AgentSpec,
    Governor,
    GovernorConfig,
    LeaseExpired,
    RedisStore,
    StoreUnavailable,
)

_print_lock = threading.Lock()


def say(**fields: object) -> None:
    with _print_lock:
        sys.stdout.write(json.dumps(fields) + "\n")
        sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve", required=True)
    parser.add_argument("--redis", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--ttl", type=float, default=1.0)
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--ceiling", type=int, required=True)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--think-s", type=float, default=0.0)
    parser.add_argument("--retry-s", type=float, default=0.0)  # retry StoreUnavailable
    # lease after lease (each of --turns calls) until this file exists; else one lease
    parser.add_argument("--until", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(relativeCreated)d %(name)s %(message)s")
    logging.getLogger("governor.store").setLevel(logging.DEBUG)
    worker = AgentSpec(name="worker", ceiling_tokens=args.ceiling)
    store = RedisStore(args.redis, namespace=args.namespace, lease_ttl_s=args.ttl)
    config = GovernorConfig(safety_factor=1.0, admission_timeout_s=120)
    backend = RemoteBackend(args.serve)
    governor = Governor(backend, config=config, agents=[worker], store=store)
    say(proc=governor.admission.proc)

    def agent(number: int) -> None:
        deadline = time.monotonic() + args.retry_s
        while True:
            asked = time.monotonic()
            try:
                with governor.lease("worker") as lease:
                    say(agent=number, event="admitted", lease=lease.lease_id)
                    for turn in range(args.turns):
                        messages = [{"role": "user", "content": f"Agent {number}, turn {turn}."}]
                        governor.complete(lease, messages, max_tokens=args.max_tokens)
                        time.sleep(args.think_s)
                if args.until is not None and not args.until.exists():
                    continue  # another lease
                say(agent=number, event="finished")
                return
            except LeaseExpired as exc:
                say(agent=number, event="expired", lease=str(exc.lease_id))
                return
            except StoreUnavailable as exc:
                say(agent=number, event="refused", after_s=time.monotonic() - asked)
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                say(agent=number, event="unavailable", error=str(exc))
                return
            except Exception as exc:
                traceback.print_exc()
                say(agent=number, event="error", error=f"{type(exc).__name__}: {exc}")
                return

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(args.agents)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    governor.close()
    backend.close()
    say(event="done")


if __name__ == "__main__":
    main()
