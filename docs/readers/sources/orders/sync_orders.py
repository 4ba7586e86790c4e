"""Sync yesterday's order exports: python sync_orders.py EXPORT_DIR"""

import logging
import sys
from pathlib import Path

from syncer.batch import sync_day


def main(argv: list[str]) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)-7s %(name)s: %(message)s"
    )
    folder = Path(argv[1])
    synced = sync_day(folder)
    logging.getLogger("sync_orders").info("synced %d orders", synced)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
