"""Every error of ``kvgov serve`` as OpenAI's error body, and the status code it gets.

    {"error": {"message", "type", "param", "code", "kvgov"?}}

``kvgov`` (``backends.remote.wire.ErrorDetail``) is added for the engine's and the
governor's own errors: the error's class name, its fields (``needed``, ``available``,
``name``...) and whether a retry may succeed, so ``RemoteBackend`` raises the same typed
error a ``LocalBackend`` would.

=========================================== ====== ===================================
cause                                       status code
=========================================== ====== ===================================
malformed JSON, wrong type, unknown field   400    invalid_json, invalid_type, ...
prompt longer than the model's context      400    context_length_exceeded (+ header
                                                   ``x-should-retry: false``)
other engine ``InvalidRequestError``,       400    the class in snake case
``CapacityError``, ``ConfigError``
a budget name with ``/``, control or bidi   400    invalid_budget_name
characters, or spaces at its ends
missing or wrong API key                    401    invalid_api_key
without keys: a foreign ``Host``, a         403    host_not_allowed, cross_site_request
cross-site ``Origin``/``Sec-Fetch-Site``
a non-admin key pinning shared, or past     403    shared_pin_forbidden,
its share of the pool                              pin_share_exceeded
unknown model, budget, prefix, route        404    model_not_found, ...
a head or body slower than its timeout      408    request_timeout (``connection``)
duplicate budget, budget in use             409    duplicate_budget, budget_in_use
body over ``max_body_bytes``                413    request_too_large
waiting queue over ``max_waiting_requests`` 429    queue_full (+ ``Retry-After``; a key
                                                   under its share goes ahead)
a head over ``max_head_bytes``              431    request_header_too_large
                                                   (``connection``)
a bug                                       500    internal_error
backend closed, engine thread gone          503    engine_unavailable
more than ``max_connections`` open          503    uvicorn's plain-text answer
=========================================== ====== ===================================
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from governor.errors import BackendError, ConfigError, GovernorError

__all__ = [
    "MODEL_ROUTES",
    "ApiError",
    "ErrorHandler",
    "error_body",
    "from_exception",
    "handler_for",
    "install_error_handlers",
    "on_bug",
]

_log = logging.getLogger("kvgov.serve")
MODEL_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions"})

_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}
# The engine's errors by status; a class not listed takes the first listed base.
_ENGINE_STATUS = {
    "UnknownBudgetError": 404,
    "UnknownPinError": 404,
    "UnknownPrefixError": 404,  # the control plane's: no such pin for this tenant
    "PinShareExceededError": 403,  # the control plane's: a key's pins past its share
    "UnknownSequenceError": 404,
    "DuplicateBudgetError": 409,
    "DuplicateSequenceError": 409,
    "BudgetInUseError": 409,
    "InvalidRequestError": 400,
    "CapacityError": 400,
    "ModelError": 500,
    "EngineError": 400,
}


class ApiError(Exception):
    """An error a route answers with, in OpenAI's shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
        kvgov: dict[str, Any] | None = None,
    ) -> None:
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = dict(headers or {})
        self.kvgov = kvgov
        super().__init__(message)

    def body(self) -> dict[str, Any]:
        body = error_body(self.status, self.message, code=self.code, param=self.param)
        if self.kvgov is not None:
            body["error"]["kvgov"] = self.kvgov
        return body

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(
    status: int, message: str, *, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    kind = _TYPES.get(status, "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def from_exception(exc: BaseException, *, tenant: str = "") -> ApiError:
    """The answer for an error the engine, the backend or the governor raised."""
    if isinstance(exc, ApiError):
        return exc
    message = str(exc)
    fields = _fields(exc, tenant)
    if tenant:  # a tenant's budget names are scoped inside the server; it sees its own
        message = message.replace(f"'{tenant}/", "'")
    name = type(exc).__name__
    status = _status_of(exc)
    retriable = status == 503
    detail = {"error_class": name, "fields": fields, "retriable": retriable}
    headers = {"x-should-retry": "true" if retriable else "false"}
    return ApiError(status, message, code=_snake(name), headers=headers, kvgov=detail)


def _status_of(exc: BaseException) -> int:
    # By the nearest class with a status of its own: LocalBackend raises an engine error
    # as a class derived from the engine's and from BackendError, engine's first.
    for cls in type(exc).__mro__:
        if cls.__name__ in _ENGINE_STATUS:
            return _ENGINE_STATUS[cls.__name__]
    if isinstance(exc, ConfigError):
        return 400
    if isinstance(exc, BackendError):  # the backend itself failed: closed, thread gone
        return 503
    if isinstance(exc, GovernorError):
        return 400
    return 500


def _fields(exc: BaseException, tenant: str) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for key, value in vars(exc).items():
        if key.startswith("_") or key in ("problem", "backend"):
            continue
        if isinstance(value, tuple):
            value = list(value)
        if isinstance(value, (str, int, float, bool, type(None), list)):
            fields[key] = value
    name = fields.get("name")
    if tenant and isinstance(name, str) and name.startswith(f"{tenant}/"):
        fields["name"] = name[len(tenant) + 1 :]
    return fields


def _snake(name: str) -> str:
    name = name.removesuffix("Error")
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _param_of(error: Mapping[str, Any]) -> str | None:
    """``("body", "messages", 0, "content")`` as ``messages[0].content``; the tags
    pydantic adds for union members (``str``, ``list[int]``) are left out."""
    ctx = error.get("ctx") or {}
    if "param" in ctx:
        return str(ctx["param"])
    path = ""
    for part in tuple(error.get("loc", ()))[1:]:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part.isidentifier() and part not in ("str", "int", "float", "bool", "list"):
            path += f".{part}" if path else part
    return path or None


def validation_error(exc: RequestValidationError) -> ApiError:
    error = exc.errors()[0]
    kind = error.get("type", "")
    param = _param_of(error)
    ctx = error.get("ctx") or {}
    if kind == "json_invalid":
        return ApiError(
            400,
            f"the body is not valid JSON ({ctx.get('error', 'cannot parse')}); send one JSON "
            "object with Content-Type: application/json",
            code="invalid_json",
        )
    if kind == "extra_forbidden":
        return ApiError(
            400,
            f"Unrecognized request argument supplied: {param}",
            code="unknown_parameter",
            param=param,
        )
    if kind in ("invalid", "unsupported"):
        return ApiError(400, str(ctx.get("message", error["msg"])), code=kind, param=param)
    if kind in ("model_attributes_type", "model_type") and param is None:
        return ApiError(
            400,
            "the body must be one JSON object, sent with Content-Type: application/json",
            code="invalid_body",
        )
    if kind == "missing" and param is None:
        return ApiError(400, "the body is missing; send one JSON object", code="missing_body")
    where = param or "the body"
    return ApiError(400, f"{where}: {error['msg']}", code=f"invalid_{kind}"[:64], param=param)


ErrorHandler = Callable[[Request, Exception], Awaitable[Response]]


async def _on_api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return exc.response()


async def _on_validation(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    error = validation_error(exc)
    if request.url.path in MODEL_ROUTES:  # the live page shows refused model calls
        request.app.state.kvgov.events.record(
            "request.refused",
            id=None,
            tenant=str(getattr(request.state, "kvgov_tenant", "") or ""),
            budget=None,
            status=error.status,
            code=error.code,
        )
    return error.response()


async def _on_http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"no route {request.method} {request.url.path}"
    else:
        message = str(exc.detail)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return ApiError(exc.status_code, message, code=code, headers=exc.headers).response()


async def _on_governed(request: Request, exc: Exception) -> Response:
    tenant = str(getattr(request.state, "kvgov_tenant", "") or "")
    return from_exception(exc, tenant=tenant).response()


async def on_bug(request: Request, exc: Exception) -> Response:
    """A bug's 500 (the traceback goes to the log)."""
    _log.exception("kvgov serve: %s %s failed", request.method, request.url.path)
    message = f"internal error ({type(exc).__name__}); the server log has the traceback"
    return ApiError(500, message, code="internal_error").response()


@functools.cache
def _handlers() -> dict[type[Exception], ErrorHandler]:
    """The handler of each error class a route may raise; a bug (any other
    ``Exception``) is answered by ``on_bug``."""
    from engine.errors import EngineError

    return {
        ApiError: _on_api_error,
        RequestValidationError: _on_validation,
        HTTPException: _on_http,
        EngineError: _on_governed,
        GovernorError: _on_governed,
    }


def install_error_handlers(app: FastAPI) -> None:
    for kind, handler in _handlers().items():
        app.add_exception_handler(kind, handler)
    app.add_exception_handler(Exception, on_bug)


def handler_for(exc: BaseException) -> ErrorHandler | None:
    """The handler the routes answer ``exc`` with: that of the nearest class in its MRO,
    as Starlette looks it up; None for a bug (``on_bug``'s 500, which Starlette's
    outermost layer sends before it raises the error on to the server). The generation
    routes' direct path (``kvgov.serve.gateway``) answers its errors through this, so
    both paths answer alike."""
    handlers = _handlers()
    for kind in type(exc).__mro__:
        handler = handlers.get(kind)
        if handler is not None:
            return handler
    return None
