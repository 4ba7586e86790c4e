"""Model-backed reduction of a tool output to a token budget, with an extractive fallback.

``LLMSummarizer`` asks a governor ``Backend`` or a LangChain chat model (duck-typed, so
policies/ never imports LangChain) to summarize a tool result over its budget. The result
never exceeds the budget: an empty, over-budget, failed or late answer goes to the
fallback, counted by reason in ``stats()``. Failures no fallback should hide (refused
credentials, ``ConfigError``, programming errors) propagate, and ``areduce`` never waits on
the engine on its event loop. The prompt, the engine budget of its own, the sizing and the
timeout: docs/design/summarizers.md.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from governor import (
    Backend,
    BackendError,
    ConfigError,
    GenerationRequest,
    TokenCounter,
    ToolOutputPolicy,
    ToolOutputReduction,
    reduce_output,
)
from policies._conversation import check_setting
from policies._model_replies import content_text, describe, unless_a_bug
from policies.extractive_summarizer import ExtractiveSummarizer

__all__ = ["DEFAULT_PROMPT", "LLMSummarizer", "SummarizerStats"]

_log = logging.getLogger(__name__)

DEFAULT_PROMPT = (
    "You condense the output of a tool call for an AI agent, which will read your summary "
    "instead of the output. Keep, exactly as written: every error, warning and failure "
    "message; numbers, counts and versions; and the identifiers (paths, names, ids) that "
    "the call's arguments mention. Leave out repetition and boilerplate. Reply with the "
    "summary only, in at most {budget_tokens} tokens."
)

_INPUT_FACTOR = 8  # default max_input_tokens, as a multiple of the budget
_ARGUMENT_TOKENS = 256  # arguments shown to the model, at most
_FIT_TRIES = 4  # rounds of cutting the output until the prompt fits the backend
_FIT_MARGIN = 16  # tokens, for the two tokenizers disagreeing on where cuts fall
_SHORTENED = " (shortened first; [... ...] marks what was cut)"
_CLOSE_TRIES_S = 2.0  # how long closing a summary's budget waits for its aborted call
_budget_ids = itertools.count()


@dataclass(frozen=True, slots=True)
class SummarizerStats:
    """What an ``LLMSummarizer`` did so far: reductions asked of the model, answered by it,
    and handed to the fallback, by reason (``"timeout"``, ``"error"``, ``"aborted"``,
    ``"empty"``, ``"over_budget"``, ``"no_room"``)."""

    num_model_calls: int = 0
    num_llm: int = 0
    num_fallbacks: int = 0
    fallbacks: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Prompt:
    """The chat messages to send, or why there are none (``detail``)."""

    messages: list[dict[str, str]] | None
    max_tokens: int
    pre: ToolOutputReduction | None  # the extractive cut made first, if any
    detail: str = ""
    reason: str = ""  # SummarizerStats' name for why there are none
    max_blocks: int = 0  # the engine budget a backend call is given (prompt and answer)

    @classmethod
    def failed(cls, reason: str, detail: str) -> _Prompt:
        return cls(None, 0, None, detail, reason)


@dataclass(frozen=True, slots=True)
class _Reply:
    """The model's answer, or None and why there is none."""

    text: str | None
    detail: str = ""
    reason: str = ""  # SummarizerStats' name for why there is none


class LLMSummarizer:
    """A ``ToolOutputPolicy`` that has a model summarize, and falls back when it cannot.

    ``model`` is a governor ``Backend`` or a LangChain chat model. ``counter`` counts the
    budget (``TokenCounter()`` by default: pass the governor's, so the units agree).
    ``prompt`` is the system prompt; ``{budget_tokens}`` in it is replaced by the budget.
    ``fallback`` reduces the text when the model does not (``ExtractiveSummarizer`` over
    ``counter`` by default). Thread-safe; ``reduce`` and ``areduce`` may run at once.
    ``stats()`` counts the model calls and the fallbacks by reason.
    """

    def __init__(
        self,
        model: Any,
        *,
        counter: TokenCounter | None = None,
        prompt: str = DEFAULT_PROMPT,
        timeout_s: float = 30.0,
        fallback: ToolOutputPolicy | None = None,
        max_input_tokens: int | None = None,
    ) -> None:
        self._backend: Backend | None = None
        if _is_backend(model):
            self._backend = model
        elif not (_has_method(model, "ainvoke") or _has_method(model, "invoke")):
            raise ConfigError(
                f"model must be a governor Backend (agenerate and count_messages) or a "
                f"LangChain chat model (ainvoke or invoke), got {type(model).__name__}; pass "
                "a backend such as backends.LocalBackend() or a chat model such as "
                "langchain_openai.ChatOpenAI(...)",
                setting="model",
            )
        if counter is not None and not (
            _has_method(counter, "count") and _has_method(counter, "truncate")
        ):
            raise ConfigError(
                f"counter must be a governor.TokenCounter, got {type(counter).__name__}; pass "
                "the counter the governor uses, or leave it unset to count with tiktoken",
                setting="counter",
            )
        _check_prompt(prompt)
        if (
            isinstance(timeout_s, bool)
            or not isinstance(timeout_s, (int, float))
            or not math.isfinite(timeout_s)
            or timeout_s <= 0
        ):
            raise ConfigError(
                f"timeout_s must be a number of seconds > 0, got {timeout_s!r}; pass the "
                "longest a summary may take before the extractive fallback answers, e.g. 30.0",
                setting="timeout_s",
            )
        if fallback is not None and not isinstance(fallback, ToolOutputPolicy):
            raise ConfigError(
                f"fallback must be a ToolOutputPolicy (a reduce(text, *, budget_tokens, "
                f"tool_name, arguments) method), got {type(fallback).__name__}; pass e.g. "
                "policies.ExtractiveSummarizer(counter), or leave it unset",
                setting="fallback",
            )
        if max_input_tokens is not None:
            check_setting("max_input_tokens", max_input_tokens, 1)
        self._model = model
        self._counter = counter if counter is not None else TokenCounter()
        self._prompt = prompt
        self._timeout_s = float(timeout_s)
        self._extractive = ExtractiveSummarizer(self._counter)
        self._fallback: ToolOutputPolicy = fallback if fallback is not None else self._extractive
        self._max_input_tokens = max_input_tokens
        self._lock = threading.Lock()
        self._num_model_calls = 0
        self._num_llm = 0
        self._fallbacks: Counter[str] = Counter()

    def stats(self) -> SummarizerStats:
        """The counts so far (a snapshot)."""
        with self._lock:
            return SummarizerStats(
                num_model_calls=self._num_model_calls,
                num_llm=self._num_llm,
                num_fallbacks=sum(self._fallbacks.values()),
                fallbacks=dict(self._fallbacks),
            )

    def __repr__(self) -> str:
        return (
            f"LLMSummarizer(model={type(self._model).__name__}, counter={self._counter!r}, "
            f"timeout_s={self._timeout_s:g}, fallback={self._fallback!r}, "
            f"max_input_tokens={self._max_input_tokens!r})"
        )

    def reduce(
        self,
        text: str,
        *,
        budget_tokens: int,
        tool_name: str | None = None,
        arguments: Mapping[str, Any] | None = None,
        question: str | None = None,
    ) -> ToolOutputReduction:
        """``areduce`` for synchronous callers, from any thread (module docstring)."""
        check_setting("budget_tokens", budget_tokens, 1)
        work = self.areduce(
            text,
            budget_tokens=budget_tokens,
            tool_name=tool_name,
            arguments=arguments,
            question=question,
        )
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._run(work)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="LLMSummarizer") as worker:
            return worker.submit(self._run, work).result()

    async def areduce(
        self,
        text: str,
        *,
        budget_tokens: int,
        tool_name: str | None = None,
        arguments: Mapping[str, Any] | None = None,
        question: str | None = None,
    ) -> ToolOutputReduction:
        """``text`` within ``budget_tokens``: unchanged when it fits (method ``"none"``),
        the model's summary (``"llm"``), or the fallback's reduction (its own method, with
        ``detail`` saying why the model's answer was not used)."""
        check_setting("budget_tokens", budget_tokens, 1)
        started = time.perf_counter()
        count = self._counter.count
        before = count(text)
        if before <= budget_tokens:
            return ToolOutputReduction(text, before, before, "none", time.perf_counter() - started)
        # The backend's capacity waits for an engine step; counting and cutting are CPU work.
        prompt = await asyncio.to_thread(
            self._prompt_for, text, before, budget_tokens, tool_name, arguments or {}, question
        )
        reply = await self._ask(prompt)
        answer = None if reply.text is None else reply.text.strip()
        detail, reason = reply.detail, reply.reason
        if answer is not None:
            after = count(answer)
            if not answer:
                detail, reason = "llm answer empty", "empty"
            elif after > budget_tokens:
                detail = f"llm answer over budget ({after:,} > {budget_tokens:,} tokens)"
                reason = "over_budget"
            else:
                with self._lock:
                    self._num_llm += 1
                pre = prompt.pre
                notes = [detail] if detail else []
                if pre is not None:
                    notes.insert(0, f"input cut extractively to {pre.tokens_after:,} tokens first")
                return ToolOutputReduction(
                    answer,
                    before,
                    after,
                    "llm",
                    time.perf_counter() - started,
                    elided=() if pre is None else pre.elided,
                    detail="; ".join(notes),
                )
        self._fell_back(reason, detail, tool_name)
        reduced = await asyncio.to_thread(
            reduce_output,
            self._fallback,
            text,
            budget_tokens=budget_tokens,
            tool_name=tool_name,
            arguments=arguments,
            question=question,
        )
        kept, method, after = reduced.text, reduced.method, count(reduced.text)
        if after > budget_tokens:  # a fallback that counts with another tokenizer
            kept, method = self._counter.truncate(kept, budget_tokens), "truncate"
            after = count(kept)
            detail += f"; fallback answer over budget, truncated ({reduced.method})"
        return ToolOutputReduction(
            kept,
            before,
            after,
            method,
            time.perf_counter() - started,
            elided=reduced.elided,
            detail=detail,
        )

    def _fell_back(self, reason: str, detail: str, tool_name: str | None) -> None:
        with self._lock:
            self._fallbacks[reason] += 1
        _log.warning(
            "LLMSummarizer: the fallback reduces %s's output: %s",
            tool_name or "a tool",
            detail,
        )

    # -- the prompt ---------------------------------------------------------------------
    def _prompt_for(
        self,
        text: str,
        num_tokens: int,
        budget: int,
        tool_name: str | None,
        arguments: Mapping[str, Any],
        question: str | None,
    ) -> _Prompt:
        """The messages for the model, the output cut until they fit what it can take."""
        limit = self._max_input_tokens or _INPUT_FACTOR * budget
        system = {"role": "system", "content": self._prompt.format(budget_tokens=budget)}
        header = _header(tool_name, self._arguments_text(arguments), self._question_text(question))
        backend = self._backend
        room = 0  # tokens the backend can hold for prompt and answer together
        if backend is not None:
            try:
                cap = backend.capacity()
            except Exception as exc:  # the backend's failure: the fallback answers
                return _Prompt.failed("error", f"llm error: {describe(unless_a_bug(exc))}")
            # A call that needs more blocks than the pool has can never run.
            room = min(cap.max_model_len, cap.num_available_blocks * cap.block_size)
            block_size = cap.block_size
        for _ in range(_FIT_TRIES):
            pre = None
            if num_tokens > limit:
                pre = self._extractive.reduce(
                    text,
                    budget_tokens=limit,
                    tool_name=tool_name,
                    arguments=arguments,
                    question=question,
                )
            source = text if pre is None else pre.text
            note = "" if pre is None else _SHORTENED
            user = {"role": "user", "content": f"{header}Output{note}:\n{source}"}
            messages = [system, user]
            if backend is None:
                return _Prompt(messages, budget, pre)
            try:
                needed = backend.count_messages(messages) + budget
            except Exception as exc:
                return _Prompt.failed("error", f"llm error: {describe(unless_a_bug(exc))}")
            over = needed - room
            if over <= 0:
                return _Prompt(messages, budget, pre, max_blocks=-(-needed // block_size))
            limit = min(limit, pre.tokens_after if pre else num_tokens) - over - _FIT_MARGIN
            if limit < 1:
                break
        return _Prompt.failed(
            "no_room",
            f"llm prompt and a {budget:,}-token answer do not fit the {room:,} tokens the "
            "backend can hold",
        )

    def _arguments_text(self, arguments: Mapping[str, Any]) -> str:
        if not arguments:
            return ""
        shown = json.dumps(dict(arguments), ensure_ascii=False, default=str)
        cut = self._counter.truncate(shown, _ARGUMENT_TOKENS)
        return cut if cut == shown else f"{cut} [... cut ...]"

    def _question_text(self, question: str | None) -> str:
        if not question:
            return ""
        cut = self._counter.truncate(question, _ARGUMENT_TOKENS)
        return cut if cut == question else f"{cut} [... cut ...]"

    # -- the model call -----------------------------------------------------------------
    async def _ask(self, prompt: _Prompt) -> _Reply:
        if prompt.messages is None:
            return _Reply(None, prompt.detail, prompt.reason)
        with self._lock:
            self._num_model_calls += 1
        try:
            return await asyncio.wait_for(self._call(prompt), self._timeout_s)
        except asyncio.TimeoutError:  # only wait_for's: _call turns the model's errors into replies
            return _Reply(None, f"llm timed out after {self._timeout_s:g} s", "timeout")

    async def _call(self, prompt: _Prompt) -> _Reply:
        assert prompt.messages is not None
        try:
            if self._backend is not None:
                return await self._generate(self._backend, prompt)
            if _has_method(self._model, "ainvoke"):
                message = await self._model.ainvoke(prompt.messages)
            else:  # a sync-only model: its thread runs on if the timeout cancels this
                loop = asyncio.get_running_loop()
                message = await loop.run_in_executor(None, self._model.invoke, prompt.messages)
            return _Reply(content_text(message))
        except Exception as exc:  # the model failed: the fallback answers, unless a bug
            return _Reply(None, f"llm error: {describe(unless_a_bug(exc))}", "error")

    async def _generate(self, backend: Backend, prompt: _Prompt) -> _Reply:
        """One call inside an engine budget of its own (see the module docstring)."""
        assert prompt.messages is not None
        budget = f"kvgov-summary-{next(_budget_ids)}"
        await backend.aopen_budget(budget, max_blocks=prompt.max_blocks)
        try:
            request = GenerationRequest(
                messages=prompt.messages,
                max_tokens=prompt.max_tokens,
                temperature=0.0,
                budget=budget,
            )
            result = await backend.agenerate(request)
        finally:
            # Shielded: a second cancel must not skip it (the budget would stay open).
            await asyncio.shield(_aclose_budget(backend, budget))
        if result.finish_reason == "abort":
            return _Reply(None, "llm call aborted (the backend closed or dropped it)", "aborted")
        cut = result.finish_reason in ("length", "budget")
        return _Reply(result.text, "llm answer cut at max_tokens" if cut else "")

    def _run(self, work: Coroutine[Any, Any, ToolOutputReduction]) -> ToolOutputReduction:
        """``work`` on a private event loop on this thread, as ``asyncio.run`` would, except
        that a sync-only chat model's thread is not waited for after a timeout."""
        loop = asyncio.new_event_loop()
        executor = ThreadPoolExecutor(thread_name_prefix="LLMSummarizer-model")
        loop.set_default_executor(executor)
        try:
            return loop.run_until_complete(work)
        finally:
            try:
                left = asyncio.all_tasks(loop)
                for task in left:
                    task.cancel()
                if left:
                    loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                # A backend's threads only queue or abort requests: wait, so nothing is
                # left running once reduce returns.
                executor.shutdown(wait=self._backend is not None)
                loop.close()


async def _aclose_budget(backend: Backend, budget: str) -> None:
    """Close a summary's budget once its call is gone: an aborted call's blocks return
    on the engine's next step, so an in-use refusal is retried for a moment."""
    deadline = time.monotonic() + _CLOSE_TRIES_S
    while True:
        try:
            await backend.aclose_budget(budget)
            return
        except BackendError as exc:
            if time.monotonic() >= deadline:
                _log.warning("LLMSummarizer could not close engine budget %r: %s", budget, exc)
                return
            await asyncio.sleep(0.005)


def _is_backend(model: Any) -> bool:
    return isinstance(model, Backend) or (
        _has_method(model, "agenerate") and _has_method(model, "count_messages")
    )


def _has_method(obj: Any, name: str) -> bool:
    return callable(getattr(obj, name, None))


def _check_prompt(prompt: object) -> None:
    if not isinstance(prompt, str) or not prompt.strip():
        raise ConfigError(
            f"prompt must be a non-empty system prompt, got {prompt!r}; leave it unset for "
            "DEFAULT_PROMPT",
            setting="prompt",
        )
    try:
        prompt.format(budget_tokens=1)
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(
            f"prompt must be a str.format template whose only field is {{budget_tokens}}; "
            f"formatting it failed ({type(exc).__name__}: {exc}); double literal braces "
            "as {{ and }}",
            setting="prompt",
        ) from exc


def _header(tool_name: str | None, arguments: str, question: str) -> str:
    lines = []
    if question:
        lines.append(f"Request: {question}\n")
    if tool_name:
        lines.append(f"Tool: {tool_name}\n")
    if arguments:
        lines.append(f"Arguments: {arguments}\n")
    return "".join(lines)
