"""Web pages as text: an issue thread (with a pasted traceback), documentation, an article.
Prose uses error words the way real documentation does; only the traceback is labelled.
"""

from __future__ import annotations

import random

from policies.benchmarks.corpus._common import (
    NOUNS,
    PROJECTS,
    VERBS,
    identifier,
    paragraph,
    python_traceback,
    sentence,
)
from policies.benchmarks.corpus._writer import Call, Writer

__all__ = ["generate"]


def generate(rng: random.Random, out: Writer, tokens: int, variant: int) -> Call:
    project, flavour = rng.choice(PROJECTS), ("issue", "docs", "article")[variant % 3]
    chars, pasted = int(tokens * (4.7 if flavour == "issue" else 5.3)), rng.randint(1, 2)
    title = f"Worker crashes after upgrade · Issue #{rng.randint(100, 9999)} · acme/{project}"
    if flavour != "issue":
        title = f"{project.title()}: how we cut p99 latency in half · {flavour}"
    out.add(f"{title}\n\nSkip to content\nProduct  Solutions  Docs  Pricing  Blog  Sign in\n")
    section = 0
    while out.chars < chars - 100:
        section += 1
        if flavour == "issue":
            ago = f"{rng.randint(1, 30)} days ago"
            out.add(f"dev{rng.randint(1, 400)} commented {ago}\n\n{paragraph(rng)}")
            if pasted and (section == 1 or rng.random() < 0.1):
                pasted -= 1
                traceback = python_traceback(rng, project, "KeyError: 'customer_id'")
                out.add_marked("\n```\n{traceback}\n```", traceback=traceback)
            out.add(f"\n👍 {rng.randint(0, 20)}  ❤️ {rng.randint(0, 5)}")
        else:
            heading = f"## {section}. {rng.choice(VERBS).title()} the {rng.choice(NOUNS)}"
            out.add(f"{heading}\n")
            for _ in range(rng.randint(1, 4)):
                out.add(f"{paragraph(rng)}\n")
            if rng.random() < 0.3:
                out.add("| Option | Default | Description |\n|---|---|---|")
                for _ in range(rng.randint(3, 10)):
                    out.add(f"| `{identifier(rng)}` | `{rng.randint(1, 600)}` | {sentence(rng)} |")
        out.add()
    out.add("Related: Quickstart · API reference · Changelog · Status\n\n© 2026 Acme, Inc.")
    return flavour, "fetch", {"url": f"https://docs.acme.dev/{project}/{flavour}"}
