"""Diffs over many files: ``git diff``, ``diff -ru`` between two release trees, ``git show``.

Hunks have correct headers and three lines of context. Besides code edits, several
settings change (timeouts, pool sizes, limits), each once; the facts are the changes the
question asks about ("what changed in the retry timeout?"): the file and the new value
on the ``+`` line. Other files use the same setting without changing it.
"""

from __future__ import annotations

import random

from policies.benchmarks.tool_outputs._code import (
    LANGUAGES,
    SETTINGS,
    code_line,
    language_of,
    setting_line,
    setting_name,
    setting_usage,
    source_path,
)
from policies.benchmarks.tool_outputs._common import (
    DOMAINS,
    Clock,
    Unique,
    fill,
    hexid,
    num_chars,
    person,
    plant,
)
from policies.benchmarks.tool_outputs.case import Case, Fact

__all__ = ["FORMATS", "build"]

FORMATS = ("git_diff", "unified", "git_show")
_CHARS_PER_TOKEN = 2.7
_Change = tuple[str, str, str, str]  # name, unit, old value, new value


def build(rng: random.Random) -> Case:
    fmt = rng.choice(FORMATS)
    size = num_chars(rng, _CHARS_PER_TOKEN)
    chosen = rng.sample(SETTINGS, rng.randint(3, 6))
    asked = chosen[: rng.choice((1, 1, 2))]
    changes = {s[1]: _change(rng, s[1], s[2]) for s in chosen}
    paths = Unique()
    minor = rng.randint(1, 9)
    old_tree, new_tree = f"release-2.{minor}", f"release-2.{minor + 1}"
    clock = Clock(rng)

    def block(change: _Change | None = None) -> list[str]:
        language = rng.choice(LANGUAGES)
        path = paths(lambda: source_path(rng, language))
        used = [s for s in asked if rng.random() < 0.3]  # the asked setting, used elsewhere
        return _file(rng, fmt, path, change, used, old_tree, new_tree, clock)

    blocks = fill(block, size, lambda b: sum(len(line) + 1 for line in b))
    planted = [(s, block(changes[s[1]])) for s in chosen]
    plant(rng, blocks, [b for _, b in planted])
    lines = [line for b in blocks for line in b]
    facts = []
    for setting, b in planted[: len(asked)]:
        path = _path_of(b)
        name, unit, old, new = changes[setting[1]]
        spelled = setting_name(name, unit, language_of(path))
        facts.append(Fact((path, spelled, new), "asked", f"{path}: {spelled} {old} -> {new}"))
    if fmt == "git_show":
        lines = _commit_header(rng, clock, [s[0] for s in chosen]) + lines
    phrases = " and the ".join(s[0] for s in asked)
    question = rng.choice(
        (
            f"What changed in the {phrases}?",
            f"Does this change touch the {phrases}? What are the new values?",
            f"Staging behaves differently since this change; I suspect the {phrases}. "
            "What was it set to?",
        )
    )
    arguments = {
        "git_diff": {"command": "git diff origin/main...HEAD"},
        "unified": {"command": f"diff -ru {old_tree} {new_tree}"},
        "git_show": {"command": f"git show {hexid(rng, 7)}"},
    }[fmt]
    return Case("diff", fmt, "shell", arguments, question, "\n".join(lines) + "\n", tuple(facts))


def _change(rng: random.Random, name: str, unit: str) -> _Change:
    low, high = {"s": (5, 600), "ms": (200, 20_000)}.get(unit, (2, 500))
    old = rng.randint(low, high)
    new = old
    while new == old:
        new = rng.randint(low, high)
    return name, unit, str(old), str(new)


def _path_of(block: list[str]) -> str:
    for line in block:
        if line.startswith("+++ "):
            path = line[4:].split("\t")[0]
            return path.split("/", 1)[1]  # without b/ or the release folder
    raise AssertionError("a file block without its +++ line")


def _file(
    rng: random.Random,
    fmt: str,
    path: str,
    change: _Change | None,
    used: list[tuple[str, str, str]],
    old_tree: str,
    new_tree: str,
    clock: Clock,
) -> list[str]:
    language = language_of(path)
    if fmt == "unified":
        stamp = clock.tick().strftime("%Y-%m-%d %H:%M:%S.%f000 +0000")
        head = [
            f"diff -ru {old_tree}/{path} {new_tree}/{path}",
            f"--- {old_tree}/{path}\t{stamp}",
            f"+++ {new_tree}/{path}\t{stamp}",
        ]
    else:
        head = [
            f"diff --git a/{path} b/{path}",
            f"index {hexid(rng, 7)}..{hexid(rng, 7)} 100644",
            f"--- a/{path}",
            f"+++ b/{path}",
        ]
    num_hunks = rng.randint(1, 4)
    with_change = rng.randrange(num_hunks)
    lines = head
    start = rng.randint(1, 40)
    shift = 0
    for i in range(num_hunks):
        context = [code_line(rng, language) for _ in range(6)]
        for _, name, unit in used:
            context[rng.randrange(6)] = setting_usage(rng, name, unit, language)
        body: list[tuple[str, str]] = []
        for _ in range(rng.randint(1, 5)):
            op = rng.choice(("modify", "modify", "add", "remove"))
            if op in ("modify", "remove"):
                body.append(("-", code_line(rng, language)))
            if op in ("modify", "add"):
                body.append(("+", code_line(rng, language)))
        if change is not None and i == with_change:
            name, unit, old, new = change
            at = rng.randrange(len(body) + 1)
            body[at:at] = [
                ("-", setting_line(name, unit, old, language)),
                ("+", setting_line(name, unit, new, language)),
            ]
        old_len = 6 + sum(op == "-" for op, _ in body)
        new_len = 6 + sum(op == "+" for op, _ in body)
        where = rng.choice(("", "", f" {code_line(rng, language).strip()}"))
        lines.append(f"@@ -{start},{old_len} +{start + shift},{new_len} @@{where}".rstrip())
        lines += [f" {line}" for line in context[:3]]
        lines += [f"{op}{line}" for op, line in body]
        lines += [f" {line}" for line in context[3:]]
        shift += new_len - old_len
        start += old_len + rng.randint(5, 120)
    return lines


def _commit_header(rng: random.Random, clock: Clock, topics: list[str]) -> list[str]:
    first, last = person(rng)
    when = clock.tick().strftime("%a %b %d %H:%M:%S %Y +0000")
    return [
        f"commit {hexid(rng, 40)}",
        f"Author: {first.title()} {last.title()} <{first}.{last}@{rng.choice(DOMAINS)}>",
        f"Date:   {when}",
        "",
        f"    Tune {topics[-1]} and related settings for the EU rollout",
        "",
        "    Load tests on the EU cluster showed queueing under peak traffic; this",
        "    adjusts several limits together and cleans up the handlers they touch.",
        "",
    ]
