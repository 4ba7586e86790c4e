"""The errors ``RemoteBackend`` raises, rebuilt from ``kvgov serve``'s error bodies.

The server names the engine's error class and its fields (``backends.remote.wire.ErrorDetail``);
the client raises a ``governor.errors.BackendError`` subclass of the same name with the
same fields and message, as ``LocalBackend`` does in process, so code that catches
``BackendError`` or looks at ``type(exc).__name__`` and ``exc.needed`` works with either.
Without torch on this side the engine's own classes cannot be bases: the classes are
built here from names that are Python identifiers, and kept for the first ``_MAX_CLASSES``
names (a server that names a new class in every answer would otherwise grow the client
without bound; past them a class is built for each error and goes with it); any other
name is raised as ``BackendError`` with the name in ``error_class``. The
server's fields never replace what the client sets itself (``retriable``, ``problem``,
``backend``, ``status_code``...): only the server's ``retriable`` flag says whether a call
may be retried.

A body with no kvgov detail maps by status: a 400 that says the prompt is longer than the
context to ``CeilingExceededError`` (never retried, as in process), with ``needed`` and
``available`` when the engine said them; 401/403 to ``AuthenticationError``, 429 and 5xx
to ``BackendUnavailable`` (retriable) but 501 (a route the server does not implement or
has switched off, as llama-server's slot actions without ``--slot-save-path``: asking
again never helps), anything else to ``BackendError``. The context
400s of the engines kvgov talks to: OpenAI's and vLLM's ``"code":
"context_length_exceeded"`` (vLLM's older bodies only say "maximum context length" in a
top-level ``{"object": "error", ...}``, or that the prompt "is longer than the maximum
model length"), SGLang's "longer than the model's context length", llama.cpp's ``"type":
"exceed_context_size_error"`` with ``n_prompt_tokens`` and ``n_ctx``.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from governor import BackendError, BackendUnavailable

__all__ = ["InvalidNameError", "error_from_response", "remote_error_class"]


class InvalidNameError(BackendError, ValueError):
    """A budget name or prefix key that ``kvgov serve`` would refuse (``wire.name_problem``),
    refused here before any request is sent; ``name`` is the name, ``reason`` what is
    wrong with it."""

    def __init__(
        self, name: object, reason: str, *, what: str = "budget name", backend: str | None = None
    ) -> None:
        self.name = name
        self.reason = reason
        super().__init__(
            f"{what} {name!r} cannot go to kvgov serve: {reason}; choose a printable name "
            "without '/'",
            backend=backend,
        )


def _reduce(error: BaseException) -> tuple[Any, ...]:
    return (_rebuild, (type(error).__name__, error.args), error.__dict__)


def _rebuild(name: str, args: tuple[Any, ...]) -> BaseException:
    cls = remote_error_class(name)
    return cls.__new__(cls, *args)


_MAX_CLASSES = 256  # server-named classes kept; engines have a few dozen
_MAX_CLASS_NAME = 100
_MAX_MESSAGE = 2_000  # characters of a server's message kept in the error
_KNOWN: dict[str, type[BackendError]] = {
    "BackendError": BackendError,
    "GovernorError": BackendError,
    "BackendUnavailable": BackendUnavailable,
    "InvalidNameError": InvalidNameError,
}
# What the client sets on an error itself: a server field of one of these names is dropped.
_OWN_FIELDS = frozenset(
    {"args", "backend", "problem", "retriable", "retry_after_s", "status_code", "error_class"}
)
_classes: dict[str, type[BackendError]] = {}
_classes_lock = threading.Lock()


def remote_error_class(name: str) -> type[BackendError]:
    """A ``BackendError`` subclass named as the server's error class (built once for the
    first ``_MAX_CLASSES`` names, each time after them); plain ``BackendError`` for a name
    that is not an identifier."""
    known = _KNOWN.get(name)
    if known is not None:
        return known
    if not (isinstance(name, str) and name.isidentifier() and len(name) <= _MAX_CLASS_NAME):
        return BackendError
    with _classes_lock:
        cls = _classes.get(name)
        if cls is None:
            cls = type(name, (BackendError,), {"__module__": __name__, "__reduce__": _reduce})
            if len(_classes) < _MAX_CLASSES:
                _classes[name] = cls
        return cls


def _fields(detail: dict[str, Any] | None) -> dict[str, Any]:
    """The server's fields for the error, less those the client sets itself."""
    fields = (detail or {}).get("fields")
    if not isinstance(fields, dict):
        return {}
    return {key: value for key, value in fields.items() if _settable(key)}


def _settable(key: object) -> bool:
    return (
        isinstance(key, str)
        and key.isidentifier()
        and not key.startswith("_")
        and key not in _OWN_FIELDS
    )


def error_from_response(
    status: int, body: bytes, *, backend: str, headers: dict[str, str] | None = None
) -> BackendError:
    """The typed error for an error answer of the server."""
    info = _error_info(body)
    message = str(info.get("message") or f"HTTP {status}")[:_MAX_MESSAGE]
    detail = info.get("kvgov") if isinstance(info.get("kvgov"), dict) else None
    if (status >= 500 and status != 501) or status == 429:
        error: BackendError = BackendUnavailable(f"HTTP {status}: {message}", backend=backend)
        error.__dict__.update(_fields(detail))
        error.__dict__["status_code"] = status
        retry_after = (headers or {}).get("retry-after")
        if retry_after is not None:
            error.__dict__["retry_after_s"] = _seconds(retry_after)
        return error
    if detail and detail.get("error_class"):
        name = str(detail["error_class"])
    elif status == 400 and _context_exceeded(info, message):
        name = "CeilingExceededError"
        detail = {"fields": _context_fields(info)}
    elif status in (401, 403):
        name = "AuthenticationError"
    else:
        name = "BackendError"
    cls = remote_error_class(name)
    error = cls.__new__(cls, message)
    error.__dict__.update(_fields(detail))
    if cls is BackendError and name not in _KNOWN:
        error.__dict__["error_class"] = name[:_MAX_CLASS_NAME]  # not a class name: a field
    error.problem = message
    error.backend = backend
    error.__dict__["status_code"] = status
    retriable = None if detail is None else detail.get("retriable")
    if retriable is not None and bool(retriable) != cls.retriable:
        error.retriable = bool(retriable)
    return error


def _error_info(body: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(body)
    except ValueError:
        return {"message": body[:500].decode("utf-8", "replace")}
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return parsed["error"]
    if isinstance(parsed, dict) and parsed.get("object") == "error":  # vLLM's older bodies
        return parsed
    if isinstance(parsed, dict) and "detail" in parsed:  # FastAPI's own 404s and 422s
        return {"message": json.dumps(parsed["detail"])}
    return {"message": str(parsed)[:500]}


_CONTEXT_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error"})
_CONTEXT_WORDS = (
    "maximum context length",  # OpenAI, vLLM: "This model's maximum context length is N tokens"
    "longer than the maximum model length",  # vLLM: "The decoder prompt (length N) is ..."
    "longer than the model's context length",  # SGLang: "The input (N tokens) is ..."
    "exceeds the available context size",  # llama.cpp
)


def _context_exceeded(info: dict[str, Any], message: str) -> bool:
    if info.get("code") in _CONTEXT_CODES or info.get("type") in _CONTEXT_CODES:
        return True
    return any(words in message.lower() for words in _CONTEXT_WORDS)


def _context_fields(info: dict[str, Any]) -> dict[str, Any]:
    """The engine's numbers under the engine error's names (llama.cpp says them)."""
    fields: dict[str, Any] = {}
    if isinstance(info.get("n_prompt_tokens"), int):
        fields["needed"] = info["n_prompt_tokens"]
    if isinstance(info.get("n_ctx"), int):
        fields["available"] = fields["ceiling_tokens"] = info["n_ctx"]
    return fields


def _seconds(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None
