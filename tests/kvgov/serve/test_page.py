"""The live page in a real headless browser: Debian's Chromium driven by Playwright against
a real uvicorn server on 127.0.0.1 around the real engine (tiny model).

The page renders, shows the figures ``/metrics`` shows at that instant, follows a request
as it runs and after it is stopped, lists events, and fetches nothing from any host but
the server. Skipped where Chromium or Playwright is missing, except under CI, where
that fails.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backends.local.backend import LocalBackend
from governor.backend import GenerationRequest
from kvgov.serve import ServeSettings, create_app
from kvgov.serve.background import serving
from kvgov.serve.security import tenant_id

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SHARED_LABELS = {"model_name", "engine"}  # on every sample; the page leaves them out
Figures = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _need_browser() -> Any:
    missing = []
    if not CHROMIUM.exists():
        missing.append(f"{CHROMIUM} (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing.append("playwright (pip install playwright)")
    if missing:
        reason = "the live page's browser test needs " + " and ".join(missing)
        if os.environ.get("CI"):
            pytest.fail(reason + "; CI must run it")
        pytest.skip(reason)
    return sync_playwright


@pytest.fixture(scope="module")
def backend() -> Iterator[LocalBackend]:
    made = LocalBackend(config={"num_blocks": 32})
    yield made
    made.close()


@pytest.fixture(scope="module")
def app(backend: LocalBackend) -> Any:
    return create_app(backend)


@pytest.fixture(scope="module")
def base_url(app: Any) -> Iterator[str]:
    with serving(app) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_playwright = _need_browser()
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        yield launched
        launched.close()


def scrape(base_url: str, key: str | None = None) -> Figures:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    text = httpx.get(f"{base_url}/metrics", headers=headers, timeout=10).text
    return {
        (s.name, frozenset((k, v) for k, v in s.labels.items() if k not in SHARED_LABELS)): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def page_figures(page: Any) -> list[tuple[str, frozenset[tuple[str, str]], float]]:
    rows = page.eval_on_selector_all(
        "[data-metric]",
        "els => els.map(e => [e.dataset.metric, e.dataset.labels, e.dataset.value])",
    )
    return [
        (name, frozenset(json.loads(labels).items()), float(value)) for name, labels, value in rows
    ]


def updates(page: Any) -> int:
    return int(page.get_attribute("#updated", "data-updates"))


def next_update(page: Any, after: int, timeout_s: float = 10) -> None:
    # A function, not an expression: the page's CSP forbids eval, which an expression needs.
    page.wait_for_function(
        "after => Number(document.getElementById('updated').dataset.updates) > after",
        arg=after,
        timeout=timeout_s * 1000,
    )


def wait_until_page_shows_metrics(
    page: Any, base_url: str, timeout_s: float = 20, key: str | None = None
) -> Figures:
    """The page's figures and a scrape of /metrics agree (the engine is idle, so each poll
    of the page and each scrape read the same instant's figures)."""
    deadline = time.monotonic() + timeout_s
    while True:
        seen = updates(page)
        want = scrape(base_url, key)
        shown = page_figures(page)
        wrong = [(n, dict(labels), v, want.get((n, labels))) for n, labels, v in shown]
        wrong = [w for w in wrong if w[2] != w[3]]
        missing = set(want) - {(n, labels) for n, labels, _ in shown}
        if not wrong and not missing:
            return want
        if time.monotonic() > deadline:
            pytest.fail(f"the page shows {wrong} and lacks {sorted(missing)} of /metrics")
        next_update(page, seen)


def wait_for(page: Any, selector: str, timeout_s: float = 15) -> None:
    page.wait_for_selector(selector, state="attached", timeout=timeout_s * 1000)


class Generation:
    """A real request left running until ``stop``: ``agenerate`` as a task on an event loop
    of its own thread; cancelling the task aborts the engine request and frees its blocks."""

    def __init__(self, backend: LocalBackend, request: GenerationRequest) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

        async def start() -> asyncio.Task[Any]:
            return asyncio.ensure_future(backend.agenerate(request))

        self._task = asyncio.run_coroutine_threadsafe(start(), self._loop).result(timeout=10)

    def stop(self) -> None:
        async def cancel() -> None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task  # returns once the engine request is aborted

        try:
            asyncio.run_coroutine_threadsafe(cancel(), self._loop).result(timeout=30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
            self._loop.close()


def test_the_page_shows_what_metrics_shows_and_follows_requests(
    browser: Any, base_url: str, app: Any, backend: LocalBackend
) -> None:
    context = browser.new_context()
    page = context.new_page()
    requested: list[str] = []
    errors: list[str] = []
    context.on("request", lambda request: requested.append(request.url))
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        response = page.goto(base_url + "/")
        assert response is not None and response.status == 200
        assert "default-src 'none'" in response.headers["content-security-policy"]
        next_update(page, 0)
        assert page.text_content("#status") == "live"
        assert page.text_content("#model").startswith(backend.model)

        # Idle: every sample /metrics exposes is on the page, with its value.
        before = wait_until_page_shows_metrics(page, base_url)
        assert before[("vllm:num_requests_running", frozenset())] == 0

        # A request runs in a budget: the page shows it running and its blocks.
        events = app.state.kvgov.events  # the control plane records this; the test stands in
        backend.open_budget("agent-a", max_blocks=32)
        events.record("budget.opened", tenant="", budget="agent-a", max_blocks=32)
        request = GenerationRequest(
            prompt="agent a reads the logs " * 6, max_tokens=2000, budget="agent-a"
        )
        generation = Generation(backend, request)
        try:
            wait_for(page, '#requests tr[data-state="running"]')
            row = page.text_content('#requests tr[data-state="running"]')
            assert "agent-a" in row and "running" in row
            wait_for(page, '#blocks-bar [data-kind="budget"]')
            wait_for(page, '#events li[data-kind="budget.opened"]')
            assert "agent-a" in page.text_content('#events li[data-kind="budget.opened"]')
        finally:
            generation.stop()
        assert backend.metrics().num_requests_running == 0

        # Stopped: the page follows, and agrees with /metrics again.
        wait_for(page, "#requests tbody:empty")
        after = wait_until_page_shows_metrics(page, base_url)
        assert after[("vllm:num_requests_running", frozenset())] == 0
        assert after[("kvgov:budgets_open", frozenset())] == 1
        key = ("vllm:prefix_cache_queries_total", frozenset())
        assert after[key] > before[key]  # the request ran: its prompt was looked up
        assert not errors
    finally:
        context.close()
        backend.close_budget("agent-a")
    # Nothing from any other host: no CDN, no fonts, no browser chatter from the page.
    assert requested and all(url.startswith(base_url + "/") for url in requested), requested


def test_the_live_route_lists_running_requests_with_the_engine(
    base_url: str, backend: LocalBackend
) -> None:
    generation = Generation(backend, GenerationRequest(prompt="solo " * 20, max_tokens=2000))
    try:
        deadline = time.monotonic() + 15
        view = httpx.get(f"{base_url}/kvgov/v1/live", timeout=10).json()
        # Until the engine has scheduled it: a request just added is listed as waiting.
        while (
            not any(r["state"] == "running" for r in view["requests"])
            and time.monotonic() < deadline
        ):
            view = httpx.get(f"{base_url}/kvgov/v1/live", timeout=10).json()
        samples = {s["name"]: s["value"] for s in view["metrics"] if "budget" not in s["labels"]}
        running = [r for r in view["requests"] if r["state"] == "running"]
        assert len(running) == samples["vllm:num_requests_running"] == 1
        assert running[0]["num_prompt_tokens"] == backend.count_tokens("solo " * 20)
        device = view["memory"]["device"]
        assert sum(s["blocks"] for s in device) == view["memory"]["num_blocks"]
        in_use = sum(s["blocks"] for s in device if s["kind"] not in ("cached", "empty"))
        assert in_use == samples["kvgov:kv_blocks_in_use"]
    finally:
        generation.stop()


def test_with_api_keys_the_page_asks_for_one_and_keeps_it_out_of_urls(
    browser: Any, backend: LocalBackend
) -> None:
    key, other_key = "page-test-key-5c1d", "page-test-key-other-77e"
    app = create_app(backend, ServeSettings(api_keys=(key, other_key)))
    with serving(app) as url:
        for route in ("/kvgov/v1/live", "/metrics"):  # the figures need the key
            assert httpx.get(url + route, timeout=10).status_code == 401
        # Another tenant holds KV in a budget of its own: this key's page counts its
        # blocks as "other tenants" and never names them.
        other = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {other_key}"})
        assert other.post("/kvgov/v1/budgets", json={"name": "agent-b", "max_blocks": 8}).is_success
        body = {"prompt": "agent b's secret plan " * 8, "max_tokens": 4, "budget": "agent-b"}
        assert other.post("/v1/completions", json={**body, "retain": True}).is_success
        context = browser.new_context()
        page = context.new_page()
        requested: list[str] = []
        context.on("request", lambda request: requested.append(request.url))
        try:
            response = page.goto(url + "/")  # the shell has no figures: it loads without one
            assert response is not None and response.status == 200
            page.wait_for_selector("#key-form", state="visible", timeout=15_000)
            assert page.text_content("#status") == "API key needed"
            assert page.get_attribute("#updated", "data-updates") == "0"

            page.fill("#key", "not-the-key")
            page.click("#key-form button[type=submit]")
            page.wait_for_function(
                "() => document.getElementById('status').textContent == 'key refused'",
                timeout=15_000,
            )
            page.fill("#key", key)
            page.click("#key-form button[type=submit]")
            next_update(page, 0, timeout_s=15)
            assert page.is_hidden("#key-form")
            wait_until_page_shows_metrics(page, url, key=key)
            assert page.evaluate("() => sessionStorage.getItem('kvgov.apiKey')") == key
            held = backend.kv_snapshot().budgets[f"{tenant_id(other_key)}/agent-b"]
            others = page.text_content('#blocks-legend [data-segment="tenants"]')
            assert others == str(len(held.device_block_ids)) and held.device_block_ids
            assert "agent-b" not in page.content() and tenant_id(other_key) not in page.content()
        finally:
            context.close()
            assert other.post("/kvgov/v1/budgets/agent-b/release").status_code == 204
            assert other.delete("/kvgov/v1/budgets/agent-b").status_code == 204
            other.close()
    assert requested and all(key not in u and u.startswith(url + "/") for u in requested)
