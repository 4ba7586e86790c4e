"""The bodies the OpenAI routes answer with, and their SSE stream.

Shapes are OpenAI's ``ChatCompletion``, ``ChatCompletionChunk``, ``Completion`` (object
``text_completion``) and ``CompletionUsage`` with ``prompt_tokens_details.cached_tokens``.
kvgov adds to each choice ``kvgov_finish_reason`` (``stop``, ``length``, ``ceiling``,
``budget`` or ``abort``; OpenAI's ``finish_reason`` says ``length`` for a ceiling or a
budget) and, with ``return_token_ids``, vLLM's ``token_ids`` on the choice and
``prompt_token_ids`` (on the response for chat, on the choice for completions, as vLLM
puts them; streamed: on the first chunk, and each chunk's ``token_ids`` are its own);
a call with ``retain`` has ``usage.kvgov_retained_tokens``, the tokens held as it ended,
and every call ``usage.kvgov_engine_ms``, the engine's own time for it (from its arrival at
the engine to its end): a call's time beyond it is the network's and the server's.

Streaming: the chunks carry the text as the engine makes it; the one with
``finish_reason`` carries ``kvgov_finish_reason``; with ``stream_options.include_usage``
every chunk has ``"usage": null`` and a last chunk with no choices carries the usage.
A client that reads slowly, or not at all, never holds the engine: uvicorn pauses the
write once the connection's buffers are full, the engine finishes the request and
returns its blocks, and what the client has not taken waits in the server as the
engine's outputs (``LocalBackend.astream``'s queue, merged into one chunk when the write
resumes): the call's own tokens at most, no KV (``tests/kvgov/serve/test_disconnect.py``).

Bodies and events are compact UTF-8 JSON, written by pydantic-core (``to_json``).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

from pydantic_core import to_json
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from governor.backend import GenerationChunk, GenerationResult
from kvgov.serve.errors import ApiError
from kvgov.serve.openai_calls import ModelCall

__all__ = ["SSEResponse", "completion_body", "event_stream", "json_response"]

_OPENAI_FINISH = {"stop": "stop", "length": "length", "ceiling": "length", "budget": "length"}


def finish_reason(kvgov_reason: str) -> str:
    return _OPENAI_FINISH.get(kvgov_reason, kvgov_reason)


def usage(result: GenerationResult) -> dict[str, Any]:
    counts: dict[str, Any] = {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.prompt_tokens + result.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": result.cached_tokens},
    }
    if result.retained_tokens:  # a call with ``retain``: what the engine held as it ended
        counts["kvgov_retained_tokens"] = result.retained_tokens
    if result.engine_s is not None:  # the engine's own time for the call, in milliseconds
        counts["kvgov_engine_ms"] = round(result.engine_s * 1e3, 3)
    return counts


def _envelope(call: ModelCall, *, chunk: bool) -> dict[str, Any]:
    if call.kind == "chat":
        kind = "chat.completion.chunk" if chunk else "chat.completion"
    else:
        kind = "text_completion"
    return {
        "id": call.id,
        "object": kind,
        "created": call.created,
        "model": call.model,
        "system_fingerprint": None,
    }


def completion_body(
    call: ModelCall, result: GenerationResult, prompt_ids: list[int] | None
) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "logprobs": None,
        "finish_reason": finish_reason(result.finish_reason),
        "kvgov_finish_reason": result.finish_reason,
    }
    if call.kind == "chat":
        choice["message"] = {"role": "assistant", "content": result.text, "refusal": None}
    else:
        choice["text"] = result.text
    body = {**_envelope(call, chunk=False), "choices": [choice], "usage": usage(result)}
    if prompt_ids is not None:
        choice["token_ids"] = list(result.token_ids)
        if call.kind == "chat":
            body["prompt_token_ids"] = prompt_ids
        else:
            choice["prompt_token_ids"] = prompt_ids
    return body


def json_response(body: dict[str, Any]) -> Response:
    """``body`` as ``application/json``: the bytes ``JSONResponse`` would send (compact
    UTF-8; these bodies hold no floats, whose spelling would differ), written by
    pydantic-core's serializer in about a seventh of the time of ``json.dumps``."""
    return Response(to_json(body), media_type="application/json")


def _chunk_choice(call: ModelCall, text: str, *, first: bool) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": None}
    if call.kind == "chat":
        delta: dict[str, Any] = {"content": text}
        if first:
            delta = {"role": "assistant", "content": text}
        choice["delta"] = delta
    else:
        choice["text"] = text
    return choice


async def event_stream(
    call: ModelCall,
    first: GenerationChunk,
    rest: AsyncGenerator[GenerationChunk, None],
    prompt_ids: list[int] | None,
) -> AsyncIterator[bytes]:
    """SSE ``data:`` lines for the call's chunks (``first`` already taken), then
    ``[DONE]``. Closing this closes ``rest``, which aborts the engine request."""
    body = call.body
    include_usage = body.include_usage
    head = _envelope(call, chunk=True)
    if include_usage:
        head["usage"] = None

    def frame(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return b"data: " + to_json({**head, "choices": choices, **extra}) + b"\n\n"

    try:
        async with aclosing(rest):
            chunk: GenerationChunk | None = first
            opened = False
            while chunk is not None and chunk.result is None:
                choice = _chunk_choice(call, chunk.text, first=not opened)
                extra: dict[str, Any] = {}
                if prompt_ids is not None:
                    choice["token_ids"] = list(chunk.token_ids)
                    if not opened:
                        _put_prompt_ids(call, choice, extra, prompt_ids)
                opened = True
                yield frame([choice], **extra)
                chunk = await anext(rest, None)
            assert chunk is not None and chunk.result is not None, "a stream ends with its result"
            result = chunk.result
            choice = _chunk_choice(call, "", first=not opened)
            if call.kind == "chat" and opened:
                choice["delta"] = {}
            choice["finish_reason"] = finish_reason(result.finish_reason)
            choice["kvgov_finish_reason"] = result.finish_reason
            extra = {}
            if prompt_ids is not None:
                choice["token_ids"] = []
                if not opened:
                    _put_prompt_ids(call, choice, extra, prompt_ids)
            yield frame([choice], **extra)
            if include_usage:
                yield frame([], usage=usage(result))
    except ApiError as exc:  # after the 200 went out: the error travels as an event, as vLLM's
        yield b"data: " + to_json(exc.body()) + b"\n\n"
    yield b"data: [DONE]\n\n"


def _put_prompt_ids(
    call: ModelCall, choice: dict[str, Any], extra: dict[str, Any], prompt_ids: list[int]
) -> None:
    if call.kind == "chat":
        extra["prompt_token_ids"] = prompt_ids
    else:
        choice["prompt_token_ids"] = prompt_ids


class SSEResponse(StreamingResponse):
    """A ``text/event-stream`` whose body iterator is always closed when the response
    ends, however it ends (done, client gone, send failed), so the engine request
    behind it is aborted at once rather than whenever the generator is collected."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[bytes]) -> None:
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._content = content

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            closer = getattr(self._content, "aclose", None)
            if closer is not None:
                await closer()
