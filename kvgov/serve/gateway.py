"""``Gateway``: the one ASGI layer every HTTP request to ``kvgov serve`` passes before
its route, and the generation routes' direct path.

In order, for every request:

- the answer names the server's instance (``x-kvgov-instance``), on every route, errors
  and refusals included: a client that sees it change knows the server restarted and
  its budgets, pins and holds are gone (``RemoteBackend`` sets them up again), whichever
  call comes first;
- the bearer key is checked (``security.ApiKeys``; 401 without a valid one, except on
  ``security.OPEN_PATHS``) and the request's tenant put on ``request.state.kvgov_tenant``
  ("" without keys); without keys, a request must name this server in ``Host`` and not
  come from another site (``security.SameOrigin``; 403: DNS rebinding, cross-site posts);
- a body whose ``Content-Length`` is over ``max_body_bytes`` is refused before anything
  is read (413), and every body's bytes are counted as they arrive (chunked ones too):
  the first byte over the limit ends the request with 413, whatever the route was doing
  with the body;
- ``POST`` to a path in ``direct`` (the two generation routes,
  ``openai_api.MODEL_ENDPOINTS``) runs that endpoint here, the same function FastAPI's
  router would run, its errors answered by the handlers the router uses
  (``errors.handler_for``) and a bug by the 500 Starlette's outermost layer would send;
  every other request goes on to FastAPI (``app.ServeApp``), whose own layers (its
  error middleware, its telemetry, routing) see only what this layer hands on;
- once the answer is sent, its access line goes to the ``kvgov.access`` logger, in
  uvicorn's words (``127.0.0.1:52358 - "POST /v1/chat/completions HTTP/1.1" 200``).
  ``kvgov serve`` writes it as uvicorn writes its own (``kvgov.cli.serve.uvicorn_config``,
  uvicorn's access log off). uvicorn writes its line as the response starts, between
  the request and its answer's head: 0.23 ms of the event loop's time per call in
  place, measured between the two on the 2-core development host (2026-12-02). Written
  after the answer, it costs the same CPU and no caller waits for it; a streamed answer
  is logged as it ends, and a request whose route raised before answering as the 500
  uvicorn then sends.

Why one layer in front and a direct path: a served call costs the event loop's thread
about 1.2-1.4 ms of CPU on the 2-core development host, where that thread, the engine's
and the client compete for the same cores, and Python that runs once per call runs from
cold caches (the engine's steps in between evict them): measured in place, the app's
code costs 3-4 times what it costs in a hot loop. Before this layer, a generation call
passed FastAPI's outer layers (a telemetry check that reads the environment on every
request among them), three middlewares that each wrapped ``send`` (one ``receive`` too)
in closures of their own, FastAPI's exception layer, exit stack and route matching
(every route tried in turn): a third of the app's CPU per call in a hot loop (about 150
against 100 us with a backend that answers at once), for two paths known before anything
is read. Paired on one engine, the event loop's CPU per served 16-token call fell by
0.2-0.3 ms (1.40 to 1.19 ms; 1.72 to 1.44 on a busier host). A direct call skips only
that machinery: its endpoint, body parsing, errors and response are the routed path's
own (``tests/kvgov/serve/test_gateway.py`` compares the two).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import get_route_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backends.remote.wire import INSTANCE_HEADER
from kvgov.serve.errors import handler_for, on_bug
from kvgov.serve.limits import BodyTooLarge, declared_length
from kvgov.serve.security import OPEN_PATHS, ApiKeys, SameOrigin

__all__ = ["ACCESS_LOGGER", "Endpoint", "Gateway"]

Endpoint = Callable[[Request], Awaitable[Response]]
ACCESS_LOGGER = "kvgov.access"
_access = logging.getLogger(ACCESS_LOGGER)


class Gateway:
    """``app``'s entry: ``rest`` serves what the gateway hands on (FastAPI's own layers
    and routes); ``direct`` maps a path to the endpoint served here for ``POST``."""

    def __init__(
        self,
        app: Starlette,
        rest: ASGIApp,
        *,
        instance_id: str,
        api_keys: Iterable[str],
        max_body_bytes: int,
        direct: Mapping[str, Endpoint],
    ) -> None:
        self.app = app
        self.rest = rest
        self.instance_header = (INSTANCE_HEADER.encode("latin-1"), instance_id.encode("latin-1"))
        self.keys = ApiKeys(api_keys)
        self.max_body_bytes = max_body_bytes
        self.direct = dict(direct)
        # The names the server answers to without keys: its settings, which create_app
        # puts on the app before the gateway opens.
        settings = app.state.kvgov.settings
        self.same_origin = (
            None
            if self.keys.required
            else SameOrigin(host=settings.host, allowed_hosts=settings.allowed_hosts)
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.rest(scope, receive, send)
            return
        authorization = length = None
        for name, value in scope["headers"]:  # the first of each, as a parser would take it
            if name == b"authorization":
                if authorization is None:
                    authorization = value
            elif name == b"content-length" and length is None:
                length = value
        exchange = _Exchange(receive, send, self.max_body_bytes, self.instance_header)
        try:
            await self._answer(scope, receive, exchange, authorization, length)
        finally:
            if _access.isEnabledFor(logging.INFO):
                _log_access(scope, exchange.status)

    async def _answer(
        self,
        scope: Scope,
        receive: Receive,
        exchange: _Exchange,
        authorization: bytes | None,
        length: bytes | None,
    ) -> None:
        tenant = ""
        if self.same_origin is not None:
            refusal = self.same_origin.refusal(scope)
            if refusal is not None:
                await refusal.response()(scope, receive, exchange.answer)
                return
        elif scope["path"] not in OPEN_PATHS:
            found = self.keys.tenant(authorization)
            if found is None:
                await self.keys.refusal().response()(scope, receive, exchange.answer)
                return
            tenant = found
        declared = declared_length(length)
        if declared is not None and declared > self.max_body_bytes:
            await BodyTooLarge(self.max_body_bytes).response()(scope, receive, exchange.answer)
            return
        scope.setdefault("state", {})["kvgov_tenant"] = tenant
        endpoint = self.direct.get(get_route_path(scope)) if scope["method"] == "POST" else None
        try:
            if endpoint is None:
                await self.rest(scope, exchange.receive, exchange.send)
            else:
                scope["app"] = self.app  # as Starlette sets it: ``request.app``
                await _serve(endpoint, scope, exchange.receive, exchange.send)
        except Exception:
            if not exchange.over:
                raise
        if exchange.over and not exchange.started:
            await BodyTooLarge(self.max_body_bytes).response()(scope, receive, exchange.answer)


async def _serve(endpoint: Endpoint, scope: Scope, receive: Receive, send: Send) -> None:
    """``endpoint`` as Starlette runs a route added with ``add_route``: a ``Request``, the
    endpoint's response, an error answered by the routes' handler for it, and a bug
    answered with 500 and raised on to the server (its log), as Starlette's outermost
    layer does."""
    request = Request(scope, receive, send)
    try:
        response = await endpoint(request)
    except Exception as exc:
        handler = handler_for(exc)
        if handler is None:
            await (await on_bug(request, exc))(scope, receive, send)
            raise
        response = await handler(request, exc)
    await response(scope, receive, send)


class _Exchange:
    """One request's ``receive`` and ``send`` as its route sees them: the body's bytes
    counted against the limit, nothing sent once the body ran over (the answer is 413,
    whatever the route made of the cut body), and the instance named on the answer
    (``answer``, which the gateway's own refusals go through too)."""

    __slots__ = (
        "_header",
        "_limit",
        "_receive",
        "_send",
        "over",
        "received",
        "started",
        "status",
    )

    def __init__(self, receive: Receive, send: Send, limit: int, header: tuple[bytes, bytes]):
        self._receive = receive
        self._send = send
        self._limit = limit
        self._header = header
        self.received = 0
        self.over = False
        self.started = False
        self.status = 500  # until an answer starts: what the server sends for a raise

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self._limit:
                self.over = True
                raise BodyTooLarge(self._limit)
        return message

    async def send(self, message: Message) -> None:
        if self.over:
            return
        self.started = True
        await self.answer(message)

    async def answer(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            name = self._header[0]
            headers = [item for item in message.get("headers", ()) if item[0] != name]
            headers.append(self._header)
            message["headers"] = headers
        await self._send(message)


def _log_access(scope: Scope, status: int) -> None:
    """The access line uvicorn writes (its format: ``uvicorn.logging.AccessFormatter``
    reads these five arguments), the path quoted as uvicorn quotes it."""
    client = scope.get("client")
    address = "%s:%d" % tuple(client) if client else ""  # noqa: UP031
    path = quote(scope["path"])
    if scope["query_string"]:
        path = f"{path}?{scope['query_string'].decode('ascii')}"
    _access.info(
        '%s - "%s %s HTTP/%s" %d', address, scope["method"], path, scope["http_version"], status
    )
