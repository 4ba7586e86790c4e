"""Syncing one day's order exports to the ledger."""

import logging
import time
from decimal import Decimal
from pathlib import Path

from syncer.files import load_order

log = logging.getLogger("syncer.batch")


def order_total(order: dict) -> Decimal:
    return sum(
        (Decimal(str(item["unit_price"])) * item["qty"] for item in order["items"]), Decimal(0)
    )


def post_to_ledger(order: dict, total: Decimal) -> None:
    time.sleep(0.03)  # the ledger API's usual latency
    log.debug("posted %s to ledger", order["id"])


def sync_day(folder: Path) -> int:
    paths = sorted(folder.glob("*.json"))
    log.info("syncing %d exports from %s", len(paths), folder)
    synced = 0
    for path in paths:
        order = load_order(path)
        if order["customer"]["email"] is None:
            log.warning("order %s has no customer email; receipt will not be sent", order["id"])
        total = order_total(order)
        post_to_ledger(order, total)
        synced += 1
        log.info(
            "order %s: %d items, total %s %s",
            order["id"],
            len(order["items"]),
            total,
            order["currency"],
        )
    return synced
