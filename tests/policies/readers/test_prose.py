"""``read_prose``: the sentences that answer the question, from a page or a document."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governor import TokenCounter
from policies.readers import Query, fit
from policies.readers.prose import read_prose
from tests.policies.readers.samples import html_page, markdown, others, paragraphs

COUNTER = TokenCounter()
ANSWER = "The maximum pool size defaults to 64 connections per worker."
PLANTED = f"Connection pooling is enabled by default. {ANSWER} Idle connections close after 90 s."
QUESTION = "What is the default maximum connection pool size?"


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kind", ["html", "prose"])
def test_the_answering_sentence_is_kept(seed: int, kind: str) -> None:
    text = html_page(seed, PLANTED) if kind == "html" else markdown(seed, PLANTED)
    query = Query.of("http_get", {"url": "https://docs.example.com/operator-guide"}, QUESTION)
    reading = read_prose(text, query)
    assert reading is not None and reading.method == kind
    fitted = fit(reading, 120, COUNTER)
    assert fitted is not None and ANSWER in fitted.text.split("\n")
    if kind == "html":
        assert "<" not in fitted.text and "var x" not in fitted.text  # no markup, no script
        assert fitted.text.startswith("[html: 'Operator guide'; ")


def test_the_answer_comes_with_its_section_heading() -> None:
    text = html_page(5, PLANTED)
    query = Query.of("http_get", {"url": "https://docs.example.com/"}, QUESTION)
    fitted = fit(read_prose(text, query) or pytest.fail(), 150, COUNTER)
    assert fitted is not None
    kept = fitted.text.split("\n")
    heading = kept.index(ANSWER) - 2  # the heading, then the paragraph's first sentence
    assert kept[heading].startswith("Section ")


def test_wrapped_paragraphs_are_unwrapped_into_sentences() -> None:
    words = markdown(2, PLANTED).split(" ")
    wrapped, line = [], ""
    for word in words:  # hard-wrapped at 72 columns, as man pages and READMEs are
        if len(line) + len(word) > 72 and "\n" not in word:
            wrapped.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    wrapped.append(line)
    reading = read_prose("\n".join(wrapped), Query.of(None, None, QUESTION))
    assert reading is not None
    assert any(piece.text == ANSWER for piece in reading.pieces)


@pytest.mark.parametrize("kind", ["diff", "log", "listing", "json", "csv", "pytest"])
def test_other_outputs_are_not_prose(kind: str) -> None:
    assert read_prose(others(2)[kind], Query.of()) is None


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=600), st.integers(5, 80))
def test_any_text_is_read_or_refused_and_fits(extra: str, budget: int) -> None:
    text = markdown(1, PLANTED) + extra
    for candidate in (text, f"<html><body><p>{extra}</p>{text}</body></html>"):
        reading = read_prose(candidate, Query.of("t", {"q": "pool"}, QUESTION))
        if reading is not None:
            fitted = fit(reading, budget, COUNTER)
            assert fitted is None or fitted.tokens <= budget


def test_how_many_finds_the_number_of_that_thing() -> None:
    answer = "By default, max_connections is set to 301 connections."
    text = markdown(
        3,
        "Clients reconnect when the server goes away. The server accepts client connections "
        f"over TLS only. {answer} Connection pooling is covered below.",
    )
    question = "How many client connections does the server accept?"
    fitted = fit(read_prose(text, Query.of(None, None, question)) or pytest.fail(), 80, COUNTER)
    assert fitted is not None and answer in fitted.text.split("\n")


def test_a_sentence_said_again_is_read_once() -> None:
    repeated = "Some teams set cache_size to 512 MiB on small clusters."
    paras = [f"{p} {repeated.replace('512', str(100 + k))}" for k, p in enumerate(paragraphs(4))]
    reading = read_prose("\n\n".join(paras), Query.of(None, None, "What is cache_size set to?"))
    assert reading is not None
    asked = [p for p in reading.pieces if p.rank[0] == 1 and "cache_size" in p.text]
    assert len(asked) == 1  # the first of the alike sentences; the others are the rest


def test_a_man_page_body_is_prose_not_code() -> None:
    sentences = re.split(r"(?<=\.) ", " ".join(paragraphs(6)))
    body = [f"       {sentence}" for sentence in sentences]  # 7 columns in, as man prints
    body.insert(40, "       The prefetch_count option defaults to 1136 messages.")
    page = ["TIDEPOOLD(8)        System Manager's Manual        TIDEPOOLD(8)", "", "OPTIONS", *body]
    query = Query.of("shell", {"command": "man tidepoold"}, "What's the default prefetch_count?")
    fitted = fit(read_prose("\n".join(page), query) or pytest.fail(), 80, COUNTER)
    assert fitted is not None
    assert "The prefetch_count option defaults to 1136 messages." in fitted.text.split("\n")


@pytest.mark.parametrize("seed", range(3))
def test_a_sentence_naming_a_setting_no_other_does_stands_out(seed: int) -> None:
    setting = "In production the limit is read from BILLING_WINDOW_x967z, set per region."
    text = markdown(seed, f"Limits are read at start. {setting} Nothing else is read.")
    reading = read_prose(text, Query.of())  # no call's terms, no question
    assert reading is not None
    fitted = fit(reading, 80, COUNTER)
    assert fitted is not None and setting in fitted.text.split("\n")
