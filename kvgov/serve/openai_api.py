"""The OpenAI-compatible routes: ``/v1/chat/completions``, ``/v1/completions``,
``/v1/models``, ``/tokenize`` and ``/detokenize``.

Request bodies are ``openai_schemas``; answers are ``openai_responses``; each model call
is a ``ModelCall`` (gate, events, errors, tenancy). A streamed call takes its first
chunk before the response starts, so a request the engine refuses (a prompt over the
context, an unknown budget) still gets its 4xx instead of a 200 stream that breaks off.
The tokenizer routes tokenize on a worker thread: a long text never holds the event loop.

The two generation routes read their body themselves (``read_body``: one pydantic parse
of the bytes, as FastAPI would decide them JSON or not), not through FastAPI's body
parameter: its dependency solving, content-type parsing and validation of a decoded
dict cost about a fifth of the event loop's time per served call. Their errors are
FastAPI's (``RequestValidationError``), answered by the same handler. ``kvgov.serve.gateway``
runs these two endpoints itself (``MODEL_ENDPOINTS``), past FastAPI's routing.
"""

from __future__ import annotations

import asyncio
from contextlib import suppress
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from kvgov.serve.errors import ApiError
from kvgov.serve.openai_calls import ApiContext, ClientGone, ModelCall
from kvgov.serve.openai_responses import (
    SSEResponse,
    completion_body,
    event_stream,
    json_response,
)
from kvgov.serve.openai_schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    read_body,
)
from kvgov.serve.state import ServerState

if TYPE_CHECKING:
    from engine.tokenizer import Tokenizer

__all__ = ["MODEL_ENDPOINTS", "api_context", "router"]

router = APIRouter()

# What a server answers a client that has gone: nobody reads it (nginx's 499 convention).
_CLIENT_CLOSED = 499


def _state(request: Request) -> ServerState:
    state: ServerState = request.app.state.kvgov
    return state


def api_context(request: Request) -> ApiContext:
    context: ApiContext = request.app.state.kvgov_api
    return context


async def chat_completions(request: Request) -> Response:
    body = await read_body(request, ChatCompletionRequest)
    return await _run(ModelCall(_state(request), api_context(request), request, body, "chat"))


async def completions(request: Request) -> Response:
    body = await read_body(request, CompletionRequest)
    return await _run(ModelCall(_state(request), api_context(request), request, body, "text"))


# Served by ``kvgov.serve.gateway`` directly; routed too, so that another method gets
# FastAPI's 405, and an app built with ``direct_routes=False`` routes them as any other.
MODEL_ENDPOINTS = MappingProxyType(
    {"/v1/chat/completions": chat_completions, "/v1/completions": completions}
)
for _path, _endpoint in MODEL_ENDPOINTS.items():
    router.add_route(_path, _endpoint, methods=["POST"])


async def _run(call: ModelCall) -> Response:
    wants_ids = call.body.return_token_ids
    if not call.body.stream:
        try:
            result = await call.generate()
        except ClientGone:
            return Response(status_code=_CLIENT_CLOSED)
        # The engine's own prompt ids come with the result: no second tokenization.
        prompt_ids = list(result.prompt_token_ids) if wants_ids else None
        return json_response(completion_body(call, result, prompt_ids))
    # A stream's first chunk carries the prompt ids, before the engine has answered.
    prompt_ids = await call.prompt_token_ids() if wants_ids else None
    chunks = call.stream()
    try:
        first = await call.until_disconnect(anext(chunks))
    except ClientGone:
        with suppress(Exception):
            await chunks.aclose()
        return Response(status_code=_CLIENT_CLOSED)
    except BaseException:
        with suppress(Exception):
            await chunks.aclose()
        raise
    return SSEResponse(event_stream(call, first, chunks, prompt_ids))


@router.get("/v1/models")
def models(request: Request) -> dict[str, Any]:
    state = _state(request)
    card = {
        "id": state.model_name,
        "object": "model",
        "created": int(state.started_at),
        "owned_by": "kvgov",
        "root": state.backend.model,
        "parent": None,
        "max_model_len": api_context(request).max_model_len,
    }
    return {"object": "list", "data": [card]}


@router.get("/v1/models/{model_id:path}")
def model(model_id: str, request: Request) -> dict[str, Any]:
    for card in models(request)["data"]:
        if card["id"] == model_id:
            return card
    raise ApiError(404, f"The model `{model_id}` does not exist", code="model_not_found")


def _check_model(request: Request, model_name: str | None) -> None:
    served = _state(request).model_name
    if model_name is not None and model_name != served:
        raise ApiError(
            404,
            f"The model `{model_name}` does not exist; this server serves `{served}`",
            code="model_not_found",
            param="model",
        )


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, Any]:
    _check_model(request, body.model)
    tokens = await asyncio.to_thread(_token_ids, _state(request).backend.tokenizer, body)
    return {
        "count": len(tokens),
        "max_model_len": api_context(request).max_model_len,
        "tokens": tokens,
    }


def _token_ids(tokenizer: Tokenizer, body: TokenizeRequest) -> list[int]:
    """A chat's ids are its rendered template's, as the chat route prefills them; the
    tokenizer's own special tokens (BOS) are added to either form only when asked, on top
    of the template as vLLM adds them."""
    if body.messages is None:
        assert body.prompt is not None
        return tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=body.add_generation_prompt)
    return tokenizer.encode(text, add_special_tokens=body.add_special_tokens)


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> dict[str, Any]:
    _check_model(request, body.model)
    tokenizer = _state(request).backend.tokenizer
    vocab = tokenizer.vocab_size
    bad = [token for token in body.tokens if token >= vocab]
    if bad:
        raise ApiError(
            400,
            f"token ids must be in 0..{vocab - 1} for this tokenizer; got {bad[:5]}",
            code="invalid_token_ids",
            param="tokens",
        )
    text = await asyncio.to_thread(tokenizer.decode, body.tokens, skip_special_tokens=False)
    return {"prompt": text}
