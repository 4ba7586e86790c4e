"""LLMSummarizer inside an engine budget: each summary runs in a budget sized to it and
closed after, one too small is refused by the engine and falls back, and slow engine
bookkeeping leaves the caller's event loop free. Fallbacks are counted, logged and carried
on the governor's event; bugs and refused credentials propagate instead of falling back,
and a server error falls back. The backend is ``FakeBackend``, recording its budgets."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

import pytest
from langchain_core.messages import AIMessage

from governor import (
    AgentSpec,
    GenerationRequest,
    Governor,
    GovernorEvent,
    Policies,
    ToolOutputReduction,
)
from governor.testing import FakeBackend
from policies.llm_summarizer import LLMSummarizer, SummarizerStats
from tests.loop_ticker import loop_ticker
from tests.policies.llm_summarizer_helpers import (
    FALLBACK,
    LOG,
    SUMMARY,
    _assert_nothing_held,
    _reduce,
)


class _Budgets(FakeBackend):
    """A FakeBackend that records the budgets opened and closed, and can be slow at
    bookkeeping (``slow_s``), as an engine is while it runs a step."""

    def __init__(self, *, slow_s: float = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.slow_s = slow_s
        self.opened: list[tuple[str, int]] = []
        self.closed: list[str] = []

    def capacity(self) -> Any:
        time.sleep(self.slow_s)
        return super().capacity()

    def open_budget(self, name: str, *, max_blocks: int) -> None:
        time.sleep(self.slow_s)
        super().open_budget(name, max_blocks=max_blocks)
        self.opened.append((name, max_blocks))

    def close_budget(self, name: str) -> None:
        time.sleep(self.slow_s)
        super().close_budget(name)
        self.closed.append(name)


def test_a_summary_runs_in_an_engine_budget_sized_to_it_and_closed_after() -> None:
    backend = _Budgets(num_blocks=1_024, responder=lambda request: SUMMARY)
    result = _reduce(LLMSummarizer(backend, max_input_tokens=20_000), budget=60)
    assert result.method == "llm"
    (request,) = backend.calls
    assert request.messages is not None
    blocks = math.ceil((backend.count_messages(request.messages) + 60) / 16)
    assert backend.opened == [(request.budget, blocks)]
    assert backend.closed == [request.budget]
    # The budget is what the engine holds the call to: one too small refuses it.
    assert backend.peak_blocks_in_use <= blocks


def test_a_summary_over_its_budget_is_refused_by_the_engine_and_falls_back() -> None:
    class Undersized(_Budgets):
        def open_budget(self, name: str, *, max_blocks: int) -> None:
            super().open_budget(name, max_blocks=1)  # the engine enforces what it is given

    backend = Undersized(num_blocks=1_024, responder=lambda request: SUMMARY)
    result = _reduce(LLMSummarizer(backend, max_input_tokens=20_000))
    assert result.method == FALLBACK and result.detail.startswith("llm error: ")
    assert [name for name, _ in backend.opened] == backend.closed
    _assert_nothing_held(backend)


def test_fallbacks_are_counted_logged_and_carried_on_the_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(request: GenerationRequest) -> str:
        raise ConnectionError("model server down")

    summarizer = LLMSummarizer(FakeBackend(responder=broken))
    governor = Governor(
        FakeBackend(),
        agents=[AgentSpec(name="coder", ceiling_tokens=2_000, tool_output_tokens=60)],
        policies=Policies(tool_output=summarizer),
    )
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)
    with (
        caplog.at_level(logging.WARNING, logger="policies.llm_summarizer"),
        governor.lease("coder") as lease,
    ):
        result = governor.reduce_tool_output(lease, LOG, tool="pytest")
    detail = "llm error: ConnectionError: model server down"
    assert (result.method, result.detail) == (FALLBACK, detail)
    (event,) = [e for e in events if e.kind == "summarized"]
    assert event.record == result  # the reason travels with the governor's event
    assert [r.getMessage() for r in caplog.records] == [
        f"LLMSummarizer: the fallback reduces pytest's output: {detail}"
    ]
    assert summarizer.stats() == SummarizerStats(1, 0, 1, {"error": 1})
    _reduce(LLMSummarizer(FakeBackend(responder=lambda request: SUMMARY)))  # another's count
    blank = FakeBackend(responder=lambda request: " ")
    counted = LLMSummarizer(blank, max_input_tokens=20_000)
    for _ in range(2):
        _reduce(counted)
    assert counted.stats() == SummarizerStats(2, 0, 2, {"empty": 2})


class AuthenticationError(Exception):
    """Named as the OpenAI and Anthropic clients name theirs."""


class _Status(Exception):
    def __init__(self, status_code: int) -> None:
        super().__init__(f"HTTP {status_code}")
        self.status_code = status_code


@pytest.mark.parametrize(
    "error",
    [
        TypeError("unsupported operand"),
        AttributeError("'NoneType' object has no attribute 'text'"),
        KeyError("choices"),
        AuthenticationError("invalid api key"),
        _Status(401),
        _Status(403),
    ],
    ids=repr,
)
def test_bugs_and_refused_credentials_propagate(error: Exception) -> None:
    def failing(request: GenerationRequest) -> str:
        raise error

    backend = _Budgets(responder=failing)
    with pytest.raises(type(error)) as caught:
        _reduce(LLMSummarizer(backend))
    assert caught.value is error
    assert backend.closed == [name for name, _ in backend.opened]  # the budget still closed
    _assert_nothing_held(backend)

    class Model:
        async def ainvoke(self, messages: list[dict[str, str]]) -> AIMessage:
            raise error

    with pytest.raises(type(error)):
        _reduce(LLMSummarizer(Model()))


def test_a_server_error_status_falls_back() -> None:
    def failing(request: GenerationRequest) -> str:
        raise _Status(503)

    result = _reduce(LLMSummarizer(FakeBackend(responder=failing)))
    assert (result.method, result.detail) == (FALLBACK, "llm error: _Status: HTTP 503")


def test_areduce_leaves_the_event_loop_free_while_the_engine_is_busy() -> None:
    """Sizing the prompt, opening and closing the budget each wait 0.2 s here, as a
    bookkeeping call waits for an engine step: none of it may stall the caller's loop."""
    backend = _Budgets(slow_s=0.2, num_blocks=1_024, responder=lambda request: SUMMARY)
    summarizer = LLMSummarizer(backend, max_input_tokens=20_000)

    async def main() -> tuple[ToolOutputReduction, float]:
        async with loop_ticker() as gaps:  # another coroutine on the same loop
            result = await summarizer.areduce(LOG, budget_tokens=60)
        return result, max(gaps)

    result, longest = asyncio.run(main())
    assert result.method == "llm" and len(backend.opened) == len(backend.closed) == 1
    assert longest < 0.15  # each bookkeeping call alone takes 0.2 s
