"""``Limits``: the ceilings and budgets of ``OpenAICompatibleBackend``, kept on the client.

An external engine has no budgets and no per-sequence ceilings, so the backend keeps
them: each budget the governor opens is a number of blocks (of the backend's block
size) and the tokens its calls in flight may reach. Before a call, ``admit`` counts the
prompt against the call's ceiling, its budget (less what its other calls in flight
reserved) and the engine's context, and returns the output cap to send as
``max_completion_tokens``: the call can never pass any of them. A prompt that already
reaches one is refused with the engine's error names (``CeilingExceededError``,
``BudgetExceededError``, fields ``needed`` and ``available``), as in process. After the
call, ``release`` returns the reservation, and ``finish_reason`` names the finish reason the way the
bundled engine does ("ceiling" or "budget" where the engine said "length" because the
cap was lowered for one).

Thread-safe; ``_lock`` is a leaf.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from backends.http.errors import remote_error_class

__all__ = ["Call", "Limits"]


@dataclass(frozen=True, slots=True)
class Call:
    budget: str | None
    max_tokens: int  # the cap sent
    reserved: int  # tokens reserved in the budget: prompt + cap
    limited_by: str | None  # "ceiling" | "budget" when either lowered the cap


class Limits:
    def __init__(self, *, block_size: int, backend: str) -> None:
        self.block_size = block_size
        self.backend = backend
        self._lock = threading.Lock()
        self._budgets: dict[str, int] = {}  # name -> max blocks
        self._reserved: dict[str, int] = {}  # name -> tokens reserved by calls in flight
        self._num_calls = 0

    def open(self, name: str, max_blocks: int) -> None:
        with self._lock:
            self._budgets[name] = max_blocks
            self._reserved.setdefault(name, 0)

    def close(self, name: str) -> None:
        with self._lock:
            self._budgets.pop(name, None)
            self._reserved.pop(name, None)

    def budgets(self) -> dict[str, int]:
        with self._lock:
            return dict(self._budgets)

    def tokens_reserved(self) -> int:
        with self._lock:
            return sum(self._reserved.values())

    @property
    def num_calls(self) -> int:
        """Calls admitted and not yet released."""
        return self._num_calls

    def admit(
        self,
        *,
        prompt_tokens: int,
        max_tokens: int,
        ceiling: int | None,
        budget: str | None,
        max_model_len: int,
    ) -> Call:
        caps: list[tuple[int, str | None]] = [(max_tokens, None)]
        caps.append((max_model_len - prompt_tokens, "context"))
        if ceiling is not None:
            if prompt_tokens >= ceiling:
                raise _error(
                    "CeilingExceededError",
                    f"the prompt of {prompt_tokens} tokens leaves no room under its ceiling "
                    f"of {ceiling}; compact its context or raise the ceiling",
                    self.backend,
                    needed=prompt_tokens,
                    available=ceiling,
                    ceiling_tokens=ceiling,
                )
            caps.append((ceiling - prompt_tokens, "ceiling"))
        if prompt_tokens >= max_model_len:
            raise _error(
                "CeilingExceededError",
                f"the prompt of {prompt_tokens} tokens does not fit the engine's context of "
                f"{max_model_len}; compact it, or serve the model with a longer context",
                self.backend,
                needed=prompt_tokens,
                available=max_model_len,
                ceiling_tokens=max_model_len,
            )
        with self._lock:
            if budget is not None and budget in self._budgets:
                left = self._budgets[budget] * self.block_size - self._reserved[budget]
                if prompt_tokens >= left:
                    raise _error(
                        "BudgetExceededError",
                        f"budget {budget!r} caps its calls at {self._budgets[budget]} block(s) "
                        f"of {self.block_size} tokens; this prompt needs {prompt_tokens} "
                        f"tokens with {left} left; end calls in it or open a larger budget",
                        self.backend,
                        name=budget,
                        needed=prompt_tokens,
                        available=left,
                        max_blocks=self._budgets[budget],
                    )
                caps.append((left - prompt_tokens, "budget"))
            cap, limited_by = min(caps, key=lambda item: item[0])
            reserved = prompt_tokens + cap
            if budget is not None and budget in self._reserved:
                self._reserved[budget] += reserved
            self._num_calls += 1
        named = limited_by if cap < max_tokens and limited_by in ("ceiling", "budget") else None
        return Call(budget, cap, reserved, named)

    def release(self, call: Call) -> None:
        """The call ended (or failed): its reservation goes back to its budget."""
        with self._lock:
            self._num_calls -= 1
            if call.budget in self._reserved:
                self._reserved[call.budget] = max(0, self._reserved[call.budget] - call.reserved)

    def finish_reason(self, call: Call, finish_reason: str, completion_tokens: int) -> str:
        """The finish reason as the bundled engine says it."""
        if finish_reason == "length" and call.limited_by and completion_tokens >= call.max_tokens:
            return call.limited_by
        return finish_reason


def _error(error_class: str, message: str, backend: str, **fields: object) -> Exception:
    cls = remote_error_class(error_class)
    error = cls(message, backend=backend)
    error.__dict__.update(fields)
    return error
