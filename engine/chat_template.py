"""Chat templates: Hugging Face Jinja templates, rendered the way transformers renders them.

A model folder ships its template as ``chat_template.jinja`` or inside
``tokenizer_config.json``. ``ChatTemplate`` compiles it in a sandboxed, immutable Jinja
environment with the same options, globals and filters as transformers'
``apply_chat_template`` (``trim_blocks``, ``lstrip_blocks``, ``raise_exception``,
``strftime_now``, a ``tojson`` that keeps non-ASCII text and takes ``indent``, the
``loopcontrols`` extension and the ``{% generation %}`` block), so the same messages
render to the same string.

``DEFAULT_CHAT_TEMPLATE`` is the ChatML-style template used by tokenizers that bring
none, such as the ``tiktoken`` presets. For ``cl100k_base`` its ``<|im_start|>`` and
``<|im_end|>`` markers are not special tokens: they encode as ordinary text (several
tokens each), which is fine for a model that was never trained on chat anyway, and the
marker text can be used as a stop string.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from engine.errors import ChatTemplateError

__all__ = ["DEFAULT_CHAT_TEMPLATE", "ChatTemplate"]

DEFAULT_CHAT_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages and messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- '# Tools\\n\\nTo call a function, reply with ' }}
    {{- '<tool_call>{"name": ..., "arguments": ...}</tool_call>.\\n<tools>' }}
    {%- for tool in tools %}
        {{- '\\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '\\n</tools><|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if not (tools and loop.first and message.role == 'system') %}
        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for part in message.content | default([]) %}
                {%- if part.type == 'text' %}
                    {{- part.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {%- for call in message.tool_calls | default([]) %}
            {%- set function = call.function if call.function is defined else call %}
            {%- if message.content or not loop.first %}
                {{- '\\n' }}
            {%- endif %}
            {{- '<tool_call>\\n' }}
            {{- {'name': function.name, 'arguments': function.arguments} | tojson }}
            {{- '\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

# Older names for a message's reasoning; transformers copies it under all of them
# because templates read different ones (``reasoning_content``, gpt-oss ``thinking``).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_RESERVED = frozenset({"add_generation_prompt", "documents", "messages", "tools"})


class ChatTemplate:
    """A compiled chat template. Rendering is thread-safe; compile errors surface here."""

    __slots__ = ("_source", "_template")

    def __init__(self, source: str) -> None:
        if not isinstance(source, str):
            raise ChatTemplateError(f"a chat template must be a str, got {type(source).__name__}")
        self._source = source
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(
                f"the chat template does not compile (line {exc.lineno}: {exc.message}); "
                "fix the template or remove it to use the built-in ChatML template"
            ) from exc

    @property
    def source(self) -> str:
        """The Jinja source the template was compiled from."""
        return self._source

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text for ``messages``.

        ``variables`` are extra template variables, e.g. ``bos_token`` or a model's own
        switches such as ``enable_thinking``.
        """
        chat = _normalize_messages(messages)
        clash = _RESERVED.intersection(variables or {})
        if clash:
            raise ChatTemplateError(
                f"template variables may not be named {', '.join(sorted(clash))}; pass those "
                "as the render() arguments of the same name"
            )
        if tools is not None:
            if isinstance(tools, (str, Mapping)) or not all(isinstance(t, Mapping) for t in tools):
                raise ChatTemplateError("tools must be a list of JSON-schema dicts, one per tool")
            tools = _plain(list(tools))
        if documents is not None:
            documents = _plain(list(documents))
        try:
            return self._template.render(
                **_plain(dict(variables or {})),
                messages=chat,
                tools=tools,
                documents=documents,
                add_generation_prompt=add_generation_prompt,
            )
        # The template is foreign code: whatever it raises (its raise_exception(), an
        # undefined key, str + None) means these messages do not fit it.
        except Exception as exc:
            raise ChatTemplateError(
                f"the chat template rejected these messages: {exc}; fix the messages "
                "(roles, order, missing content) to match what this model's template expects"
            ) from exc


def _normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(messages, (str, Mapping)) or not isinstance(messages, Sequence):
        raise ChatTemplateError("messages must be a list of dicts with 'role' and 'content'")
    if not messages:
        raise ChatTemplateError("messages is empty; a chat needs at least one message")
    chat = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ChatTemplateError(
                f"message {index} is a {type(message).__name__}, not a dict; "
                "pass {'role': ..., 'content': ...} dicts"
            )
        # Templates handle a missing key but often print "None" or crash on a None value
        # (OpenAI-style content=None next to tool_calls), so None values are dropped.
        message = {key: value for key, value in message.items() if value is not None}
        reasoning = next((message[key] for key in _REASONING_FIELDS if key in message), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        chat.append(_plain(message))
    return chat


def _plain(value: Any) -> Any:
    """``value`` rebuilt from plain JSON types, so the sandbox never sees foreign methods."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain(item) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return f"<{type(value).__name__}>"


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes <, >, & and ' for HTML; prompts need the plain JSON.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _TemplateDict:
    """``dict(...)`` for templates without handing them the ``dict`` type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(Namespace):
    """``namespace()`` that refuses underscore attributes, a way into CPython internals."""

    # No named self, like Namespace itself, so that namespace(self=...) still works.
    def __init__(*args: Any, **kwargs: Any) -> None:
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _check_attribute(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_attribute(name)
        Namespace.__setitem__(self, name, value)


def _check_attribute(name: object) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(
            f"chat templates cannot store underscore attributes on a namespace, got {name!r}"
        )


class _GenerationBlock(Extension):
    """``{% generation %}...{% endgeneration %}`` (assistant-mask markers): renders its body."""

    tags = {"generation"}  # noqa: RUF012  jinja reads it as a class attribute

    def parse(self, parser: jinja2.parser.Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Any) -> str:
        return caller()
