"""The control plane's errors in OpenAI's shape, with kvgov's detail for ``RemoteBackend``.

``LocalBackend`` raises an engine error as a class derived from both the engine's class
and ``governor.errors.BackendError``, with the engine's fields; the body carries that
class name and those fields (``integrations.wire.ErrorDetail``), so the client raises
an error of the same name with the same fields.

Status by class: unknown budget or pin 404; duplicate budget, budget in use, a request
that does not fit now (capacity) 409; any other invalid request 400; a closed backend
503. ``ErrorMappingRoute`` applies it to the control routes only; once the app has
handlers of its own for these classes (``kvgov.serve.errors``), it can go.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from governor.errors import BackendError, GovernorError
from integrations.wire import INSTANCE_HEADER, ErrorBody, ErrorDetail, ErrorInfo

__all__ = ["ErrorMappingRoute", "error_response"]

_NOT_FOUND = {"UnknownBudgetError", "UnknownPinError", "UnknownPrefixError"}
_CONFLICT = {"DuplicateBudgetError", "BudgetInUseError"}
_CAPACITY = {"OutOfBlocksError", "OutOfSwapSpaceError", "BudgetExceededError"}
_OWN_FIELDS = {"problem", "backend"}


def error_response(exc: GovernorError) -> JSONResponse:
    """The HTTP answer for a governor or backend error raised by a control route."""
    name = type(exc).__name__
    classes = {cls.__name__ for cls in type(exc).__mro__}
    if name in _NOT_FOUND:
        status, kind = 404, "not_found_error"
    elif name in _CONFLICT or name in _CAPACITY:
        status, kind = 409, "conflict_error"
    elif classes & {"InvalidRequestError", "CapacityError", "ConfigError"}:
        status, kind = 400, "invalid_request_error"
    elif isinstance(exc, BackendError):  # the backend itself: closed, its engine thread gone
        status, kind = 503, "service_unavailable"
    else:
        status, kind = 400, "invalid_request_error"
    detail = ErrorDetail(
        # Only a backend that is down is worth the same call later: a request that does
        # not fit is refused again until the caller changes something (frees, resizes).
        error_class=name,
        fields=_fields(exc),
        retriable=status == 503,
    )
    body = ErrorBody(error=ErrorInfo(message=str(exc), type=kind, code=_code(name), kvgov=detail))
    return JSONResponse(body.model_dump(mode="json"), status_code=status)


def _fields(exc: BaseException) -> dict[str, Any]:
    fields = {}
    for key, value in vars(exc).items():
        if key.startswith("_") or key in _OWN_FIELDS:
            continue
        if value is None or isinstance(value, (str, int, float, bool)):
            fields[key] = value
        else:
            fields[key] = str(value)
    return fields


def _code(name: str) -> str:
    """``UnknownBudgetError`` -> ``unknown_budget``: OpenAI's codes are snake case."""
    stem = name.removesuffix("Error")
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in stem).lstrip("_")


class ErrorMappingRoute(APIRoute):
    """A route whose governor and backend errors answer as ``error_response`` says."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handler = super().get_route_handler()

        async def mapped(request: Request) -> Response:
            try:
                return await handler(request)
            except GovernorError as exc:
                response = error_response(exc)
                response.headers[INSTANCE_HEADER] = request.app.state.kvgov.instance_id
                return response

        return mapped
