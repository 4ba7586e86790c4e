"""``python -m kvgov.serve.screenshot [PATH]``: the live page's picture for the README.

Starts the server around the tiny model on a free loopback port, plays a small swarm on
it (a pinned system prompt, a planner whose context is held for its next turn, a worker
whose held context is offloaded to host memory, two workers generating), and takes a
screenshot of ``GET /`` with Debian's Chromium driven by Playwright. The scene runs on
the server's own backend and records the events the server's routes record for the same
calls. Needs ``playwright`` (the dev extra) and ``/usr/bin/chromium``.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

from backends.local.backend import LocalBackend
from governor.backend import GenerationRequest, GenerationResult
from kvgov.serve.app import create_app
from kvgov.serve.background import serving
from kvgov.serve.events import EventLog

__all__ = ["main"]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SYSTEM = (
    "You are a worker in a coding swarm. Read the task, inspect the files you are given, "
    "run the tests and report what you changed in three lines. "
)


def _turn(backend: LocalBackend, events: EventLog, budget: str, task: str) -> GenerationResult:
    request = GenerationRequest(prompt=SYSTEM + task, max_tokens=24, budget=budget)
    events.record("request.started", id=f"{budget}-1", tenant="", budget=budget)
    result = backend.generate(request)
    events.record(
        "request.finished",
        id=f"{budget}-1",
        tenant="",
        budget=budget,
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        finish_reason=result.finish_reason,
    )
    return result


class _Running:
    """Long generations kept running on an event loop of their own until ``stop``."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._tasks: list[asyncio.Task[Any]] = []

    def start(self, backend: LocalBackend, request: GenerationRequest) -> None:
        async def start() -> asyncio.Task[Any]:
            return asyncio.ensure_future(backend.agenerate(request))

        future = asyncio.run_coroutine_threadsafe(start(), self._loop)
        self._tasks.append(future.result(timeout=10))

    def stop(self) -> None:
        async def cancel() -> None:
            for task in self._tasks:
                task.cancel()
            for task in self._tasks:
                with suppress(asyncio.CancelledError):
                    await task

        try:
            asyncio.run_coroutine_threadsafe(cancel(), self._loop).result(timeout=30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
            self._loop.close()


def _scene(backend: LocalBackend, events: EventLog, running: _Running) -> None:
    handle = backend.pin_prefix(SYSTEM)
    events.record(
        "prefix.pinned", tenant="", key=handle.key, num_pinned_tokens=handle.num_pinned_tokens
    )
    for name, max_blocks in (("planner", 12), ("worker-1", 24), ("worker-2", 24), ("worker-3", 8)):
        backend.open_budget(name, max_blocks=max_blocks)
        events.record("budget.opened", tenant="", budget=name, max_blocks=max_blocks)
    _turn(backend, events, "planner", "Plan the refactor of the scheduler into three tasks.")
    held = backend.retain(budget="planner")
    events.record("kv.retained", tenant="", budget="planner", tokens=held)
    _turn(backend, events, "worker-3", "Task 3: update the docs for the new scheduler.")
    held = backend.retain(budget="worker-3")
    events.record("kv.retained", tenant="", budget="worker-3", tokens=held)
    backend.offload(budget="worker-3")
    events.record("kv.offloaded", tenant="", budget="worker-3")
    for i, task in ((1, "Task 1: split schedule() in two."), (2, "Task 2: add the tests.")):
        budget = f"worker-{i}"
        request = GenerationRequest(prompt=SYSTEM + task, max_tokens=2000, budget=budget)
        events.record("request.started", id=f"{budget}-1", tenant="", budget=budget)
        running.start(backend, request)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until both have grown past their prompts' blocks
        budgets = backend.kv_snapshot().budgets
        if all(len(budgets[f"worker-{i}"].device_block_ids) >= 5 for i in (1, 2)):
            return
        time.sleep(0.05)
    raise RuntimeError("the two workers did not reach 5 blocks each in 60 s")


def take(path: Path) -> Path:
    from playwright.sync_api import sync_playwright  # the dev extra: only for this script

    backend = LocalBackend(config={"num_blocks": 48, "swap_space_bytes": 16 * 32768})
    app = create_app(backend)
    running = _Running()
    try:
        with serving(app) as base_url, sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
            )
            page = browser.new_page(viewport={"width": 1200, "height": 1150})
            page.goto(base_url + "/")
            _scene(backend, app.state.kvgov.events, running)
            # Two polls after the workers grew, with both still running on the page.
            page.wait_for_function(
                "() => document.querySelectorAll('#requests tr[data-state=running]').length == 2",
                timeout=20_000,
            )
            seen = int(page.get_attribute("#updated", "data-updates") or 0)
            page.wait_for_function(
                "seen => Number(document.getElementById('updated').dataset.updates) > seen",
                arg=seen,
                timeout=20_000,
            )
            path.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(path))
            browser.close()
            running.stop()
    finally:
        backend.close()
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", default="docs/serve-page.png", type=Path)
    args = parser.parse_args(argv)
    print(f"wrote {take(args.path)}")


if __name__ == "__main__":
    main()
