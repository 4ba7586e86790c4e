"""The live page's files: every one ships as package data, each references only this
server, and the routes serve a fixed list of them with a CSP that says so to a browser."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from fnmatch import fnmatch
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from backends.local.backend import LocalBackend
from kvgov.serve import create_app
from kvgov.serve.page import CONTENT_SECURITY_POLICY, PUBLIC_PATHS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[3]
STATIC = ROOT / "kvgov" / "serve" / "static"


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    backend = LocalBackend(config={"num_blocks": 8})
    try:
        with TestClient(create_app(backend)) as made:
            yield made
    finally:
        backend.close()


def test_every_static_file_ships_as_package_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = config["tool"]["setuptools"]["package-data"]["kvgov.serve.static"]
    files = [p.name for p in STATIC.iterdir() if p.is_file() and p.suffix != ".py"]
    assert sorted(files) == ["favicon.svg", "index.html", "live.css", "live.js"]
    assert all(any(fnmatch(name, pattern) for pattern in patterns) for name in files)


def test_the_page_references_nothing_outside_the_server() -> None:
    for path in STATIC.iterdir():
        if path.suffix in (".html", ".css", ".js"):
            text = path.read_text(encoding="utf-8")
            # No absolute URL, no protocol-relative one, no @import, no web font.
            assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text, re.I), path.name
            assert "@import" not in text and "@font-face" not in text, path.name
    html = (STATIC / "index.html").read_text(encoding="utf-8")
    linked = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert linked and all(url.startswith("/") for url in linked), linked
    assert "<script>" not in html and " style=" not in html  # the CSP allows neither


def test_the_shell_is_public_and_carries_the_csp(client: TestClient) -> None:
    assert sorted(PUBLIC_PATHS) == [
        "/",
        "/static/favicon.svg",
        "/static/live.css",
        "/static/live.js",
    ]
    for path in sorted(PUBLIC_PATHS):
        response = client.get(path)
        assert response.status_code == 200, path
        assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert response.headers["x-content-type-options"] == "nosniff"
    assert client.get("/").headers["content-type"] == "text/html; charset=utf-8"
    assert client.get("/static/live.js").headers["content-type"].startswith("text/javascript")


@pytest.mark.parametrize(
    "path", ["/static/__init__.py", "/static/index.html", "/static/..%2Fpage.py", "/static/x.js"]
)
def test_only_the_listed_files_are_served(client: TestClient, path: str) -> None:
    assert client.get(path).status_code == 404
