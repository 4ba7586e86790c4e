"""Directory listings: ``find . -type f`` over a repository, ``ls -la`` over a folder of
exports; a folder that cannot be read is the error line.
"""

from __future__ import annotations

import random

from policies.benchmarks.corpus._common import (
    NOUNS,
    PACKAGES,
    PROJECTS,
    VERBS,
    hex_digits,
    identifier,
)
from policies.benchmarks.corpus._writer import Call, Writer

__all__ = ["generate"]


def _repo_paths(rng: random.Random, chars: int) -> list[str]:
    paths: list[str] = []
    project, size = rng.choice(PROJECTS), 0
    while size < chars:
        root = rng.choice(("src", "tests", "docs", "node_modules", ".git/objects", "data"))
        if root == ".git/objects":
            path = f".git/objects/{hex_digits(rng, 2)}/{hex_digits(rng, 38)}"
        elif root == "node_modules":
            path = f"node_modules/{rng.choice(NOUNS)}-{rng.choice(VERBS)}/dist/{identifier(rng)}.js"
        elif root == "data":
            path = f"data/exports/part-{len(paths):05d}-{hex_digits(rng, 8)}.snappy.parquet"
        else:
            path = f"{root}/{project}/{rng.choice(PACKAGES)}/{identifier(rng)}.py"
        paths.append(path)
        size += len(path) + 3
    return sorted(set(paths))


def generate(rng: random.Random, out: Writer, tokens: int, variant: int) -> Call:
    flavour = ("find", "ls")[variant % 2]
    chars = int(tokens * (3.2 if flavour == "find" else 2.03))
    folders = ("var/lib", "secrets", "build/cache")
    denied = [f"./{rng.choice(folders)}/{rng.choice(NOUNS)}" for _ in range(rng.randint(0, 2))]
    if flavour == "ls":
        for path in denied:
            out.add(f"ls: cannot open directory '{path}': Permission denied", error=True)
        out.add(f"total {chars // 9}")
        while out.chars < chars:
            size, day = rng.randint(2_000, 90_000_000), rng.randint(1, 30)
            when = f"Nov {day:2d} {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"
            name = f"part-{len(out.lines):05d}-{hex_digits(rng, 8)}-c000.snappy.parquet"
            out.add(f"-rw-r--r--  1 etl  etl  {size:>9} {when} {name}")
        return flavour, "bash", {"command": "ls -la data/exports"}
    paths = _repo_paths(rng, chars)
    where = sorted(rng.sample(range(len(paths)), len(denied)))
    for i, path in enumerate(paths):
        if i in where:
            out.add(f"find: '{denied[where.index(i)]}': Permission denied", error=True)
        out.add(f"./{path}")
    return flavour, "bash", {"command": "find . -type f"}
