"""Stop strings: find them in streamed text, across token boundaries.

A request's text arrives in pieces (one detokenized token at a time). ``StopChecker``
sees every piece, stops at the first stop string to *complete* (the earliest end; at
equal ends, the longer string), and cuts the text before it, or after it with
``include_stop_str_in_output``. Until a tail of the text can no longer grow into a stop
string it is held back, so a stream never shows text that a later piece would cut.
The outcome does not depend on how the text was split: the pieces joined, plus
``flush()`` when nothing matched, equal one ``push`` of the whole text.

``TokenStopChecker`` is the per-request whole the engine needs: it takes sampled token
ids, detokenizes them without splitting characters, ends on a stop token (EOS unless
``ignore_eos``, plus ``stop_token_ids``) and passes the text through a ``StopChecker``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.errors import InvalidRequestError

if TYPE_CHECKING:
    from engine.sampling import SamplingParams
    from engine.tokenizer import Tokenizer

__all__ = ["StopChecker", "StopResult", "TokenStopChecker"]


@dataclass(frozen=True, slots=True)
class StopResult:
    """What one ``push`` released: ``text`` is safe to stream; ``stopped`` ends the request.

    A stopped result names what stopped it: ``stop_string`` or ``stop_token_id``.
    """

    text: str
    stopped: bool
    stop_string: str | None = None
    stop_token_id: int | None = None


class StopChecker:
    """Stop-string detection for one request's streamed text."""

    __slots__ = (
        "_finished",
        "_include",
        "_max_len",
        "_released",
        "_stop_string",
        "_stops",
        "_window",
    )

    def __init__(self, stop: Sequence[str], *, include_stop_str_in_output: bool = False) -> None:
        if isinstance(stop, str) or not all(isinstance(s, str) and s for s in stop):
            raise InvalidRequestError("stop must be a sequence of non-empty strings")
        self._stops = tuple(dict.fromkeys(stop))
        self._include = include_stop_str_in_output
        self._max_len = max((len(s) for s in self._stops), default=0)
        # _window holds the unreleased text plus enough released text before it for a
        # stop string to start there: window[_released:] is still held back.
        self._window = ""
        self._released = 0
        self._stop_string: str | None = None
        self._finished = False

    @property
    def stopped(self) -> bool:
        return self._stop_string is not None

    @property
    def has_stop_strings(self) -> bool:
        return bool(self._stops)

    def push(self, text: str) -> StopResult:
        """Add the next piece of text; returns what may be streamed and whether to stop."""
        if self._finished:
            raise InvalidRequestError("push() after flush(); use a new StopChecker per request")
        if self._stop_string is not None:
            return StopResult("", True, self._stop_string)
        if not self._stops:
            return StopResult(text, False)
        window = self._window + text
        match = _first_match(window, self._stops)
        if match is not None:
            start, end, stop_string = match
            cut = end if self._include else start
            assert cut >= self._released, "held-back text must cover any stop-string start"
            self._stop_string = stop_string
            self._window = ""
            return StopResult(window[self._released : cut], True, stop_string)
        safe = len(window) if self._include else len(window) - _held_back(window, self._stops)
        assert safe >= self._released, "a held-back tail only ever shrinks from the left"
        released = window[self._released : safe]
        keep_from = min(safe, max(0, len(window) - (self._max_len - 1)))
        self._window = window[keep_from:]
        self._released = safe - keep_from
        return StopResult(released, False)

    def flush(self) -> str:
        """The held-back text, at the end of a request that did not stop on a string."""
        self._finished = True
        if self._stop_string is not None:
            return ""
        held = self._window[self._released :]
        self._window = ""
        self._released = 0
        return held


def _first_match(text: str, stops: tuple[str, ...]) -> tuple[int, int, str] | None:
    """``(start, end, stop)`` of the stop string that completes first in ``text``."""
    best: tuple[int, int, str] | None = None
    for stop in stops:
        start = text.find(stop)
        if start < 0:
            continue
        end = start + len(stop)
        if best is None or (end, start) < (best[1], best[0]):
            best = (start, end, stop)
    return best


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of a stop string."""
    longest = min(len(text), max(len(s) for s in stops) - 1)
    for length in range(longest, 0, -1):
        tail = text[-length:]
        if any(len(s) > length and s.startswith(tail) for s in stops):
            return length
    return 0


class TokenStopChecker:
    """Stop handling for one request's sampled tokens, from token id to streamable text.

    A stop token ends the request; its own text is left out unless
    ``include_stop_str_in_output`` (vLLM's rule), and the text held back until then
    (split characters, stop-string prefixes) is released with it.
    """

    __slots__ = ("_decoder", "_ended", "_include", "_last", "_stop_ids", "_strings")

    def __init__(self, tokenizer: Tokenizer, sampling: SamplingParams) -> None:
        self._decoder = tokenizer.stream_decoder()
        self._stop_ids = sampling.stop_token_set(tokenizer.eos_token_ids)
        self._include = sampling.include_stop_str_in_output
        self._strings = StopChecker(sampling.stop, include_stop_str_in_output=self._include)
        self._last: StopResult | None = None  # the result that stopped the request
        self._ended = False

    @property
    def stopped(self) -> bool:
        return self._last is not None

    @property
    def stop_ids(self) -> frozenset[int]:
        """The tokens that end the request (end-of-sequence and ``stop_token_ids``)."""
        return self._stop_ids

    def push(self, token_id: int) -> StopResult:
        """Add the next sampled token; returns the text it releases and whether to stop."""
        if self._last is not None:
            return StopResult("", True, self._last.stop_string, self._last.stop_token_id)
        if self._ended:
            raise InvalidRequestError("push() after flush(); the request's output has ended")
        if token_id not in self._stop_ids:
            result = self._strings.push(self._decoder.push(token_id))
        else:
            result = self._release(self._decoder.push(token_id) if self._include else "")
            if not result.stopped:  # a stop string completing in the released text wins
                result = StopResult(result.text, True, stop_token_id=token_id)
        if result.stopped:
            self._last = result
            self._ended = True
        return result

    def push_repeated(self, token_id: int, times: int) -> str:
        """The text of ``push(token_id)`` made ``times`` times, none of which may stop the
        request (a decode run's steps: ``engine.decode_run``); decoded once where no stop
        string is watched for and the token is no stop token."""
        if self._last is not None or token_id in self._stop_ids:
            raise InvalidRequestError(
                "push_repeated() is for tokens that do not stop the request; push() them"
            )
        if self._strings.has_stop_strings:
            return "".join(self.push(token_id).text for _ in range(times))
        return self._strings.push(self._decoder.push_repeated(token_id, times)).text

    def flush(self) -> str:
        """The held-back text, when the request ends for another reason (length, ceiling)."""
        if self._ended:
            return ""
        self._ended = True
        return self._release("").text

    def _release(self, text: str) -> StopResult:
        """Push ``text`` and everything still held back; the stream ends here."""
        result = self._strings.push(text + self._decoder.flush())
        if result.stopped:
            return result
        return StopResult(result.text + self._strings.flush(), False)
