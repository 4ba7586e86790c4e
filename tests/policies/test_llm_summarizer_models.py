"""LLMSummarizer with real models: the bundled engine on the tiny-random preset, and
LangChain's own chat-model machinery.

No real chat model runs offline, so the LangChain tests use ``GenericFakeChatModel``
(LangChain's scripted fake: the real ``BaseChatModel`` invoke/ainvoke path with canned
replies) and two small duck-typed fakes for models that hang.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage

from backends import LocalBackend
from governor import ToolOutputReduction
from policies.llm_summarizer import LLMSummarizer
from tests.policies.llm_summarizer_helpers import (
    ARGUMENTS,
    COUNTER,
    FALLBACK,
    LOG,
    SUMMARY,
    _assert_nothing_held,
    _fallback_text,
    _reduce,
)


# -- the bundled engine (tiny-random: random weights, meaningless but deterministic text) --
@pytest.fixture(scope="module")
def engine() -> Iterator[LocalBackend]:
    with LocalBackend(config={"num_blocks": 256}) as backend:
        yield backend


def test_the_bundled_engine_summarizes_within_budget(engine: LocalBackend) -> None:
    # tiny-random's tokenizer is cl100k, the counter's: its greedy 40-token answer (cut at
    # max_tokens, meaningless text) counts 40 tokens here too, so the model's answer is used.
    summarizer = LLMSummarizer(engine, counter=COUNTER, timeout_s=30)
    result = summarizer.reduce(LOG, budget_tokens=40, tool_name="pytest", arguments=ARGUMENTS)
    assert result.method == "llm"
    assert result.text and result.tokens_after == COUNTER.count(result.text) <= 40
    assert result.tokens_before == COUNTER.count(LOG)
    assert result.detail.startswith("input cut extractively to ")  # 8x the budget at most
    again = summarizer.reduce(LOG, budget_tokens=40, tool_name="pytest", arguments=ARGUMENTS)
    assert again.text == result.text  # deterministic: greedy decoding, seeded weights
    _assert_nothing_held(engine)


def test_the_bundled_engine_is_aborted_on_timeout(engine: LocalBackend) -> None:
    summarizer = LLMSummarizer(engine, counter=COUNTER, timeout_s=0.01)
    result = summarizer.reduce(LOG, budget_tokens=200)
    assert (result.method, result.detail) == (FALLBACK, "llm timed out after 0.01 s")
    assert result.tokens_after <= 200
    _assert_nothing_held(engine)  # the abort was queued before this call


# -- a LangChain chat model -------------------------------------------------------------
def test_a_langchain_chat_model_summarizes() -> None:
    model = GenericFakeChatModel(messages=iter([SUMMARY, AIMessage(content=[SUMMARY])]))
    summarizer = LLMSummarizer(model, max_input_tokens=20_000)
    result = _reduce(summarizer)
    assert (result.text, result.method, result.detail) == (SUMMARY, "llm", "")
    assert _reduce(summarizer).text == SUMMARY  # content as a list of parts


def test_a_langchain_chat_model_falls_back() -> None:
    model = GenericFakeChatModel(messages=iter(["word " * 100, ""]))
    summarizer = LLMSummarizer(model)
    result = _reduce(summarizer)
    assert (result.method, result.detail) == (
        FALLBACK,
        "llm answer over budget (100 > 60 tokens)",
    )
    assert result.text == _fallback_text(60)
    assert _reduce(summarizer).detail == "llm answer empty"
    exhausted = _reduce(summarizer)  # the fake's script has run out: it raises
    assert exhausted.method == FALLBACK
    assert exhausted.detail.startswith("llm error: ")


def test_a_langchain_chat_model_in_areduce() -> None:
    model = GenericFakeChatModel(messages=iter([SUMMARY]))

    async def main() -> ToolOutputReduction:
        return await LLMSummarizer(model).areduce(LOG, budget_tokens=60)

    assert asyncio.run(main()).text == SUMMARY


class _HangingAsyncModel:
    """A chat model whose ``ainvoke`` never answers; records that it was cancelled."""

    def __init__(self) -> None:
        self.cancelled = False

    async def ainvoke(self, messages: list[dict[str, str]]) -> AIMessage:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        raise AssertionError("unreachable")


class _BlockingSyncModel:
    """A sync-only chat model whose ``invoke`` blocks until released."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def invoke(self, messages: list[dict[str, str]]) -> AIMessage:
        self.release.wait(10)
        return AIMessage(content=SUMMARY)


def test_a_hanging_chat_model_is_cancelled_on_timeout() -> None:
    model = _HangingAsyncModel()
    result = _reduce(LLMSummarizer(model, timeout_s=0.1))
    assert (result.method, result.detail) == (FALLBACK, "llm timed out after 0.1 s")
    assert model.cancelled


def test_a_blocking_sync_chat_model_does_not_hold_up_reduce() -> None:
    model = _BlockingSyncModel()
    started = time.perf_counter()
    try:
        result = _reduce(LLMSummarizer(model, timeout_s=0.1))
    finally:
        model.release.set()
    assert time.perf_counter() - started < 2
    assert (result.method, result.detail) == (FALLBACK, "llm timed out after 0.1 s")
