"""What a summarizing model's reply, or failure, means: private to policies/.

``content_text`` reads a LangChain chat model's reply. ``unless_a_bug`` sorts a failure:
one the fallback may answer for (the model is unavailable, overloaded, refuses the
request) is returned, one that no fallback should hide is raised again: a programming
error, a ``ConfigError``, or refused credentials (an ``...AuthenticationError`` or
``...PermissionDeniedError`` class, as the OpenAI and Anthropic clients name theirs, or
an HTTP 401/403 status on the error or its ``response``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from governor import ConfigError

__all__ = ["content_text", "describe", "unless_a_bug"]

_BUGS = (  # a programming error in the model's code or ours: never hidden by the fallback
    TypeError,
    AttributeError,
    NameError,
    LookupError,
    AssertionError,
    ImportError,
    NotImplementedError,
    SyntaxError,
    ConfigError,
)
_AUTH_CLASSES = ("AuthenticationError", "PermissionDeniedError", "UnauthorizedError")
_AUTH_STATUS = (401, 403)


def unless_a_bug(exc: Exception) -> Exception:
    """``exc``, when the fallback may answer for it; raised when it must not be hidden: a
    programming error, a configuration error, or a refused authentication."""
    if isinstance(exc, _BUGS) or _is_auth_error(exc):
        raise exc
    return exc


def _is_auth_error(exc: BaseException) -> bool:
    names = {cls.__name__ for cls in type(exc).__mro__}
    if any(name in names for name in _AUTH_CLASSES):
        return True
    for holder in (exc, getattr(exc, "response", None)):
        status = getattr(holder, "status_code", None) or getattr(holder, "status", None)
        if status in _AUTH_STATUS:
            return True
    return False


def content_text(message: Any) -> str:
    """The text of a chat model's reply: ``content`` as a string or a list of parts."""
    content = getattr(message, "content", message)
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(
            part
            if isinstance(part, str)
            else str(part.get("text", ""))
            if isinstance(part, Mapping) and part.get("type", "text") == "text"
            else ""
            for part in content
        )
    # The model's failure, not a bug here: a ValueError, so the fallback answers.
    raise ValueError(f"the chat model replied with a {type(content).__name__}, not text")


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
