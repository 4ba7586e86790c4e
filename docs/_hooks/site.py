"""MkDocs hook: the README is the site's front page, and links that leave docs/ land on the site.

The README and CONTRIBUTING.md live at the repository's root, where GitHub shows them; the
site is built from docs/. This hook adds them to the site as ``index.md`` and
``contributing.md`` (with the README's picture), rewriting the README's links into docs/
(``docs/x.md`` -> ``x.md``), and points links from docs/ pages to those two files
(``../README.md``, ``../../CONTRIBUTING.md``) at their site copies. A page that links to any
other file outside docs/ fails the strict build, as a broken link does.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
# repository path -> its page on the site
PAGES = {"README.md": "index.md", "CONTRIBUTING.md": "contributing.md"}
PICTURES = ("examples/memory-map.svg",)
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s#]+)(#[^)\s]*)?\)")


def _on_site(repo_path: str) -> str | None:
    """The site's path (under docs/) of a file of the repository, or None."""
    if repo_path.startswith("docs/"):
        site = repo_path.removeprefix("docs/")
        folder_readme = posixpath.join(site, "README.md")
        return folder_readme if (ROOT / "docs" / folder_readme).is_file() else site
    return PAGES.get(repo_path) or (repo_path if repo_path in PICTURES else None)


def _relink(markdown: str, repo_dir: str, page_dir: str) -> str:
    """``markdown``'s relative links, written from ``repo_dir`` of the repository, as seen
    from the site's ``page_dir``; a link into docs/ that needs nothing is left alone."""

    def swap(match: re.Match[str]) -> str:
        text, target, anchor = match.group(1), match.group(2), match.group(3) or ""
        if "://" in target or target.startswith(("mailto:", "/")):
            return match.group(0)
        repo_path = posixpath.normpath(posixpath.join(repo_dir, target))
        if (ROOT / repo_path).is_dir() and not (ROOT / repo_path / "README.md").is_file():
            return f"{text} (`{repo_path}/` in the repository)"  # a site has no folder views
        site = _on_site(repo_path)
        if site is None:
            return match.group(0)  # mkdocs reports it as a link it cannot find
        return f"[{text}]({posixpath.relpath(site, page_dir or '.')}{anchor})"

    return LINK.sub(swap, markdown)


def on_files(files: Files, config: Any) -> Files:
    for repo_path, site_path in PAGES.items():
        text = (ROOT / repo_path).read_text(encoding="utf-8")
        files.append(File.generated(config, site_path, content=_relink(text, "", "")))
    for picture in PICTURES:
        files.append(File.generated(config, picture, abs_src_path=str(ROOT / picture)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if page.file.generated_by:
        return markdown  # the README and CONTRIBUTING, relinked in on_files
    page_dir = posixpath.dirname(page.file.src_uri)
    return _relink(markdown, posixpath.join("docs", page_dir), page_dir)
