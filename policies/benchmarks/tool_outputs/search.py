"""Search results: ``grep -rn``, ripgrep with ``--heading``, a web search tool's result list.

A code search finds a setting's name in many files: its definition in several services
(each with its own value), its uses, tests and docs; the fact is the definition in the
service the question names. A web search returns pages with extracts; the fact is the
sentence that answers the question (from ``_documents``).
"""

from __future__ import annotations

import random

from policies.benchmarks.tool_outputs._code import (
    SETTINGS,
    setting_line,
    setting_name,
    setting_usage,
    source_path,
)
from policies.benchmarks.tool_outputs._common import (
    SERVICES,
    Clock,
    Unique,
    alnum,
    fill,
    num_chars,
    plant,
)
from policies.benchmarks.tool_outputs._documents import PROJECTS, options, question, write
from policies.benchmarks.tool_outputs.case import Case, Fact

__all__ = ["FORMATS", "build"]

FORMATS = ("grep", "ripgrep", "web_search")
_CHARS_PER_TOKEN = {"grep": 3.45, "ripgrep": 4.2, "web_search": 5.1}
_Hit = tuple[str, int, str]  # path, line, text


def build(rng: random.Random) -> Case:
    fmt = rng.choice(FORMATS)
    size = num_chars(rng, _CHARS_PER_TOKEN[fmt])
    if fmt == "web_search":
        return _web_search(rng, size)
    phrase, name, unit = rng.choice(SETTINGS)
    language = rng.choice(("python", "typescript"))  # both spell it MAX_RETRIES
    spelled = setting_name(name, unit, language)
    services = rng.sample(SERVICES, 10)
    target_service = services[0]
    lines_taken = Unique()

    def hit(path: str, text: str) -> _Hit:
        line = int(lines_taken(lambda: f"{path}:{rng.randint(100, 999)}").rsplit(":", 1)[1])
        return path, line, text

    def definition(service: str, value: int) -> _Hit:
        path = source_path(rng, language, service)
        return hit(path, setting_line(name, unit, str(value), language))

    def other() -> _Hit:
        service = rng.choice(services[1:])
        kind = rng.random()
        if kind < 0.06:
            return definition(service, _other_value(rng, target_value))
        if kind < 0.85:
            path = source_path(rng, language, rng.choice(services))
            return hit(path, setting_usage(rng, name, unit, language))
        if kind < 0.95:
            path = f"docs/{rng.choice(('configuration', 'operations', 'clients'))}.md"
            return hit(path, f"Set `{spelled}` per service; the {phrase} differs between clients.")
        return hit(
            "CHANGELOG.md",
            f"- Raise {spelled} for {rng.choice(services)} ({alnum(rng, 7, lower=True)})",
        )

    target_value = rng.randint(2, 60)
    hits = fill(other, size, lambda h: len(h[0]) + len(h[2]) + 6)
    target = definition(target_service, target_value)
    plant(rng, hits, [target])
    hits.sort(key=lambda h: (h[0], h[1]))  # grep walks files in order; rg sorts with --sort path
    path, line, _ = target
    value_phrase = f"{spelled} = {target_value}"  # in "export const MAX_RETRIES = 7;" too
    if fmt == "grep":
        out = "\n".join(f"./{p}:{n}:{t}" for p, n, t in hits) + "\n"
        needles = (f"{path}:{line}", value_phrase)
        arguments = {"command": f"grep -rn {spelled} ."}
    else:
        out_lines, previous = [], None
        for p, n, t in hits:
            if p != previous:
                out_lines += ([""] if previous else []) + [p]
                previous = p
            out_lines.append(f"{n}:{t}")
        out = "\n".join(out_lines) + "\n"
        needles = (path, value_phrase)
        arguments = {"command": f"rg --heading -n --sort path {spelled}"}
    question_text = rng.choice(
        (
            f"Where is {spelled} defined for the {target_service} client, and what is it set to?",
            f"What {phrase} does {target_service} use? Find where it's configured.",
        )
    )
    fact = Fact(needles, "asked", f"{target_service}: {value_phrase} at {path}:{line}")
    return Case("search", fmt, "shell", arguments, question_text, out, (fact,))


def _other_value(rng: random.Random, target: int) -> int:
    """A value whose digits neither start with nor are the target's (7 vs 70 would match)."""
    while True:
        value = rng.randint(2, 600)
        if not str(value).startswith(str(target)):
            return value


def _web_search(rng: random.Random, size: int) -> Case:
    project = rng.choice(PROJECTS)
    asked = options(rng, 1)
    sections, _ = write(rng, project, asked, int(size * 0.8))
    paragraphs = [p for _, ps in sections for p in ps]
    clock = Clock(rng, step_s=(86_400, 90 * 86_400))
    sites = (
        f"docs.{project}.dev/en/stable",
        f"github.com/{project}/{project}/issues",
        "stackoverflow.com/questions",
        "medium.com/@" + rng.choice(("ops", "devnotes", "sre")),
        f"{project}.discourse.group/t",
        "news.ycombinator.com/item",
    )
    lines = [
        f'Search results for "{project} {asked[0].name} default" ({len(paragraphs) // 3 + 1} '
        "results)",
        "",
    ]
    i, rank = 0, 1
    while i < len(paragraphs):
        n = rng.randint(2, 4)
        chunk = paragraphs[i : i + n]
        site = rng.choice(sites)
        title = (
            f"{project.title()} {rng.choice(('configuration', 'tuning', 'FAQ', 'release notes'))}"
        )
        lines += [
            f"[{rank}] {title} - {site.split('/')[0]}",
            f"URL: https://{site}/{rng.randint(1_000, 9_999_999)}",
            f"Published: {clock.tick():%Y-%m-%d}",
            "Content:",
        ]
        lines += [" ".join(p).replace("`", "") for p in chunk]
        lines.append("")
        i += n
        rank += 1
    option = asked[0]
    fact = Fact((option.name, option.value), "asked", f"{option.name} defaults to {option.value}")
    arguments = {
        "query": f"{project} {option.name} default value",
        "max_results": rank - 1,
        "include_raw_content": True,
    }
    return Case(
        "search",
        "web_search",
        "web_search",
        arguments,
        question(rng, project, asked),
        "\n".join(lines),
        (fact,),
    )
