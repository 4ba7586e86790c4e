"""Web pages as raw HTML: a documentation page, a blog post with comments, an issue thread.

Each page carries what real pages carry around the text (head with meta, stylesheet and
script tags, navigation, sidebars, footer); the text comes from ``_documents``, option
names in ``<code>``. The facts are the sentences answering the question.
"""

from __future__ import annotations

import html
import random
import re

from policies.benchmarks.tool_outputs._common import Clock, alnum, hexid, login, num_chars
from policies.benchmarks.tool_outputs._documents import PROJECTS, options, question, write
from policies.benchmarks.tool_outputs.case import Case, Fact

__all__ = ["FORMATS", "build"]

FORMATS = ("docs", "blog", "issue_thread")
_CHARS_PER_TOKEN = {"docs": 4.9, "blog": 6.1, "issue_thread": 3.8}
_TEXT_SHARE = 0.6  # of a page's characters, the rest is markup


def build(rng: random.Random) -> Case:
    fmt = rng.choice(FORMATS)
    project = rng.choice(PROJECTS)
    asked = options(rng, rng.choice((1, 1, 2)))
    size = num_chars(rng, _CHARS_PER_TOKEN[fmt])
    sections, _ = write(rng, project, asked, int(size * _TEXT_SHARE))
    text, url = _RENDER[fmt](rng, project, sections)
    facts = tuple(
        Fact((o.name, o.value), "asked", f"{o.name} defaults to {o.value}") for o in asked
    )
    return Case("html", fmt, "web_fetch", {"url": url}, question(rng, project, asked), text, facts)


def _inline(sentence: str) -> str:
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(sentence, quote=False))


def _head(rng: random.Random, title: str, url: str) -> list[str]:
    build_id = hexid(rng, 8)
    return [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title>",
        f'<link rel="canonical" href="{url}">',
        f'<link rel="stylesheet" href="/_static/css/theme.{build_id}.css">',
        '<link rel="preconnect" href="https://fonts.gstatic.com" crossorigin>',
        f'<meta property="og:title" content="{html.escape(title)}">',
        '<meta property="og:type" content="article">',
        f'<script defer src="/_static/js/bundle.{build_id}.js"></script>',
        "<script>window.dataLayer=window.dataLayer||[];function gtag(){dataLayer.push(arguments)}"
        f"gtag('js',new Date());gtag('config','G-{alnum(rng, 10).upper()}');</script>",
        "</head>",
    ]


def _slug(heading: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-")


def _docs(rng: random.Random, project: str, sections: list) -> tuple[str, str]:
    version = f"3.{rng.randint(0, 9)}"
    page = rng.choice(("configuration", "operations", "tuning"))
    url = f"https://docs.{project}.dev/en/{version}/{page}.html"
    lines = _head(rng, f"{page.title()} — {project} {version} documentation", url)
    lines += [
        '<body class="wy-body-for-nav">',
        '<nav class="wy-nav-side" aria-label="Navigation">',
        f'<a class="icon icon-home" href="/en/{version}/index.html">{project}</a>',
        '<div class="version">' + version + "</div>",
        "<ul>",
    ]
    for heading, _ in sections:
        lines.append(
            f'<li class="toctree-l1"><a class="reference internal" href="#{_slug(heading)}">'
            f"{html.escape(heading)}</a></li>"
        )
    lines += [
        "</ul>",
        "</nav>",
        '<main class="wy-nav-content">',
        '<div role="main" class="document">',
        f'<h1>{page.title()}<a class="headerlink" href="#{page}" title="Link to this '
        'heading">¶</a></h1>',
    ]
    for heading, paragraphs in sections:
        lines += [
            f'<section id="{_slug(heading)}">',
            f'<h2>{html.escape(heading)}<a class="headerlink" href="#{_slug(heading)}" '
            'title="Link to this heading">¶</a></h2>',
        ]
        for paragraph in paragraphs:
            if rng.random() < 0.12:
                lines += [
                    '<div class="admonition note">',
                    '<p class="admonition-title">Note</p>',
                    f"<p>{_inline(' '.join(paragraph))}</p>",
                    "</div>",
                ]
            else:
                lines.append(f"<p>{_inline(' '.join(paragraph))}</p>")
        lines.append("</section>")
    lines += [
        "</div>",
        '<footer><div role="contentinfo"><p>&#169; Copyright 2024, the '
        f"{project} authors.</p></div></footer>",
        "</main>",
        "</body>",
        "</html>",
    ]
    return "\n".join(lines) + "\n", url


def _blog(rng: random.Random, project: str, sections: list) -> tuple[str, str]:
    site = rng.choice(("engineering.acme.io", "blog.globex.net", "tech.initech.co"))
    slug = f"{project}-in-production-{rng.randint(2022, 2024)}"
    url = f"https://{site}/posts/{slug}"
    title = f"Running {project.title()} in production: lessons learned"
    lines = _head(rng, title, url)
    lines += [
        "<body>",
        '<header class="site-header"><a class="logo" href="/">Engineering</a>',
        '<nav><a href="/posts">Posts</a> <a href="/tags">Tags</a> <a href="/about">About</a> '
        '<a href="/jobs">We are hiring</a></nav></header>',
        '<article class="post">',
        f'<h1 class="post-title">{html.escape(title)}</h1>',
        f'<p class="byline">By <a href="/authors/{login(rng)}">{login(rng)}</a> · '
        f"{rng.randint(4, 25)} min read</p>",
    ]
    for heading, paragraphs in sections:
        lines.append(f'<h2 id="{_slug(heading)}">{html.escape(heading)}</h2>')
        for paragraph in paragraphs:
            lines.append(f"<p>{_inline(' '.join(paragraph))}</p>")
    lines += ["</article>", '<aside class="related"><h3>Related posts</h3><ul>']
    for _ in range(5):
        verb = rng.choice(("scaling", "debugging", "migrating", "benchmarking"))
        other = f"{verb}-{alnum(rng, 6, lower=True)}"
        lines.append(f'<li><a href="/posts/{other}">{other.replace("-", " ").title()}</a></li>')
    lines += [
        "</ul></aside>",
        '<footer class="site-footer"><p>&#169; 2024</p></footer>',
        "</body>",
        "</html>",
    ]
    return "\n".join(lines) + "\n", url


def _issue_thread(rng: random.Random, project: str, sections: list) -> tuple[str, str]:
    number = rng.randint(400, 9_000)
    url = f"https://github.com/{project}/{project}/issues/{number}"
    title = f"Questions about default settings after upgrading to 3.{rng.randint(0, 9)}"
    clock = Clock(rng, step_s=(600, 200_000))
    lines = _head(rng, f"{title} · Issue #{number} · {project}/{project}", url)
    lines += [
        '<body class="logged-out env-production page-responsive">',
        '<div class="application-main"><main>',
        f'<h1 class="gh-header-title"><bdi class="js-issue-title">{html.escape(title)}</bdi> '
        f'<span class="f1-light color-fg-muted">#{number}</span></h1>',
        '<div class="js-discussion">',
    ]
    paragraphs = [p for _, ps in sections for p in ps]
    i = 0
    while i < len(paragraphs):
        n = rng.randint(1, 3)
        author = login(rng)
        when = clock.tick().strftime("%Y-%m-%dT%H:%M:%SZ")
        lines += [
            '<div class="timeline-comment-group js-minimizable-comment-group">',
            '<div class="timeline-comment-header">',
            f'<a class="author Link--primary text-bold" href="/{author}">{author}</a> '
            f'commented <relative-time datetime="{when}">{when}</relative-time>',
            "</div>",
            '<div class="comment-body markdown-body js-comment-body">',
        ]
        lines += [f"<p>{_inline(' '.join(p))}</p>" for p in paragraphs[i : i + n]]
        lines += ["</div>", "</div>"]
        i += n
    lines += ["</div>", "</main></div>", "</body>", "</html>"]
    return "\n".join(lines) + "\n", url


_RENDER = {"docs": _docs, "blog": _blog, "issue_thread": _issue_thread}
