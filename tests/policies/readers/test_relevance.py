"""``Relevance`` and ``Query``: what the agent asked, matched the way code and prose write it."""

from __future__ import annotations

from policies.readers import Query
from policies.readers.relevance import Relevance, words

FILLER = [f"line {i} of the build output, nothing to see" for i in range(40)]


def test_words_split_identifiers_and_drop_plurals() -> None:
    assert words("RETRY_TIMEOUT_S retryTimeoutMs connections") == [
        "retry",
        "timeout",
        "s",
        "retry",
        "timeout",
        "ms",
        "connection",
        "retrytimeoutms",
    ]


def test_plurals_and_mixed_case_words_match_as_written() -> None:
    assert words("dependencies matches FastAPI") == [
        "dependency",
        "match",
        "fast",
        "api",
        "fastapi",
    ]


def test_a_command_names_its_operands_not_its_program() -> None:
    query = Query.of("shell", {"command": "python -m pytest -q tests/api"}, None)
    assert "tests/api" in query.terms and not {"python", "pytest"} & set(query.terms)
    assert not {"python", "pytest"} & query.words
    listed = Query.of("shell", {"cmd": "kubectl get pods -n prod -o json | grep -v Running"})
    assert "json" not in listed.words and {"pod", "prod"} <= listed.words


def test_whole_words_not_substrings() -> None:
    texts = [
        "snapshot_interval defaults to 71 minutes",
        "snapshot_interval defaulted to 5",
        *FILLER,
    ]
    relevance = Relevance({"default"}, texts)
    assert relevance.score(texts[0]) > 0 and relevance.score(texts[1]) == 0


def test_an_abbreviation_in_an_identifier_stands_for_its_word() -> None:
    texts = ["+  max_upload_mb: 217", "+  maximize_upload: true", "+  MaxRetries = 3", *FILLER]
    relevance = Relevance({"maximum"}, texts)
    assert relevance.score(texts[0]) > 0 and relevance.score(texts[2]) > 0
    assert relevance.score(texts[1]) == 0  # "maximize" is not "max" standing alone


def test_a_word_in_most_texts_picks_nothing() -> None:
    texts = [f"cache hit for key {i}" for i in range(30)] + ["cache miss: evicted key 7"]
    relevance = Relevance({"cache", "evicted"}, texts)
    assert relevance.score(texts[0]) == 0 and relevance.score(texts[-1]) > 0


def test_the_question_says_what_its_number_is_counted_in() -> None:
    query = Query.of(None, None, "How many client connections does the server accept?")
    assert query.quantity and {"connections", "connection"} <= set(query.measures)
    assert Query.of(None, None, "How long does an idle connection stay open?").measures
    assert Query.of(None, None, "Does kestrel set snapshot_interval by default? To what?").quantity
    assert not Query.of(None, None, "Why did the build fail?").quantity
    assert "snapshot_interval" in Query.of(None, None, "Is snapshot_interval set?").names


def test_the_ids_and_addresses_a_question_names_are_terms() -> None:
    query = Query.of(None, None, "A customer at 81.77.28.91 says order ord_48213 failed.")
    assert {"81.77.28.91", "ord_48213"} <= set(query.terms)
    assert query.mentions('81.77.28.91 - - [19/Jun/2024] "POST /checkout" 503')
