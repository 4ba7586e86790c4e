"""LLMSummarizer with FakeBackend's block accounting: construction and the protocol, the
model's summary and the request that asks for it, fallbacks to the extractive summary on
empty, oversized or failed answers and on timeouts, sync and async calls from loops and
threads, keeping the prompt to what the model can take, and a custom fallback.

Its engine budgets and how fallbacks are counted and bugs propagate are in
``test_llm_summarizer_budgets.py``; the bundled engine and LangChain chat models in
``test_llm_summarizer_models.py``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel

from governor import (
    ConfigError,
    GenerationRequest,
    TokenCounter,
    ToolOutputPolicy,
    ToolOutputReduction,
)
from governor.testing import FakeBackend
from policies.extractive_summarizer import ExtractiveSummarizer
from policies.llm_summarizer import DEFAULT_PROMPT, LLMSummarizer
from tests.policies.llm_summarizer_helpers import (
    ARGUMENTS,
    COUNTER,
    FALLBACK,
    LOG,
    SUMMARY,
    _assert_nothing_held,
    _fallback_text,
    _reduce,
    pytest_log,
)


class _Characters:
    """A tokenizer that makes every character a token: a counter that disagrees with the
    model's own tokenizer, as a governor counting for another model would."""

    name = "characters"

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]


CHARACTERS = TokenCounter(tokenizer=_Characters())


def fake(**kwargs: Any) -> FakeBackend:
    """A FakeBackend whose pool (16,384 tokens) holds the whole log in one prompt."""
    return FakeBackend(**{"num_blocks": 1_024, **kwargs})


# -- construction and the protocol -----------------------------------------------------
def test_satisfies_the_protocol() -> None:
    assert isinstance(LLMSummarizer(FakeBackend()), ToolOutputPolicy)
    assert isinstance(LLMSummarizer(GenericFakeChatModel(messages=iter([]))), ToolOutputPolicy)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"model": object()}, "model must be a governor Backend"),
        ({"timeout_s": 0}, "timeout_s must be a number of seconds > 0"),
        ({"timeout_s": float("inf")}, "timeout_s"),
        ({"timeout_s": True}, "timeout_s"),
        ({"prompt": " "}, "prompt must be a non-empty"),
        ({"prompt": "Summarize {tool}"}, r"only field is \{budget_tokens\}"),
        ({"fallback": object()}, "fallback must be a ToolOutputPolicy"),
        ({"max_input_tokens": 0}, "max_input_tokens must be a whole number of at least 1"),
        ({"counter": "cl100k"}, "counter must be a governor.TokenCounter"),
    ],
)
def test_bad_settings_fail_at_construction(kwargs: dict[str, Any], match: str) -> None:
    settings = {"model": FakeBackend(), **kwargs}
    with pytest.raises(ConfigError, match=match):
        LLMSummarizer(**settings)


@pytest.mark.parametrize("budget", [0, -3, True, 2.5])
def test_a_bad_budget_is_a_config_error(budget: object) -> None:
    summarizer = LLMSummarizer(FakeBackend())
    with pytest.raises(ConfigError, match="budget_tokens"):
        summarizer.reduce("text", budget_tokens=budget)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="budget_tokens"):
        asyncio.run(summarizer.areduce("text", budget_tokens=budget))  # type: ignore[arg-type]


def test_text_within_budget_is_returned_unchanged_without_a_model_call() -> None:
    backend = FakeBackend(responder=lambda request: SUMMARY)
    text = "total 3\nREADME.md\nsetup.py"
    result = LLMSummarizer(backend).reduce(text, budget_tokens=COUNTER.count(text))
    assert (result.text, result.method, result.detail, result.elided) == (text, "none", "", ())
    assert result.tokens_before == result.tokens_after == COUNTER.count(text)
    assert backend.calls == []


# -- a governor Backend (FakeBackend) ------------------------------------------------------
def test_the_models_summary_is_used_when_it_fits() -> None:
    backend = fake(responder=lambda request: f"  {SUMMARY}\n")
    summarizer = LLMSummarizer(backend, max_input_tokens=20_000)
    result = _reduce(summarizer)
    assert (result.text, result.method, result.detail, result.elided) == (SUMMARY, "llm", "", ())
    assert (result.tokens_before, result.tokens_after) == (
        COUNTER.count(LOG),
        COUNTER.count(SUMMARY),
    )
    assert result.tokens_saved == result.tokens_before - result.tokens_after
    assert 0 < result.elapsed_s < 5
    assert replace(_reduce(summarizer), elapsed_s=0.0) == replace(result, elapsed_s=0.0)
    _assert_nothing_held(backend)


def test_the_request_carries_the_prompt_tool_arguments_and_budget() -> None:
    backend = fake(responder=lambda request: SUMMARY)
    _reduce(LLMSummarizer(backend, max_input_tokens=20_000), budget=60)
    (request,) = backend.calls
    assert (request.max_tokens, request.temperature) == (60, 0.0)
    assert request.messages is not None
    system, user = request.messages
    assert system == {"role": "system", "content": DEFAULT_PROMPT.format(budget_tokens=60)}
    assert "at most 60 tokens" in system["content"]
    assert user["role"] == "user"
    assert user["content"] == (
        f'Tool: pytest\nArguments: {{"path": "src/config.py", "verbose": true}}\nOutput:\n{LOG}'
    )


def test_a_custom_prompt_is_formatted_with_the_budget() -> None:
    backend = FakeBackend(responder=lambda request: SUMMARY)
    prompt = "Summarize in {budget_tokens} tokens; JSON like {{}} stays literal."
    LLMSummarizer(backend, prompt=prompt).reduce(LOG, budget_tokens=80)
    (request,) = backend.calls
    assert request.messages is not None
    assert request.messages[0]["content"] == "Summarize in 80 tokens; JSON like {} stays literal."
    assert request.messages[1]["content"].startswith("Output")  # no tool name, no arguments


def test_an_empty_answer_falls_back_to_extractive() -> None:
    backend = FakeBackend(responder=lambda request: " \n\t ")
    result = _reduce(LLMSummarizer(backend))
    assert (result.method, result.detail) == (FALLBACK, "llm answer empty")
    assert result.text == _fallback_text(60)
    assert result.tokens_after == COUNTER.count(result.text) <= 60
    assert result.tokens_before == COUNTER.count(LOG)
    assert result.elided  # the fallback's record is kept
    _assert_nothing_held(backend)


def test_an_answer_over_budget_by_the_counter_falls_back() -> None:
    # The backend stops at max_tokens of its own tokens (cl100k: 200 tokens of " hello"),
    # which the summarizer's counter, one token a character, counts as 1,199.
    backend = fake(responder=lambda request: " hello" * 500)
    summarizer = LLMSummarizer(backend, counter=CHARACTERS, max_input_tokens=20_000)
    result = summarizer.reduce(LOG, budget_tokens=200, tool_name="pytest", arguments=ARGUMENTS)
    assert result.method == FALLBACK
    assert result.detail == "llm answer over budget (1,199 > 200 tokens)"
    assert backend.calls[0].max_tokens == 200
    expected = ExtractiveSummarizer(CHARACTERS).reduce(
        LOG, budget_tokens=200, tool_name="pytest", arguments=ARGUMENTS
    )
    assert result.text == expected.text
    assert result.tokens_after == len(result.text) <= 200
    assert result.tokens_before == len(LOG)
    _assert_nothing_held(backend)


def test_a_model_error_falls_back_to_extractive() -> None:
    def broken(request: GenerationRequest) -> str:
        raise RuntimeError("model server down")

    backend = FakeBackend(responder=broken)
    result = _reduce(LLMSummarizer(backend))
    assert (result.method, result.detail) == (
        FALLBACK,
        "llm error: RuntimeError: model server down",
    )
    assert result.text == _fallback_text(60)
    _assert_nothing_held(backend)


def test_a_closed_backend_falls_back_to_extractive() -> None:
    backend = FakeBackend(responder=lambda request: SUMMARY)
    backend.close()
    result = _reduce(LLMSummarizer(backend))
    assert result.method == FALLBACK
    assert result.detail.startswith("llm error: BackendError: ")
    assert "closed" in result.detail


def test_a_timeout_stops_the_call_and_returns_its_blocks() -> None:
    backend = FakeBackend(latency_s=0.05)  # 60 filler tokens would take 3 s
    summarizer = LLMSummarizer(backend, timeout_s=0.2)
    started = time.perf_counter()
    result = _reduce(summarizer)
    assert time.perf_counter() - started < 2
    assert (result.method, result.detail) == (FALLBACK, "llm timed out after 0.2 s")
    assert result.text == _fallback_text(60)
    assert 0.2 <= result.elapsed_s < 2
    _assert_nothing_held(backend)
    assert backend.peak_blocks_in_use > 0  # the call did hold blocks while it ran


def test_areduce_times_out_and_leaks_nothing() -> None:
    backend = FakeBackend(latency_s=0.05)
    summarizer = LLMSummarizer(backend, timeout_s=0.2)

    async def main() -> ToolOutputReduction:
        return await summarizer.areduce(LOG, budget_tokens=60, arguments=ARGUMENTS)

    result = asyncio.run(main())
    assert (result.method, result.detail) == (FALLBACK, "llm timed out after 0.2 s")
    _assert_nothing_held(backend)


def test_areduce_runs_concurrent_summaries_on_the_callers_loop() -> None:
    backend = FakeBackend(responder=lambda request: f"summary of {request.max_tokens}")

    async def main() -> list[ToolOutputReduction]:
        summarizer = LLMSummarizer(backend)
        return await asyncio.gather(
            *(summarizer.areduce(LOG, budget_tokens=budget) for budget in (50, 60, 70))
        )

    results = asyncio.run(main())
    assert [(r.text, r.method) for r in results] == [
        ("summary of 50", "llm"),
        ("summary of 60", "llm"),
        ("summary of 70", "llm"),
    ]
    _assert_nothing_held(backend)


def test_sync_reduce_works_inside_a_running_event_loop() -> None:
    backend = FakeBackend(responder=lambda request: SUMMARY)
    slow = FakeBackend(latency_s=0.05)

    async def main() -> tuple[ToolOutputReduction, ToolOutputReduction, str]:
        loop_thread = threading.current_thread().name
        done = _reduce(LLMSummarizer(backend))
        timed_out = _reduce(LLMSummarizer(slow, timeout_s=0.1))
        return done, timed_out, loop_thread

    done, timed_out, loop_thread = asyncio.run(main())
    assert (done.text, done.method) == (SUMMARY, "llm")
    assert (timed_out.method, timed_out.detail) == (FALLBACK, "llm timed out after 0.1 s")
    assert loop_thread == threading.current_thread().name
    _assert_nothing_held(slow)


def test_reduce_works_from_plain_threads_at_once() -> None:
    backend = FakeBackend(responder=lambda request: f"summary of {request.max_tokens}")
    summarizer = LLMSummarizer(backend)
    results: dict[int, ToolOutputReduction] = {}

    def work(budget: int) -> None:
        results[budget] = summarizer.reduce(LOG, budget_tokens=budget)

    threads = [threading.Thread(target=work, args=(budget,)) for budget in range(40, 48)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {budget: r.text for budget, r in results.items()} == {
        budget: f"summary of {budget}" for budget in range(40, 48)
    }


# -- keeping the prompt to what the model can take -------------------------------------
def test_long_input_is_cut_extractively_before_the_model_sees_it() -> None:
    backend = FakeBackend(responder=lambda request: SUMMARY)
    log = pytest_log(4_000)
    result = LLMSummarizer(backend).reduce(log, budget_tokens=50, arguments=ARGUMENTS)
    assert (result.text, result.method) == (SUMMARY, "llm")
    (request,) = backend.calls
    assert request.messages is not None
    user = request.messages[1]["content"]
    header = 'Arguments: {"path": "src/config.py", "verbose": true}\nOutput (shortened first; '
    assert user.startswith(header)
    shown = user.split(":\n", 1)[1]
    assert COUNTER.count(shown) <= 8 * 50
    assert "ValueError: missing key: port" in shown
    assert result.detail == f"input cut extractively to {COUNTER.count(shown):,} tokens first"
    assert result.elided == (("passing tests", 4_000),)


@pytest.mark.parametrize("limit", [{"max_model_len": 400}, {"num_blocks": 25}])
def test_the_prompt_is_cut_to_fit_what_the_backend_can_hold(limit: dict[str, int]) -> None:
    backend = FakeBackend(responder=lambda request: SUMMARY, **limit)  # 400 tokens either way
    log = "\n".join(f"{i}: {'lorem ipsum ' * (i % 7 + 1)}" for i in range(300))
    result = LLMSummarizer(backend, max_input_tokens=10_000).reduce(log, budget_tokens=100)
    assert (result.text, result.method) == (SUMMARY, "llm")
    (request,) = backend.calls
    assert request.messages is not None
    assert backend.count_messages(request.messages) + 100 <= 400
    assert result.detail.startswith("input cut extractively to ")


def test_an_answer_that_cannot_fit_the_context_falls_back() -> None:
    backend = FakeBackend(responder=lambda request: SUMMARY, max_model_len=64)
    result = LLMSummarizer(backend).reduce(LOG, budget_tokens=80)
    assert result.method == FALLBACK
    assert result.detail == (
        "llm prompt and a 80-token answer do not fit the 64 tokens the backend can hold"
    )
    assert backend.calls == []


def test_long_arguments_are_cut() -> None:
    backend = FakeBackend(responder=lambda request: SUMMARY)
    arguments = {"content": "word " * 2_000}
    LLMSummarizer(backend).reduce(LOG, budget_tokens=60, arguments=arguments)
    (request,) = backend.calls
    assert request.messages is not None
    line = request.messages[1]["content"].split("\n", 1)[0]
    assert line.startswith('Arguments: {"content": "word word')
    assert line.endswith(" [... cut ...]")
    assert COUNTER.count(line) < 300


# -- the fallback ---------------------------------------------------------------------
class _Recording:
    """A fallback policy that records its calls and returns ``reply`` unchecked."""

    def __init__(self, reply: str) -> None:
        self.reply = reply
        self.calls: list[tuple[str, int, str | None, Mapping[str, Any] | None]] = []

    def reduce(
        self,
        text: str,
        *,
        budget_tokens: int,
        tool_name: str | None = None,
        arguments: Mapping[str, Any] | None = None,
    ) -> ToolOutputReduction:
        self.calls.append((text, budget_tokens, tool_name, arguments))
        return ToolOutputReduction(self.reply, 0, 0, "custom", 0.0, (("lines", 3),))


def test_a_custom_fallback_gets_the_original_text_and_call() -> None:
    fallback = _Recording("the tail")
    backend = FakeBackend(responder=lambda request: "\n")
    result = _reduce(LLMSummarizer(backend, fallback=fallback))
    assert fallback.calls == [(LOG, 60, "pytest", ARGUMENTS)]
    assert (result.text, result.method, result.elided) == ("the tail", "custom", (("lines", 3),))
    assert (result.tokens_before, result.tokens_after) == (COUNTER.count(LOG), 2)
    assert result.detail == "llm answer empty"


def test_a_fallback_over_budget_is_truncated() -> None:
    fallback = _Recording(LOG)  # a policy that counts with another tokenizer, say
    backend = FakeBackend(responder=lambda request: "\n")
    result = _reduce(LLMSummarizer(backend, fallback=fallback))
    assert result.method == "truncate"
    assert result.tokens_after == COUNTER.count(result.text) <= 60
    assert LOG.startswith(result.text)
    assert result.detail == "llm answer empty; fallback answer over budget, truncated (custom)"
