"""Writes one day's order exports (72 JSON files) for sync_orders.py; the export of
ord_48158 is cut off two thirds of the way, as when the export job is killed mid-write."""

import json
import random
from pathlib import Path

SKUS = ["MUG-11OZ", "TEE-M-BLK", "TEE-L-WHT", "CAP-NVY", "STICKER-5", "POSTER-A2", "HOODIE-XL"]


def main() -> None:
    rng = random.Random(7)
    out = Path("exports/2026-12-06")
    out.mkdir(parents=True, exist_ok=True)
    for n in range(1, 73):
        email = None if n % 17 == 0 else f"buyer{n}@example.com"
        order = {
            "id": f"ord_{48100 + n}",
            "customer": {"id": f"cus_{rng.randint(1000, 9999)}", "email": email},
            "currency": "EUR",
            "items": [
                {
                    "sku": rng.choice(SKUS),
                    "qty": rng.randint(1, 4),
                    "unit_price": round(rng.uniform(3, 60), 2),
                }
                for _ in range(rng.randint(1, 5))
            ],
        }
        text = json.dumps(order, indent=2)
        if n == 58:
            text = text[: len(text) * 2 // 3]
        (out / f"{order['id']}.json").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
