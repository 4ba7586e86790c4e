"""Reading exported order files."""

import json
from pathlib import Path


class OrderFileError(Exception):
    """An export file that cannot be read as an order."""


def read_json(path: Path) -> dict:
    with path.open(encoding="utf-8") as f:
        return json.load(f)


def load_order(path: Path) -> dict:
    try:
        return read_json(path)
    except json.JSONDecodeError as exc:
        raise OrderFileError(f"{path.name}: not a complete order export") from exc
