"""The ``kvgov`` command line (``kvgov.cli:app``, the console script), one module a
command:

    kvgov --version
    kvgov demo [--agents N] [--ceiling TOKENS] [--kv-budget SIZE] [--model PATH] [...]
    kvgov bench NAME [--json] [--quick] [--device DEVICE] [--model PRESET|PATH] [--plot DIR]
    kvgov plan (--preset NAME | --config PATH) --card-gb GB --weights-gb GB [...]
    kvgov plan --simulate --device PROFILE --model MODEL [--trace RUN.jsonl] [...]
    kvgov map [plan's options | --record RUN.json] [--out PATH]
    kvgov report RUN.jsonl
    kvgov serve [--model PRESET|PATH] [--host] [--port] [--api-key KEY ...] [...]
    kvgov twin fit [--device cpu|cuda] [--model PRESET|PATH] [--profile NAME|FILE]
                   [--grid PATH] [--save-grid PATH] [--out PATH] [--quick] [--json]
    kvgov twin check [--quick] [--rounds N] [--fraction F] [--policy NAME ...]
                     [--profile FILE] [--seed N] [--json]

``app`` assembles them; ``BENCHMARKS`` (``kvgov.cli.benchmarks``) is the registry of
``kvgov bench``, read here when the command runs. ``output`` prints what every command
prints alike; ``extras`` says what to install where an optional part is missing.
"""

from __future__ import annotations

from kvgov.cli.app import app
from kvgov.cli.benchmarks import BENCHMARKS

__all__ = ["BENCHMARKS", "app"]
