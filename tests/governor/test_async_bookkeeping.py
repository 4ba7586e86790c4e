"""The governor's async paths call the backend's async bookkeeping (``aopen_budget``,
``aresize_budget``), never the blocking twins on a worker thread: a remote backend does
that I/O on its event loop's client, without a thread per call. ``LocalBackend`` and
``FakeBackend`` implement every async call of the protocol; a budget whose opening is
cancelled midway is still closed at release."""

from __future__ import annotations

import asyncio
import inspect
import threading

import pytest

from backends import LocalBackend
from governor import AgentSpec, Governor
from governor.backend import Backend
from governor.testing import FakeBackend
from policies import LLMSummarizer

AGENT = AgentSpec(name="agent", ceiling_tokens=800)
TASK = [{"role": "user", "content": "Say hello."}]
ASYNC_BOOKKEEPING = (
    "acapacity",
    "aopen_budget",
    "aresize_budget",
    "aclose_budget",
    "aretain",
    "arelease_retained",
    "aoffload",
    "arestore",
    "ametrics",
)


class _Recording(FakeBackend):
    """Records which bookkeeping calls ran, and on which thread."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.seen: list[tuple[str, bool]] = []  # (call, on the main thread)

    def _note(self, call: str) -> None:
        self.seen.append((call, threading.current_thread() is threading.main_thread()))

    def open_budget(self, name: str, *, max_blocks: int) -> None:
        self._note("open_budget")
        super().open_budget(name, max_blocks=max_blocks)

    def resize_budget(self, name: str, *, max_blocks: int) -> None:
        self._note("resize_budget")
        super().resize_budget(name, max_blocks=max_blocks)

    async def aopen_budget(self, name: str, *, max_blocks: int) -> None:
        self._note("aopen_budget")
        await super().aopen_budget(name, max_blocks=max_blocks)

    async def aresize_budget(self, name: str, *, max_blocks: int) -> None:
        self._note("aresize_budget")
        await super().aresize_budget(name, max_blocks=max_blocks)


@pytest.mark.parametrize("backend_class", [FakeBackend, LocalBackend])
def test_backends_implement_the_async_bookkeeping(backend_class: type) -> None:
    for name in ASYNC_BOOKKEEPING:
        assert hasattr(Backend, name)
        assert inspect.iscoroutinefunction(getattr(backend_class, name)), name


def test_acomplete_and_agrow_use_the_async_calls() -> None:
    backend = _Recording()
    governor = Governor(backend, agents=[AGENT])

    async def main() -> None:
        async with governor.lease("agent") as lease:
            await governor.acomplete(lease, TASK, max_tokens=2)
            await governor.agrow(lease, 160)
            await governor.acomplete(lease, TASK, max_tokens=2)

    asyncio.run(main())
    calls = [call for call, _ in backend.seen]
    # The async call came from the event loop (main thread); its blocking twin, which
    # it runs on a worker thread in this backend, came after it.
    assert calls == ["aopen_budget", "open_budget", "aresize_budget", "resize_budget"]
    assert [main for _, main in backend.seen] == [True, False, True, False]
    assert backend.metrics().num_blocks_in_use == 0


def test_a_cancelled_budget_opening_is_closed_at_release() -> None:
    class SlowOpen(FakeBackend):
        def __init__(self) -> None:
            super().__init__()
            self.opened: list[str] = []
            self.closed: list[str] = []

        async def aopen_budget(self, name: str, *, max_blocks: int) -> None:
            await asyncio.sleep(0.05)
            await super().aopen_budget(name, max_blocks=max_blocks)
            self.opened.append(name)

        def close_budget(self, name: str) -> None:
            super().close_budget(name)
            self.closed.append(name)

        async def aclose_budget(self, name: str) -> None:
            await super().aclose_budget(name)

    backend = SlowOpen()
    governor = Governor(backend, agents=[AGENT])

    async def main() -> None:
        async with governor.lease("agent") as lease:
            call = asyncio.create_task(governor.acomplete(lease, TASK, max_tokens=2))
            await asyncio.sleep(0.01)  # the budget is opening
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
        deadline = asyncio.get_running_loop().time() + 5
        while not backend.closed:  # the shielded opening ends, sees the release, closes
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)

    asyncio.run(main())
    assert len(backend.opened) == 1 and backend.closed == backend.opened


def test_the_llm_summarizer_opens_and_closes_its_budget_with_the_async_calls() -> None:
    backend = _Recording(responder=lambda request: "a summary")
    summarizer = LLMSummarizer(backend, max_input_tokens=20_000)
    result = asyncio.run(summarizer.areduce("line\n" * 400, budget_tokens=60))
    assert result.method == "llm"
    assert [call for call, _ in backend.seen][:2] == ["aopen_budget", "open_budget"]
