"""Plain-text documentation: a markdown guide, a man page, an article as plain text.

The text comes from ``_documents``; the facts are the sentences giving the defaults the
question asks about. Hard wrapping (markdown sometimes, man pages always) never breaks
inside an option's name or value, as a man page renders them.
"""

from __future__ import annotations

import random
import textwrap

from policies.benchmarks.tool_outputs._common import num_chars, person
from policies.benchmarks.tool_outputs._documents import PROJECTS, options, question, write
from policies.benchmarks.tool_outputs.case import Case, Fact

__all__ = ["FORMATS", "build", "wrap"]

FORMATS = ("markdown", "man", "article")
_CHARS_PER_TOKEN = {"markdown": 4.5, "man": 4.4, "article": 4.95}


def build(rng: random.Random) -> Case:
    fmt = rng.choice(FORMATS)
    project = rng.choice(PROJECTS)
    asked = options(rng, rng.choice((1, 1, 2)))
    sections, _ = write(rng, project, asked, num_chars(rng, _CHARS_PER_TOKEN[fmt]))
    protected = [o.value for o in asked]
    text, tool, arguments = _RENDER[fmt](rng, project, sections, protected)
    facts = tuple(
        Fact((o.name, o.value), "asked", f"{o.name} defaults to {o.value}") for o in asked
    )
    return Case("prose", fmt, tool, arguments, question(rng, project, asked), text, facts)


def wrap(text: str, width: int, indent: str, protected: list[str]) -> list[str]:
    """``text`` filled to ``width``, never breaking inside a protected phrase."""
    for phrase in protected:
        text = text.replace(phrase, phrase.replace(" ", "\u00a0"))
    lines = textwrap.wrap(
        text,
        width,
        initial_indent=indent,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return [line.replace("\u00a0", " ") for line in lines]


def _markdown(rng: random.Random, project: str, sections: list, protected: list[str]) -> tuple:
    hard_wrap = rng.random() < 0.5
    lines = [
        f"# {project.title()} operations guide",
        "",
        f"> This page covers {project} 3.{rng.randint(0, 9)}. Older releases are documented "
        "on the versions page.",
        "",
    ]
    for heading, paragraphs in sections:
        lines += [f"## {heading}", ""]
        for paragraph in paragraphs:
            if rng.random() < 0.15:
                lines += [f"- {s}" for s in paragraph]
            elif hard_wrap:
                lines += wrap(" ".join(paragraph), 80, "", protected)
            else:
                lines.append(" ".join(paragraph))
            lines.append("")
        if rng.random() < 0.2:
            lines += ["```sh", f"{project}ctl config get --effective | grep -v '^#'", "```", ""]
    path = f"docs/{rng.choice(('operations', 'configuration', 'admin'))}.md"
    return "\n".join(lines), "read_file", {"path": path}


def _man(rng: random.Random, project: str, sections: list, protected: list[str]) -> tuple:
    title = f"{project.upper()}D(8)"
    manual = "System Manager's Manual"
    lines = [
        f"{title}{manual:^{79 - 2 * len(title)}}{title}",
        "",
        "NAME",
        f"       {project}d - the {project} server",
        "",
        "SYNOPSIS",
        f"       {project}d [--config FILE] [--data-dir DIR] [--log-level LEVEL]",
        "",
    ]
    for heading, paragraphs in sections:
        lines.append(heading.upper())
        for paragraph in paragraphs:
            text = " ".join(paragraph).replace("`", "")
            lines += [*wrap(text, 79, "       ", protected), ""]
    version = f"{project} 3.{rng.randint(0, 9)}.{rng.randint(0, 9)}"
    lines.append(f"{version}{'2024-03-02':^{79 - len(version) - len(title)}}{title}")
    return "\n".join(lines) + "\n", "shell", {"command": f"man {project}d | col -b"}


def _article(rng: random.Random, project: str, sections: list, protected: list[str]) -> tuple:
    first, last = person(rng)
    lines = [
        f"Running {project.title()} in production: what we learned",
        "",
        f"By {first.title()} {last.title()} | {rng.randint(3, 25)} min read",
        "",
    ]
    for heading, paragraphs in sections:
        lines += [heading, ""]
        for paragraph in paragraphs:
            lines += [" ".join(paragraph).replace("`", ""), ""]
    url = (
        f"https://engineering.{rng.choice(('acme.io', 'globex.net'))}/posts/{project}-in-production"
    )
    return "\n".join(lines), "web_fetch", {"url": url, "format": "text"}


_RENDER = {"markdown": _markdown, "man": _man, "article": _article}
