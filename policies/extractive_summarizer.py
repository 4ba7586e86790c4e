"""Deterministic, model-free reduction of a tool output to a token budget.

``ExtractiveSummarizer`` reads the output's structure and keeps what the agent asked for
and what stands out, marking every elision with what it removed. The first reader that
recognises the text reads it (``policies.readers.READERS``: diagnostics, stack traces,
JSON, tables, diffs, logs, listings, prose); text none of them recognises is read line by
line (``read_lines``: lines naming the call's terms, errors and their context, the tail
and head, then the rest), and ``fit`` keeps a reading's pieces in rank order while they
fit. What the agent asked for is the call's arguments and, where the caller passes it,
the agent's last request (``question``). Output that not even one piece of fits is cut to
its longest prefix with a marker. The result never exceeds the budget by the counter's
exact count.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from governor import TokenCounter, ToolOutputReduction
from policies._conversation import check_setting
from policies.readers import READERS, Reader
from policies.readers.fit import fit, marker
from policies.readers.lines import read_lines
from policies.readers.pieces import Query

__all__ = ["ExtractiveSummarizer"]

_WORDS = "error|errors|warning|warnings|warn|traceback|exception|failed|failure|fatal|panic"
# JSON reporting an error: an error key with a value (not empty, null, false, 0), or a status.
_JSON_ERROR = re.compile(
    r'"(?i:error|errors|exception|failure|fault|traceback|stacktrace|stack_trace)"\s*:\s*'
    r'(?:"[^"]|\{\s*"|\[\s*[^\]\s]|true|-?[1-9])'
    r'|"(?i:status|state|phase|level|severity|result|outcome|reason|message|msg)"\s*:\s*'
    rf'"[^"\n]*\b(?i:{_WORDS})\b'
)
_JSON_KEEP = 20  # items kept per long array, tried first; then as many as fit


class ExtractiveSummarizer:
    """A ``ToolOutputPolicy`` that reads the output's structure, keeps what matters and
    marks what it drops. ``readers`` replaces the structure readers tried before the
    line-by-line one (``()``: lines only)."""

    def __init__(
        self, counter: TokenCounter | None = None, *, readers: Sequence[Reader] | None = None
    ) -> None:
        self._counter = counter if counter is not None else TokenCounter()
        self._readers = READERS if readers is None else tuple(readers)

    def __repr__(self) -> str:
        names = ", ".join(reader.__name__ for reader in self._readers)
        return f"ExtractiveSummarizer(counter={self._counter!r}, readers=({names}))"

    def reduce(
        self,
        text: str,
        *,
        budget_tokens: int,
        tool_name: str | None = None,
        arguments: Mapping[str, Any] | None = None,
        question: str | None = None,
    ) -> ToolOutputReduction:
        check_setting("budget_tokens", budget_tokens, 1)
        started = time.perf_counter()
        before = self._counter.count(text)
        elided: tuple[tuple[str, int], ...] = ()
        method, reduced, after = "none", text, before
        if before > budget_tokens:
            query = Query.of(tool_name, arguments, question)
            method, reduced, after, elided = self._reduce(text, budget_tokens, query)
        assert after <= budget_tokens or method == "none"
        return ToolOutputReduction(
            text=reduced,
            tokens_before=before,
            tokens_after=after,
            method=method,
            elapsed_s=time.perf_counter() - started,
            elided=tuple((what, n) for what, n in elided if n),
        )

    def _reduce(
        self, text: str, budget: int, query: Query
    ) -> tuple[str, str, int, tuple[tuple[str, int], ...]]:
        """``(method, text, exact tokens, elided)`` of the reduction."""
        for reader in self._readers:
            reading = reader(text, query)
            if reading is not None and (fitted := fit(reading, budget, self._counter)):
                return reading.method, fitted.text, fitted.tokens, fitted.elided
        source = text
        parsed = None
        if text.lstrip()[:1] in ("[", "{"):
            with contextlib.suppress(ValueError):
                parsed = json.loads(text)
        if parsed is not None:
            flags: dict[int, bool] | None = {} if _JSON_ERROR.search(text) else None
            shown, num_items, tokens = self._fit_json(parsed, budget, flags, of_errors=False)
            if tokens > budget and flags and any(flags.values()):  # as many errors as fit
                shown, num_items, tokens = self._fit_json(parsed, budget, flags, of_errors=True)
            if tokens <= budget:
                return "json", shown, tokens, (("json items", num_items),)
            source = shown
        fitted = fit(read_lines(source, query, counter=self._counter), budget, self._counter)
        if fitted is not None:
            return "extractive", fitted.text, fitted.tokens, fitted.elided
        truncated, cut = self._truncate(text, budget)
        return "truncate", truncated, self._counter.count(truncated), (("characters", cut),)

    def _fit_json(
        self, value: Any, budget: int, flags: dict[int, bool] | None, *, of_errors: bool
    ) -> tuple[str, int, int]:
        """``(text, items elided, exact tokens)`` of the value with as many items per long
        array as fit, at least one: first items and every error item, or (``of_errors``)
        error items only. Over budget when even one is too many."""
        tried: dict[int, tuple[str, int, int]] = {}

        def attempt(n: int) -> tuple[str, int, int]:
            if n not in tried:
                items = [0]
                keep, cap = (1, n) if of_errors else (n, None)
                collapsed = _collapse(value, keep, items, flags, cap)
                shown = json.dumps(collapsed, indent=2, ensure_ascii=False)
                tried[n] = (shown, items[0], self._counter.count(shown))
            return tried[n]

        lo, hi = 0, _JSON_KEEP  # invariant: lo items fit (0: none tried), hi do not
        while attempt(hi)[2] <= budget:  # gallop up from the first guess
            if attempt(hi)[1] == 0 or (lo and attempt(hi)[0] == attempt(lo)[0]):
                return attempt(hi)  # nothing left to cut, or more items add nothing
            lo, hi = hi, hi * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if attempt(mid)[2] <= budget:
                lo = mid
            else:
                hi = mid
        return attempt(max(lo, 1))

    def _truncate(self, text: str, budget: int) -> tuple[str, int]:
        """The longest prefix that fits with a marker for the rest, or without one, and how
        many characters it cut."""
        count, truncate = self._counter.count, self._counter.truncate
        room = budget - count(self._gap(text)) - 1
        prefix = truncate(text, room) if room > 0 else ""
        marked = f"{prefix}\n{self._gap(text[len(prefix) :])}"
        if not prefix or count(marked) > budget:
            prefix = marked = truncate(text, budget)
        return marked, len(text) - len(prefix)

    def _gap(self, text: str) -> str:
        return marker({"lines": text.count("\n") + 1}, self._counter.count(text))


def _reports_error(item: Any, flags: dict[int, bool] | None) -> bool:
    """Whether an array item holds an error, looked at once (by id: items are not hashable);
    never without ``flags``."""
    if flags is None:
        return False
    if id(item) not in flags:
        flags[id(item)] = _JSON_ERROR.search(json.dumps(item, ensure_ascii=False)) is not None
    return flags[id(item)]


def _collapse(
    value: Any, keep: int, items: list[int], flags: dict[int, bool] | None, cap: int | None
) -> Any:
    """``value`` with every array longer than ``keep`` cut to its first ``keep`` items and
    every item that reports an error (none without ``flags``), or, given a ``cap``, to its
    first ``cap`` error items (its first ``keep`` items if it has none); each gap noted."""
    if isinstance(value, dict):
        return {k: _collapse(v, keep, items, flags, cap) for k, v in value.items()}
    if not isinstance(value, list):
        return value
    if len(value) <= keep:
        return [_collapse(v, keep, items, flags, cap) for v in value]
    first = 0 if cap is not None else keep  # with a cap, error items come before first ones
    errors = [i for i in range(first, len(value)) if _reports_error(value[i], flags)]
    chosen = [*range(keep), *errors] if cap is None else errors[:cap] or list(range(keep))
    out: list[Any] = []
    previous = -1
    for i in [*chosen, len(value)]:
        if i > previous + 1:
            items[0] += i - previous - 1
            out.append(f"[... {i - previous - 1:,} more items elided ...]")
        if i < len(value):
            out.append(_collapse(value[i], keep, items, flags, cap))
        previous = i
    return out
