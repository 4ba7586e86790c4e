"""Directory listings of a monorepo: ``find``, ``ls -laR``, ``tree``, ``git ls-files``, ``du -ah``.

The repository holds services, deploy manifests, a web app, docs and Terraform; one file
with a name found nowhere else in it is what the question looks for ("where is the
Alembic config?"), or, for ``du``, one file far larger than the rest (what fills the
disk). ``find`` and ``du`` walk directories in the file system's order (not sorted);
the others sort, as they do.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import timedelta

from policies.benchmarks.tool_outputs._common import (
    NOUNS,
    SERVICES,
    VERBS,
    Clock,
    num_chars,
    pascal,
)
from policies.benchmarks.tool_outputs.case import Case, Fact

__all__ = ["FORMATS", "build"]

FORMATS = ("find", "ls_laR", "tree", "git_ls_files", "du")
_CHARS_PER_TOKEN = {"find": 4.7, "ls_laR": 0.9, "tree": 2.8, "git_ls_files": 4.9, "du": 3.1}
_CHARS_PER_FILE = {"find": 48, "ls_laR": 66, "tree": 30, "git_ls_files": 42, "du": 50}
_Tree = dict  # name -> size in bytes (a file) or another _Tree (a folder)

# A file whose name appears once in the repository: its name, what people call it, its folder.
_SOUGHT = (
    ("alembic.ini", "the Alembic migrations config for {svc}", "services/{svc}"),
    ("backend.tf", "the Terraform state backend for {env}", "infra/terraform/envs/{env}"),
    ("openapi.yaml", "the OpenAPI spec of the {svc} service", "services/{svc}/api"),
    ("docker-compose.override.yml", "the local docker-compose override", "tools/local-dev"),
    ("CODEOWNERS", "the CODEOWNERS file", ".github"),
    ("pgbouncer.ini", "the pgbouncer config used by {svc}", "deploy/{svc}/pgbouncer"),
    ("renovate.json5", "the Renovate bot config", ".github"),
    ("feature_flags.toml", "the feature flag defaults for {svc}", "services/{svc}/config"),
)
_HOGS = ("heap-{n}.hprof", "core.{n}", "dump-{n}.sql.gz", "debug-{n}.log", "snapshot-{n}.tar")


def build(rng: random.Random) -> Case:
    fmt = rng.choice(FORMATS)
    num_files = num_chars(rng, _CHARS_PER_TOKEN[fmt]) // _CHARS_PER_FILE[fmt]
    services = rng.sample(SERVICES, 6)
    tree: _Tree = {}
    paths: set[str] = set()
    while len(paths) < num_files:
        path = _random_path(rng, services)
        paths.add(path)
        _add(tree, path, rng.choice((1, 1, 4, 12, 40)) * rng.randint(80, 900))
    svc, env = rng.choice(services), rng.choice(("prod", "staging", "dev"))
    if fmt == "du":
        name = rng.choice(_HOGS).format(n=rng.randint(1_000, 99_999))
        folder = rng.choice(("data/exports", "var/log", "tmp", f"services/{svc}/.cache"))
        path = f"{folder}/{name}"
        size = rng.randint(8, 60) * 1024**3 + rng.randint(0, 1023) * 1024**2
        _add(tree, path, size)
        text = _du(rng, tree)
        question = rng.choice(
            (
                "The disk on this box is almost full. What's taking the space?",
                "Find the biggest file under the checkout; CI runs out of disk.",
            )
        )
        fact = Fact((_human(size), path), "standout", f"{path} is {_human(size)}")
        return Case("listing", fmt, "shell", {"command": "du -ah ."}, question, text, (fact,))
    name, words, folder = rng.choice(_SOUGHT)
    folder, words = folder.format(svc=svc, env=env), words.format(svc=svc, env=env)
    path = f"{folder}/{name}"
    _add(tree, path, rng.randint(300, 9_000))
    text, arguments, needles = _RENDER[fmt](rng, tree, path)
    question = rng.choice(
        (
            f"Where is {words}?",
            f"Which file holds {words}? I need its path.",
            f"Find {name} in this repo.",
        )
    )
    return Case(
        "listing",
        fmt,
        "shell",
        arguments,
        question,
        text,
        (Fact(needles, "asked", f"{words}: {path}"),),
    )


def _random_path(rng: random.Random, services: list[str]) -> str:
    svc, noun, env = rng.choice(services), rng.choice(NOUNS), rng.choice(("prod", "staging", "dev"))
    return rng.choice(
        (
            f"services/{svc}/src/{svc}/{noun}.py",
            f"services/{svc}/src/{svc}/{rng.choice(('api', 'db', 'jobs'))}/"
            f"{noun}_{rng.choice(VERBS)}.py",
            f"services/{svc}/tests/test_{noun}.py",
            f"services/{svc}/config/{env}.yaml",
            f"services/{svc}/{rng.choice(('Dockerfile', 'README.md', 'pyproject.toml'))}",
            f"deploy/{svc}/values-{env}.yaml",
            f"deploy/{svc}/templates/{rng.choice(('deployment', 'service', 'hpa'))}.yaml",
            f"web/src/components/{pascal(noun, rng.choice(VERBS))}.tsx",
            f"web/src/hooks/use{pascal(noun)}.ts",
            f"web/public/img/{noun}-{rng.randint(1, 400)}.png",
            f"docs/{rng.choice(('guides', 'adr', 'runbooks'))}/{rng.choice(VERBS)}-{noun}s.md",
            f"infra/terraform/modules/{noun}/{rng.choice(('main', 'variables', 'outputs'))}.tf",
            f".github/workflows/{svc}-{rng.choice(('ci', 'deploy', 'nightly'))}.yml",
            f"scripts/{rng.choice(VERBS)}-{noun}s.sh",
        )
    )


def _add(tree: _Tree, path: str, size: int) -> None:
    *folders, name = path.split("/")
    for folder in folders:
        tree = tree.setdefault(folder, {})
    tree[name] = size


def _count(tree: _Tree) -> int:
    return sum(_count(v) if isinstance(v, dict) else 1 for v in tree.values())


def _walk(
    tree: _Tree, prefix: str, order: list[str] | None = None
) -> Iterator[tuple[str, _Tree | int]]:
    """Pre-order (path, entry) pairs; sorted unless ``order`` gives each folder's order."""
    for name in sorted(tree) if order is None else tree:
        path = f"{prefix}/{name}" if prefix else name
        yield path, tree[name]
        if isinstance(tree[name], dict):
            yield from _walk(tree[name], path, order)


def _shuffled(rng: random.Random, tree: _Tree) -> _Tree:
    """The same tree in a file system's arbitrary directory order."""
    names = list(tree)
    rng.shuffle(names)
    return {n: _shuffled(rng, tree[n]) if isinstance(tree[n], dict) else tree[n] for n in names}


def _find(rng: random.Random, tree: _Tree, path: str) -> tuple:
    lines = ["."] + [f"./{p}" for p, _ in _walk(_shuffled(rng, tree), "", order=[])]
    return "\n".join(lines) + "\n", {"command": "find . -not -path './.git/*'"}, (path,)


def _git_ls_files(rng: random.Random, tree: _Tree, path: str) -> tuple:
    lines = [p for p, entry in _walk(tree, "") if not isinstance(entry, dict)]
    return "\n".join(lines) + "\n", {"command": "git ls-files"}, (path,)


def _ls_laR(rng: random.Random, tree: _Tree, path: str) -> tuple:
    clock = Clock(rng, step_s=(0, 90_000))
    user = rng.choice(("ci", "runner", "dev", "app"))

    def listing(folder: str, entries: _Tree) -> list[str]:
        rows = [("drwxr-xr-x", 4_096, "."), ("drwxr-xr-x", 4_096, "..")]
        for name in sorted(entries):
            entry = entries[name]
            if isinstance(entry, dict):
                rows.append(("drwxr-xr-x", 4_096, name))
            else:
                mode = "-rwxr-xr-x" if name.endswith(".sh") else "-rw-r--r--"
                rows.append((mode, entry, name))
        width = max(len(str(size)) for _, size, _ in rows)
        total = sum(-(-size // 4_096) * 4 for _, size, _ in rows[2:])
        out = [f"{folder}:", f"total {total}"]
        for mode, size, name in rows:
            when = clock.now - timedelta(seconds=rng.randint(0, 9_000_000))
            links = 2 if mode.startswith("d") else 1
            out.append(f"{mode} {links} {user} {user} {size:>{width}} {when:%b %d %H:%M} {name}")
        return [*out, ""]

    lines = listing(".", tree)
    for p, entry in _walk(tree, ""):
        if isinstance(entry, dict):
            lines += listing(f"./{p}", entry)
    folder, name = path.rsplit("/", 1)
    return "\n".join(lines), {"command": "ls -laR"}, (folder, name)


def _tree(rng: random.Random, tree: _Tree, path: str) -> tuple:
    lines = ["."]

    def draw(entries: _Tree, indent: str) -> None:
        names = sorted(entries)
        for i, name in enumerate(names):
            last = i == len(names) - 1
            lines.append(f"{indent}{'└── ' if last else '├── '}{name}")
            if isinstance(entries[name], dict):
                draw(entries[name], indent + ("    " if last else "│   "))

    draw(tree, "")
    folders = sum(1 for _, e in _walk(tree, "") if isinstance(e, dict))
    lines += ["", f"{folders} directories, {_count(tree)} files"]
    # A tree prints a path as its parts, each folder on the line that opens it.
    return "\n".join(lines) + "\n", {"command": "tree -a -I .git"}, tuple(path.split("/"))


def _human(size: int) -> str:
    """du -h's sizes: 4.0K, 12K, 1.5M, 38G (one decimal below 10)."""
    value, unit = float(size) / 1024, "K"
    for bigger in ("M", "G", "T"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    value = max(value, 4.0) if unit == "K" else value
    rounded = -(-value * 10 // 1) / 10 if value < 10 else -(-value // 1)
    return f"{rounded:.1f}{unit}" if value < 10 else f"{int(rounded)}{unit}"


def _du(rng: random.Random, tree: _Tree) -> str:
    lines: list[str] = []

    def visit(entries: _Tree, prefix: str) -> int:
        total = 4_096
        for name, entry in entries.items():
            path = f"{prefix}/{name}"
            if isinstance(entry, dict):
                total += visit(entry, path)
            else:
                blocks = -(-entry // 4_096) * 4_096
                total += blocks
                lines.append(f"{_human(blocks)}\t{path}")
        lines.append(f"{_human(total)}\t{prefix}")
        return total

    visit(_shuffled(rng, tree), ".")
    return "\n".join(lines) + "\n"


_RENDER = {"find": _find, "ls_laR": _ls_laR, "tree": _tree, "git_ls_files": _git_ls_files}
