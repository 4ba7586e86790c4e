"""A stand-in for ``kvgov serve``'s OpenAI routes, for the remote tests until the real
ones (``kvgov.serve.openai_api``) are on this branch: ``tests/serve_process.py`` mounts it
only when the app has no ``/v1/chat/completions`` of its own.

It speaks the wire contract ``RemoteBackend`` reads (issue 16's brief): the kvgov extras
in the body, ``kvgov_finish_reason`` and ``token_ids`` on each choice, cached tokens in
``usage.prompt_tokens_details``, SSE chunks with ``stream_options.include_usage``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from governor.backend import GenerationRequest, GenerationResult
from governor.errors import GovernorError
from kvgov.serve.control_errors import error_response

router = APIRouter()


def _request(body: dict[str, Any]) -> GenerationRequest:
    chat = "messages" in body
    return GenerationRequest(
        messages=body["messages"] if chat else None,
        prompt=None if chat else body["prompt"],
        max_tokens=body.get("max_completion_tokens") or body.get("max_tokens") or 16,
        temperature=body.get("temperature", 1.0),
        top_p=body.get("top_p", 1.0),
        seed=body.get("seed"),
        stop=tuple(body.get("stop") or ()),
        ceiling_tokens=body.get("ceiling_tokens"),
        budget=body.get("budget"),
        cache_salt=body.get("cache_salt"),
        priority=body.get("priority", 0),
    )


def _usage(result: GenerationResult) -> dict[str, Any]:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.prompt_tokens + result.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": result.cached_tokens},
    }


def _openai_reason(reason: str) -> str:
    return "length" if reason in ("ceiling", "budget") else reason


async def _answer(request: Request, chat: bool) -> Any:
    body = await request.json()
    backend = request.app.state.kvgov.backend
    try:
        generation = _request(body)
        if body.get("stream"):
            return StreamingResponse(
                _stream(backend, generation, chat), media_type="text/event-stream"
            )
        result = await backend.agenerate(generation)
    except GovernorError as exc:
        return error_response(exc)
    choice: dict[str, Any] = {
        "index": 0,
        "finish_reason": _openai_reason(result.finish_reason),
        "kvgov_finish_reason": result.finish_reason,
        "token_ids": list(result.token_ids),
    }
    if chat:
        choice["message"] = {"role": "assistant", "content": result.text}
    else:
        choice["text"] = result.text
    return JSONResponse(
        {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": body.get("model"),
            "choices": [choice],
            "usage": _usage(result),
        }
    )


async def _stream(backend: Any, generation: GenerationRequest, chat: bool) -> AsyncIterator[str]:
    def event(data: dict[str, Any]) -> str:
        return f"data: {json.dumps(data)}\n\n"

    try:
        async with aclosing(backend.astream(generation)) as chunks:
            async for chunk in chunks:
                if chunk.result is None:
                    piece = {"index": 0, "token_ids": list(chunk.token_ids), "finish_reason": None}
                    piece.update(
                        {"delta": {"content": chunk.text}} if chat else {"text": chunk.text}
                    )
                    yield event({"choices": [piece]})
                    continue
                reason = chunk.result.finish_reason
                last = {"index": 0, "finish_reason": _openai_reason(reason), "token_ids": []}
                last["kvgov_finish_reason"] = reason
                last.update({"delta": {}} if chat else {"text": ""})
                yield event({"choices": [last]})
                yield event({"choices": [], "usage": _usage(chunk.result)})
    except GovernorError as exc:
        yield event(json.loads(error_response(exc).body))
    yield "data: [DONE]\n\n"


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Any:
    return await _answer(request, chat=True)


@router.post("/v1/completions")
async def completions(request: Request) -> Any:
    return await _answer(request, chat=False)
