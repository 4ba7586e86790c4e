"""Request bodies of the OpenAI-compatible routes, as pydantic models.

Field names are OpenAI's (``openai-python``'s ``CompletionCreateParams``) and, where
vLLM has the field, vLLM's (``priority``, ``cache_salt``, ``return_token_ids``); kvgov's
own extras are ``budget``, ``ceiling_tokens``, ``retain`` and ``order_age_s`` (first come,
first served orders the call as if it arrived that many seconds ago: the governor sends
its program's age). Clients send the extras
at the top level of the body (the openai client's ``extra_body``).

Unknown fields are refused (400 "Unrecognized request argument supplied"), as OpenAI
refuses them: a misspelled ``max_token`` must not silently generate 16 tokens. OpenAI's
own fields that kvgov does not implement are accepted at their neutral value and
refused otherwise (``logprobs: true``, ``tools``, a non-zero ``presence_penalty``...),
so a client never gets an answer computed without what it asked for. Values are strict:
``"5"`` is not a number of tokens.

Responses are built as plain dicts in ``openai_responses``: they are written once and
never read back, and the openai client accepts any extra field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "DetokenizeRequest",
    "StreamOptions",
    "TokenizeRequest",
    "invalid",
    "read_body",
    "unsupported",
]

B = TypeVar("B", bound=BaseModel)
_MAX_SEED = 2**64
PositiveInt = Annotated[int, Field(ge=1)]


def invalid(param: str, message: str) -> PydanticCustomError:
    """A value refused with ``message``; the 400 names ``param``."""
    return PydanticCustomError("invalid", "{message}", {"message": message, "param": param})


def unsupported(param: str, detail: str) -> PydanticCustomError:
    """A field set to something kvgov does not do."""
    return invalid(param, f"{param} is not supported by kvgov serve: {detail}")


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class StreamOptions(_Body):
    include_usage: StrictBool = False


class TextPart(_Body):
    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    """One message. Fields beyond these (``tool_calls``, ``tool_call_id``,
    ``reasoning_content``) go to the chat template as they are, as transformers passes
    them."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: StrictStr | list[TextPart] | None = None
    name: StrictStr | None = None


class _Sampling(_Body):
    """What both generation routes share: sampling, streaming, and kvgov's extras."""

    model: StrictStr | None = None  # None: the served model
    max_tokens: PositiveInt | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    seed: Annotated[int, Field(ge=0, lt=_MAX_SEED)] | None = None
    stop: StrictStr | list[StrictStr] | None = None
    n: int = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: StrictStr | None = None  # accepted, unused
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    # vLLM's names
    priority: int = 0
    cache_salt: Annotated[str, Field(min_length=1)] | None = None
    return_token_ids: StrictBool = False
    # kvgov's
    budget: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    ceiling_tokens: PositiveInt | None = None
    retain: StrictBool = False
    order_age_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None

    @model_validator(mode="after")
    def _check(self) -> _Sampling:
        if self.n != 1:
            raise unsupported("n", f"n={self.n}; each request returns one choice, send n requests")
        if self.stream_options is not None and not self.stream:
            raise invalid("stream_options", "stream_options is only allowed when stream is true")
        if self.retain and self.budget is None:
            raise invalid("retain", "retain needs a budget: name the budget to keep the KV in")
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                raise unsupported(name, "only 0 (no penalty)")
        if self.logit_bias:
            raise unsupported("logit_bias", "only an empty bias")
        if any(not s for s in self.stop_strings):
            raise invalid("stop", "a stop string must not be empty")
        return self

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: PositiveInt | None = None
    logprobs: StrictBool | None = None
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: StrictBool | None = None
    response_format: dict[str, Any] | None = None
    # accepted, unused: they change nothing a model here computes
    metadata: dict[str, Any] | None = None
    store: StrictBool | None = None
    service_tier: StrictStr | None = None
    prompt_cache_key: StrictStr | None = None
    safety_identifier: StrictStr | None = None
    reasoning_effort: StrictStr | None = None
    modalities: list[Literal["text"]] | None = None

    @model_validator(mode="after")
    def _check_chat(self) -> ChatCompletionRequest:
        if self.logprobs or self.top_logprobs:
            raise unsupported("logprobs", "no log probabilities are returned")
        if self.tools:
            raise unsupported("tools", "send tool schemas in the system message instead")
        if self.tool_choice not in (None, "none", "auto"):
            raise unsupported("tool_choice", "no tools are supported")
        if self.response_format not in (None, {"type": "text"}):
            raise unsupported("response_format", 'only {"type": "text"}')
        return self

    @property
    def output_limit(self) -> int | None:
        """``max_completion_tokens`` wins over the deprecated ``max_tokens``, as in vLLM."""
        return self.max_completion_tokens or self.max_tokens

    def message_dicts(self) -> list[dict[str, Any]]:
        return [m.model_dump(exclude_none=True) for m in self.messages]


class CompletionRequest(_Sampling):
    # one prompt: text, or token ids (a list of one of either is accepted too)
    prompt: StrictStr | list[StrictStr] | list[int] | list[list[int]]
    max_tokens: PositiveInt | None = 16  # OpenAI's default for completions
    echo: StrictBool = False
    logprobs: int | None = None
    suffix: StrictStr | None = None
    best_of: int | None = None

    @model_validator(mode="after")
    def _check_completion(self) -> CompletionRequest:
        prompt = self.prompt
        batch = isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list))
        if batch and len(prompt) != 1:
            raise unsupported("prompt", f"{len(prompt)} prompts; send one per request")
        if prompt in ("", [], [""], [[]]):
            raise invalid("prompt", "the prompt is empty; send at least one token")
        if self.echo:
            raise unsupported("echo", "the prompt is not echoed")
        if self.logprobs:
            raise unsupported("logprobs", "no log probabilities are returned")
        if self.suffix:
            raise unsupported("suffix", "no insertion after a suffix")
        if self.best_of not in (None, 1):
            raise unsupported("best_of", "only 1")
        return self

    @property
    def output_limit(self) -> int | None:
        return self.max_tokens

    def one_prompt(self) -> str | list[int]:
        prompt = self.prompt
        if isinstance(prompt, str):
            return prompt
        first = prompt[0]
        if isinstance(first, (str, list)):
            return first
        return prompt  # type: ignore[return-value]  # its first item is an int: a list[int]


class TokenizeRequest(_Body):
    """vLLM's ``/tokenize``: ``prompt`` (text) or ``messages`` (rendered with the chat
    template, as ``/v1/chat/completions`` renders them)."""

    model: StrictStr | None = None
    prompt: StrictStr | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: StrictBool = True
    # kvgov's completions prefill the text without added special tokens; so does this
    add_special_tokens: StrictBool = False

    @model_validator(mode="after")
    def _one(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise invalid("prompt", "send exactly one of prompt and messages")
        return self


class DetokenizeRequest(_Body):
    model: StrictStr | None = None
    tokens: list[Annotated[int, Field(ge=0)]]


async def read_body(request: Request, model: type[B]) -> B:
    """The request's body as ``model``, decided as FastAPI decides a body parameter (JSON
    when the content type says so; none, or another type, is not an object) and parsed
    from the bytes in one step; errors as FastAPI raises them."""
    raw = await request.body()
    if not raw:
        raise RequestValidationError([_body_error("missing", "Field required")])
    if not _is_json(request.headers.get("content-type")):
        message = "Input should be a valid dictionary or object to extract fields from"
        raise RequestValidationError([_body_error("model_attributes_type", message)])
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors) from None


def _body_error(kind: str, message: str) -> dict[str, Any]:
    return {"type": kind, "loc": ("body",), "msg": message, "input": None}


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    kind = content_type.partition(";")[0].strip().lower()
    return kind == "application/json" or (
        kind.startswith("application/") and kind.endswith("+json")
    )
