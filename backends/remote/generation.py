"""A ``GenerationRequest`` as an OpenAI request body with kvgov's extras, and the answer
back as a ``GenerationResult``, exactly as ``LocalBackend`` would have made it.

Chat messages go to ``/v1/chat/completions``, a prompt (text or token ids) to
``/v1/completions``. ``openai_body`` is the plain OpenAI part, all an external engine
gets (``backends.openai.backend``); ``body_of`` adds kvgov serve's: it asks for
``return_token_ids`` (the ids, not a re-tokenization of the text) and carries the
extras (``priority``, ``cache_salt``, ``budget``, ``ceiling_tokens``, ``retain``, and
``order_age_s``: how long ago the call's ``order_time`` was, since the two machines'
clocks do not compare). The finish
reason comes from ``kvgov_finish_reason`` (OpenAI's own says "length" for a ceiling or a
budget); cached tokens from ``usage.prompt_tokens_details.cached_tokens``; the tokens a
``retain`` call's context held from ``usage.kvgov_retained_tokens``; the engine's own time
for the call from ``usage.kvgov_engine_ms``. An answer or a stream event of another shape
(a list where an object was, a string for a count) raises ``BackendError``, never a bare
``TypeError`` or ``AttributeError``.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from governor import BackendError, GenerationChunk, GenerationRequest, GenerationResult

__all__ = ["StreamState", "body_of", "openai_body", "path_of", "result_of", "stream_chunks"]

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


def path_of(request: GenerationRequest) -> str:
    return CHAT_PATH if request.messages is not None else COMPLETIONS_PATH


def openai_body(
    request: GenerationRequest,
    *,
    model: str,
    stream: bool,
    max_tokens: int | None = None,
) -> dict[str, Any]:
    """The request as plain OpenAI fields, which any OpenAI-compatible server takes (some,
    ``transformers serve`` among them, refuse a field they do not know). ``max_tokens``:
    the output cap to send instead of the request's (a client-side ceiling lowered it)."""
    body: dict[str, Any] = {"model": model}
    cap = request.max_tokens if max_tokens is None else max_tokens
    if request.messages is not None:
        body["messages"] = [dict(message) for message in request.messages]
        body["max_completion_tokens"] = cap
    else:
        prompt = request.prompt
        body["prompt"] = prompt if isinstance(prompt, str) else list(prompt or ())
        body["max_tokens"] = cap
    body["temperature"] = request.temperature
    body["top_p"] = request.top_p
    if request.seed is not None:
        body["seed"] = request.seed
    if request.stop:
        body["stop"] = list(request.stop)
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def body_of(request: GenerationRequest, *, model: str, stream: bool) -> dict[str, Any]:
    """The OpenAI body with kvgov serve's extras."""
    body = openai_body(request, model=model, stream=stream)
    if request.ceiling_tokens is not None:
        body["ceiling_tokens"] = request.ceiling_tokens
    if request.budget is not None:
        body["budget"] = request.budget
        if request.retain:
            body["retain"] = True
    if request.cache_salt is not None:
        body["cache_salt"] = request.cache_salt
    body["priority"] = request.priority
    if request.order_time is not None:
        body["order_age_s"] = max(0.0, time.monotonic() - request.order_time)
    body["return_token_ids"] = True
    return body


def result_of(answer: Mapping[str, Any], *, backend: str) -> GenerationResult:
    """The result of a non-streamed answer."""
    try:
        return _result_of(answer, backend)
    except _SHAPE_ERRORS as exc:
        raise _unreadable(backend, "an answer", answer, exc) from exc


def _result_of(answer: Mapping[str, Any], backend: str) -> GenerationResult:
    choice = _first_choice(answer, backend)
    message = choice.get("message")
    text = message.get("content") if isinstance(message, Mapping) else choice.get("text")
    usage = answer.get("usage") or {}
    return GenerationResult(
        text=text or "",
        token_ids=tuple(choice.get("token_ids") or ()),
        finish_reason=_finish_reason(choice),
        prompt_tokens=int(usage.get("prompt_tokens", 0)),
        completion_tokens=int(usage.get("completion_tokens", 0)),
        cached_tokens=_cached(usage),
        # vLLM's places: the response for chat, the choice for completions
        prompt_token_ids=tuple(
            answer.get("prompt_token_ids") or choice.get("prompt_token_ids") or ()
        ),
        retained_tokens=int(usage.get("kvgov_retained_tokens") or 0),
        engine_s=_engine_s(usage),
    )


async def stream_chunks(
    lines: AsyncIterator[str], state: StreamState
) -> AsyncGenerator[GenerationChunk, None]:
    """The chunks a server-sent event stream's ``data:`` lines carry, read into ``state``
    until ``[DONE]`` or the stream's end (``state.done`` says which)."""
    async for line in lines:
        if line.startswith("data:"):
            chunk = state.chunk(line[5:].strip())
            if chunk is not None:
                yield chunk
            if state.done:
                return


@dataclass(slots=True)
class StreamState:
    """What a stream has said so far; ``chunk(data)`` reads one ``data:`` line."""

    backend: str
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    usage: Mapping[str, Any] | None = None
    done: bool = False

    def chunk(self, data: str) -> GenerationChunk | None:
        """The piece this line carries, if any; None for the usage line and ``[DONE]``."""
        try:
            return self._chunk(data)
        except _SHAPE_ERRORS as exc:
            raise _unreadable(self.backend, "a stream event", data, exc) from exc

    def _chunk(self, data: str) -> GenerationChunk | None:
        if data.strip() == "[DONE]":
            self.done = True
            return None
        try:
            event = json.loads(data)
        except ValueError as exc:
            raise BackendError(
                f"a stream line is not JSON: {data[:200]!r}", backend=self.backend
            ) from exc
        if isinstance(event, Mapping) and isinstance(event.get("error"), Mapping):
            from backends.http.errors import error_from_response

            raise error_from_response(500, data.encode(), backend=self.backend)
        if event.get("usage"):
            self.usage = event["usage"]
        choices = event.get("choices") or []
        if not choices:
            return None
        choice = choices[0]
        delta = choice.get("delta")
        text = (delta.get("content") if isinstance(delta, Mapping) else choice.get("text")) or ""
        ids = tuple(choice.get("token_ids") or ())
        if choice.get("finish_reason") is not None or choice.get("kvgov_finish_reason"):
            self.finish_reason = _finish_reason(choice)
        if not text and not ids:
            return None
        self.text.append(text)
        self.token_ids.extend(ids)
        return GenerationChunk(text, ids)

    def result(self) -> GenerationResult:
        if self.finish_reason is None or self.usage is None:
            raise BackendError(
                "the stream ended without a finish reason and usage; the server closed it "
                "early: retry the call",
                backend=self.backend,
            )
        return GenerationResult(
            text="".join(self.text),
            token_ids=tuple(self.token_ids),
            finish_reason=self.finish_reason,
            prompt_tokens=int(self.usage.get("prompt_tokens", 0)),
            completion_tokens=int(self.usage.get("completion_tokens", 0)),
            cached_tokens=_cached(self.usage),
            retained_tokens=int(self.usage.get("kvgov_retained_tokens") or 0),
            engine_s=_engine_s(self.usage),
        )


# What reading a field of the wrong type raises (a list's ``.get``, ``int("x")``...).
_SHAPE_ERRORS = (AttributeError, IndexError, KeyError, OverflowError, TypeError, ValueError)


def _unreadable(backend: str, what: str, body: object, exc: BaseException) -> BackendError:
    return BackendError(
        f"{what} of a shape kvgov cannot read ({type(exc).__name__}: {str(exc)[:200]}): "
        f"{str(body)[:200]}",
        backend=backend,
    )


def _first_choice(answer: Mapping[str, Any], backend: str) -> Mapping[str, Any]:
    choices = answer.get("choices")
    if not choices:
        raise BackendError(f"an answer with no choices: {str(answer)[:200]}", backend=backend)
    return choices[0]


def _finish_reason(choice: Mapping[str, Any]) -> str:
    return str(choice.get("kvgov_finish_reason") or choice.get("finish_reason") or "stop")


def _cached(usage: Mapping[str, Any]) -> int:
    details = usage.get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


def _engine_s(usage: Mapping[str, Any]) -> float | None:
    """kvgov serve's ``usage.kvgov_engine_ms`` in seconds; None from other servers."""
    engine_ms = usage.get("kvgov_engine_ms")
    return float(engine_ms) / 1e3 if isinstance(engine_ms, (int, float)) else None
