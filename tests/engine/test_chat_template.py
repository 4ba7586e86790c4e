"""Chat templates: identical strings and ids to transformers' ``apply_chat_template`` on
real-world templates, the sandbox, and the built-in ChatML template."""
# ruff: noqa: E501  the real-world templates below are quoted verbatim

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from engine.chat_template import DEFAULT_CHAT_TEMPLATE, ChatTemplate
from engine.errors import ChatTemplateError, InvalidRequestError
from engine.tokenizer import Tokenizer, load_tokenizer

# Qwen2.5-Instruct's template, as published in its tokenizer_config.json.
QWEN2_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

# Meta-Llama-3-8B-Instruct's template.
LLAMA3_TEMPLATE = r"""{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>

'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>

' }}{% endif %}"""

# Llama-3.1-Instruct's template: tools, tojson(indent=4), strftime_now, raise_exception.
LLAMA31_TEMPLATE = r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]
QWEN_CONFIG = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
LLAMA_CONFIG = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Temperature in °C for a city (<b>no</b> HTML escaping)",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
CHAT = [
    {"role": "system", "content": "You are terse. Ünïcode ok."},
    {"role": "user", "content": "  What's 2+2? <b>bold</b>  "},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And in 日本語?"},
]
TOOL_CHAT = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    },
    {"role": "tool", "content": '{"celsius": 21}'},
    {"role": "tool", "content": "second result"},
]


def tokenizer_json(folder: Path) -> None:
    tokenizer = HFTokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=350,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(["the weather in paris, what is it? " * 5] * 10, trainer)
    tokenizer.save(str(folder / "tokenizer.json"))


def model_folder(folder: Path, template: object, config: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer_json(folder)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **config, "chat_template": template}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def both(folder: Path) -> tuple[Tokenizer, Any]:
    from transformers import AutoTokenizer

    return load_tokenizer(folder), AutoTokenizer.from_pretrained(folder)


def assert_same(
    ours: Tokenizer,
    hf: Any,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool,
    tools: list[dict[str, Any]] | None = None,
    **template_kwargs: Any,
) -> None:
    options = {"add_generation_prompt": add_generation_prompt, "tools": tools}
    text = ours.apply_chat_template(messages, **options, chat_template_kwargs=template_kwargs)
    assert text == hf.apply_chat_template(messages, **options, tokenize=False, **template_kwargs)
    ids = hf.apply_chat_template(messages, **options, return_dict=False, **template_kwargs)
    assert ours.encode_chat(messages, **options, chat_template_kwargs=template_kwargs) == ids
    assert ours.count_chat_tokens(messages, **options, chat_template_kwargs=template_kwargs) == len(
        ids
    )


CASES = {
    "qwen2": (QWEN2_TEMPLATE, QWEN_CONFIG),
    "llama3": (LLAMA3_TEMPLATE, LLAMA_CONFIG),
    "llama3.1": (LLAMA31_TEMPLATE, LLAMA_CONFIG),
}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Tokenizer, Any]]:
    """Our tokenizer and transformers', loaded from the same folder, per template."""
    return {
        name: both(model_folder(tmp_path_factory.mktemp(name), template, config))
        for name, (template, config) in CASES.items()
    }


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("name", sorted(CASES))
def test_plain_chats_render_exactly_like_transformers(
    pairs: dict[str, tuple[Tokenizer, Any]], name: str, add_generation_prompt: bool
) -> None:
    ours, hf = pairs[name]
    # A fixed date keeps Llama 3.1's strftime_now() out of the comparison.
    kwargs = {"date_string": "26 Jul 2024"} if name == "llama3.1" else {}
    assert_same(ours, hf, CHAT, add_generation_prompt=add_generation_prompt, **kwargs)
    assert_same(ours, hf, CHAT[1:2], add_generation_prompt=add_generation_prompt, **kwargs)


def test_qwen2_tool_chats_render_exactly_like_transformers(
    pairs: dict[str, tuple[Tokenizer, Any]],
) -> None:
    ours, hf = pairs["qwen2"]
    for messages in (TOOL_CHAT, [CHAT[0], *TOOL_CHAT]):
        assert_same(ours, hf, messages, add_generation_prompt=True, tools=[WEATHER_TOOL])


@pytest.mark.parametrize("tools_in_user_message", [True, False])
def test_llama31_tool_chats_render_exactly_like_transformers(
    pairs: dict[str, tuple[Tokenizer, Any]], tools_in_user_message: bool
) -> None:
    ours, hf = pairs["llama3.1"]
    for messages in (TOOL_CHAT[:-1], [CHAT[0], *TOOL_CHAT[:-1]]):
        assert_same(
            ours,
            hf,
            messages,
            add_generation_prompt=True,
            tools=[WEATHER_TOOL],
            tools_in_user_message=tools_in_user_message,
            date_string="1 Jan 2025",
        )


def test_strftime_now_gives_todays_date(pairs: dict[str, tuple[Tokenizer, Any]]) -> None:
    ours, hf = pairs["llama3.1"]
    text = ours.apply_chat_template(CHAT)
    assert f"Today Date: {datetime.now().strftime('%d %b %Y')}" in text
    assert text == hf.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)


def test_raise_exception_becomes_a_chat_template_error(
    pairs: dict[str, tuple[Tokenizer, Any]],
) -> None:
    ours, hf = pairs["llama3.1"]
    too_many_calls = {**TOOL_CHAT[1], "tool_calls": TOOL_CHAT[1]["tool_calls"] * 2}
    with pytest.raises(ChatTemplateError, match="single tool-calls") as caught:
        ours.apply_chat_template([TOOL_CHAT[0], too_many_calls])
    assert isinstance(caught.value, InvalidRequestError)
    with pytest.raises(Exception, match="single tool-calls"):
        hf.apply_chat_template([TOOL_CHAT[0], too_many_calls], tokenize=False)


def test_named_templates_pick_tool_use_when_tools_are_given(tmp_path: Path) -> None:
    templates = [
        {"name": "default", "template": "plain:{{ messages[0].content }}"},
        {"name": "tool_use", "template": "tools:{{ tools | length }}:{{ messages[0].content }}"},
    ]
    ours, hf = both(model_folder(tmp_path, templates, QWEN_CONFIG))
    for tools in (None, [WEATHER_TOOL]):
        assert_same(ours, hf, CHAT[1:2], add_generation_prompt=True, tools=tools)
    assert ours.apply_chat_template(CHAT[1:2], tools=[WEATHER_TOOL]).startswith("tools:1:")


def test_chat_template_jinja_file_wins_over_the_config(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, "from config", QWEN_CONFIG)
    (folder / "chat_template.jinja").write_text("from file {{ eos_token }}")
    ours, hf = both(folder)
    assert ours.apply_chat_template(CHAT) == "from file <|im_end|>"
    assert_same(ours, hf, CHAT, add_generation_prompt=True)


def test_generation_blocks_render_their_body_like_transformers(tmp_path: Path) -> None:
    template = (
        "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}"
        "{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}"
    )
    ours, hf = both(model_folder(tmp_path, template, QWEN_CONFIG))
    assert_same(ours, hf, CHAT, add_generation_prompt=False)


def test_tojson_keeps_unicode_and_html_and_takes_indent() -> None:
    template = ChatTemplate("{{ messages[0].content | tojson }}|{{ tools | tojson(indent=2) }}")
    text = template.render([{"role": "user", "content": "héllo <b>&"}], tools=[{"a": 1}])
    assert text == '"héllo <b>&"|[\n  {\n    "a": 1\n  }\n]'


def test_loop_controls_and_trimmed_blocks() -> None:
    template = ChatTemplate(
        "{% for m in messages %}\n  {% if loop.index > 2 %}{% break %}{% endif %}\n"
        "{{ m.content }};\n{% endfor %}"
    )
    assert template.render(CHAT) == f"{CHAT[0]['content']};\n{CHAT[1]['content']};\n"


@pytest.mark.parametrize(
    "source",
    [
        "{{ messages.append({'role': 'x'}) }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{% set ns = namespace(_secret=1) %}",
        "{% set ns = namespace() %}{% set ns._x = 1 %}",
    ],
)
def test_the_sandbox_refuses_unsafe_templates(source: str) -> None:
    with pytest.raises(ChatTemplateError, match="rejected these messages"):
        ChatTemplate(source).render(CHAT)


def test_namespace_and_dict_work_as_in_transformers() -> None:
    template = ChatTemplate(
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
        "{% endfor %}{{ ns.n }} {{ dict(a=1) | tojson }}"
    )
    assert template.render(CHAT) == '4 {"a": 1}'


def test_syntax_errors_are_reported_with_the_line() -> None:
    with pytest.raises(ChatTemplateError, match="line 2"):
        ChatTemplate("ok\n{% if %}")


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([], "empty"),
        ("hello", "list of dicts"),
        ([{"role": "user", "content": "a"}, "b"], "message 1 is a str"),
    ],
)
def test_malformed_messages_are_refused(messages: Any, message: str) -> None:
    with pytest.raises(ChatTemplateError, match=message):
        ChatTemplate(DEFAULT_CHAT_TEMPLATE).render(messages)


def test_reserved_variables_and_bad_tools_are_refused() -> None:
    template = ChatTemplate(DEFAULT_CHAT_TEMPLATE)
    with pytest.raises(ChatTemplateError, match="messages"):
        template.render(CHAT, variables={"messages": []})
    with pytest.raises(ChatTemplateError, match="JSON-schema dicts"):
        template.render(CHAT, tools=["get_weather"])  # type: ignore[list-item]


def test_the_default_template_is_chatml() -> None:
    text = ChatTemplate(DEFAULT_CHAT_TEMPLATE).render(CHAT[:3])
    assert text == (
        "<|im_start|>system\nYou are terse. Ünïcode ok.<|im_end|>\n"
        "<|im_start|>user\n  What's 2+2? <b>bold</b>  <|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_the_default_template_renders_tools_calls_and_content_parts() -> None:
    template = ChatTemplate(DEFAULT_CHAT_TEMPLATE)
    text = template.render(
        [
            CHAT[0],
            {"role": "user", "content": [{"type": "text", "text": "parts"}]},
            *TOOL_CHAT[1:3],
        ],
        tools=[WEATHER_TOOL],
        add_generation_prompt=False,
    )
    assert text == (
        "<|im_start|>system\nYou are terse. Ünïcode ok.\n\n# Tools\n\nTo call a function, reply "
        'with <tool_call>{"name": ..., "arguments": ...}</tool_call>.\n<tools>\n'
        f"{json.dumps(WEATHER_TOOL, ensure_ascii=False)}\n</tools><|im_end|>\n"
        "<|im_start|>user\nparts<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
        '"Paris"}}\n</tool_call><|im_end|>\n'
        '<|im_start|>tool\n{"celsius": 21}<|im_end|>\n'
    )


def test_a_folder_without_a_template_uses_the_default(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, None, QWEN_CONFIG)
    ours = load_tokenizer(folder)
    assert ours.chat_template.source == DEFAULT_CHAT_TEMPLATE
    assert ours.encode_chat(CHAT[1:2])[0] == ours.token_id("<|im_start|>")
