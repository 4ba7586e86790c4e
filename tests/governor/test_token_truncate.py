"""``TokenCounter.truncate``: the longest prefix of a text within a token budget."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governor.tokens import TokenCounter
from tests.governor.test_tokens import CODE, PROSE, WordTokenizer

LOOKAHEAD = 32  # the lengths past the bisection's answer that truncate tries too


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter()


def longest_fitting_prefix(counter: TokenCounter, text: str, max_tokens: int) -> int:
    return max(n for n in range(len(text) + 1) if n == 0 or counter.count(text[:n]) <= max_tokens)


def check_truncation(counter: TokenCounter, text: str, max_tokens: int) -> str:
    cut = counter.truncate(text, max_tokens)
    assert text.startswith(cut)
    assert counter.count(cut) <= max_tokens
    if cut != text:  # maximal: nothing up to LOOKAHEAD characters longer fits
        for extra in range(1, LOOKAHEAD + 1):
            if len(cut) + extra <= len(text):
                assert counter.count(text[: len(cut) + extra]) > max_tokens
    return cut


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=200), max_tokens=st.integers(0, 60))
def test_truncate_properties(counter: TokenCounter, text: str, max_tokens: int) -> None:
    cut = check_truncation(counter, text, max_tokens)
    assert len(cut) == longest_fitting_prefix(counter, text, max_tokens)


@settings(max_examples=100, deadline=None)
@given(
    start=st.integers(0, len(CODE) - 400),
    length=st.integers(1, 400),
    max_tokens=st.integers(0, 120),
)
def test_truncate_is_the_longest_prefix_of_real_text(
    counter: TokenCounter, start: int, length: int, max_tokens: int
) -> None:
    text = CODE[start : start + length]
    cut = check_truncation(counter, text, max_tokens)
    assert len(cut) == longest_fitting_prefix(counter, text, max_tokens)


def test_truncate_keeps_text_that_fits_and_returns_nothing_for_no_budget(
    counter: TokenCounter,
) -> None:
    assert counter.truncate("hello world", 2) == "hello world"
    assert counter.truncate("hello world", 1) == "hello"
    assert counter.truncate("hello world", 0) == ""
    with pytest.raises(ValueError, match=">= 0"):
        counter.truncate("hello", -1)
    with pytest.raises(TypeError, match="must be a str"):
        counter.truncate(None, 3)  # type: ignore[arg-type]


def test_truncate_finds_a_longer_prefix_past_a_dip(counter: TokenCounter) -> None:
    # "hello <|endo" is 3 tokens and "hello <|endof" 4, but the whole special token is one:
    # "hello <|endoftext|>" is 3 again.
    text = "hello <|endoftext|> world"
    assert counter.count("hello <|endof") == 4
    assert counter.truncate(text, 3) == "hello <|endoftext|>"


def test_truncate_long_text_exactly(counter: TokenCounter) -> None:
    text = PROSE * 4
    for max_tokens in (1, 100, 2_000):
        check_truncation(counter, text, max_tokens)
        assert counter.count(counter.truncate(text, max_tokens)) == max_tokens


@settings(max_examples=100, deadline=None)
@given(
    words=st.lists(st.text(alphabet="ab ", min_size=1, max_size=6), max_size=20),
    max_tokens=st.integers(0, 12),
)
def test_truncate_with_a_backend_tokenizer(words: list[str], max_tokens: int) -> None:
    counter = TokenCounter(tokenizer=WordTokenizer())
    text = " ".join(words)
    cut = check_truncation(counter, text, max_tokens)
    assert len(cut) == longest_fitting_prefix(counter, text, max_tokens)
