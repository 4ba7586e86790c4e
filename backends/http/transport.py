"""``Transport``: ``RemoteBackend``'s HTTP to ``kvgov serve``, sync and async, pooled.

One ``httpx.Client`` for threads and one ``httpx.AsyncClient`` per event loop (an async
client's connections belong to the loop that opened them). A loop's client is closed
when the loop shuts its async generators down (``asyncio.run`` does, last thing), through
an async generator registered with the loop for that purpose, so no socket outlives its
loop unclosed; ``aclose()`` closes the current loop's at once.

Retries, with exponential backoff, only where a retry cannot do a thing twice: an
idempotent request (GET) on a transport error or a 502/503/504, and any request whose
connection failed before it was sent (``httpx.ConnectError``, ``ConnectTimeout``). Every
other failure is raised at once: transport errors and 5xx as ``BackendUnavailable``,
4xx as the typed error of the body (``backends.http.errors``).

``on_instance(instance_id)`` sees the ``instance_header`` of every answer that has it
(``kvgov serve``'s ``x-kvgov-instance``), so the backend notices a restart without asking.

What the server answers is bounded (``AnswerLimits``, through whichever transport reads
it): a head, a whole body (64 MiB by default, ``max_body_bytes``), a streamed line (8 MiB,
``max_line_bytes``); past one, the call raises ``BackendUnavailable`` and is not retried
(the same server would answer the same). A body that is not JSON and a line that is not
UTF-8 raise ``BackendUnavailable`` too, never a bare decoding error. Header values we
send (the API key) may not hold CR, LF or NUL: ``ConfigError`` when the transport is made.

Each path's absolute URL is merged with the base URL once (by httpx itself) and kept: httpx
parses and merges a relative path on every request, a twentieth of a served call's
client CPU. To a plain-HTTP server with no proxy from the environment in the way, the
requests go over kvgov's own HTTP/1.1 transports (``backends.http._http11``), handed to
them directly: httpcore and h11 per read, and the client's cookie jar, auth and redirect
layers per request, were over half of a served call's client CPU and most of a streamed
token's. A sync call is written as bytes, from a head httpx builds once per method and
path, and its answer read whole (``Http11Transport.exchange``): no httpx request, stream
or hold per call, 0.08 ms less client CPU a served call. Elsewhere (https, a proxy, a
transport passed in) httpx's client sends them.
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from json import dumps
from typing import Any, TypeVar

import httpx
from typing_extensions import Self

from backends.http._http11 import (
    AnswerLimits,
    AnswerRefused,
    Reply,
    refused_body,
    sized,
    unsized_head,
)
from backends.http._http11_async import AsyncHttp11Transport
from backends.http._http11_sync import Http11Transport
from backends.http.errors import error_from_response
from governor import BackendUnavailable, ConfigError

R = TypeVar("R", bound="httpx.Response | Reply")

__all__ = ["HttpLifecycle", "Retries", "Transport"]
_RETRY_STATUS = (502, 503, 504)
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout)
_KEPT_URLS = 256  # paths with a name in them (budgets, prefixes) are many; keep the first


@dataclass(frozen=True, slots=True, kw_only=True)
class Retries:
    attempts: int = 3  # tries in all, the first included
    backoff_s: float = 0.05  # before the second try; doubled before each next one
    max_backoff_s: float = 1.0

    def delay(self, attempt: int) -> float:
        return min(self.backoff_s * 2 ** (attempt - 1), self.max_backoff_s)


class Transport:
    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None,
        timeout: httpx.Timeout,
        retries: Retries,
        limits: httpx.Limits,
        name: str,
        on_instance: Callable[[str], None] = lambda instance: None,
        instance_header: str | None = None,
        transport: httpx.BaseTransport | None = None,
        async_transport: httpx.AsyncBaseTransport | None = None,
        answer_limits: AnswerLimits | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.name = name
        self.retries = retries
        self.on_instance = on_instance
        self._instance_header = instance_header
        self.answer_limits = answer_limits or AnswerLimits()
        if api_key and any(char in api_key for char in "\r\n\0"):
            raise ConfigError(
                "api_key holds CR, LF or NUL, which would end the request's head early and "
                "write a request of its own: pass the key alone, without line breaks",
                setting="api_key",
            )
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._options: dict[str, Any] = {
            "base_url": self.base_url,
            "headers": headers,
            "timeout": timeout,
            "limits": limits,
            # Built once, here: each client would otherwise load the CA bundle itself, and
            # an event loop's client is made on that loop (60-120 ms it would stall for).
            "verify": httpx.create_ssl_context(),
        }
        self._async_transport = async_transport
        self._headers = headers
        self._timeouts = timeout.as_dict()
        # Plain HTTP with no proxy in the way: kvgov's own HTTP/1.1 transport (module
        # docstring), sent to directly; otherwise httpx's, through its client.
        self._lean = self.base_url.startswith("http://") and not _proxied(self.base_url)
        self._direct: Http11Transport | None = None
        if transport is None and self._lean:
            transport = self._direct = Http11Transport(limits, answer_limits=self.answer_limits)
        self._client = httpx.Client(transport=transport, **self._options)
        self._urls: dict[str, httpx.URL] = {}
        self._heads: dict[tuple[str, str, bool], bytes] = {}
        self._lock = threading.Lock()
        self._aclients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopClient] = (
            weakref.WeakKeyDictionary()
        )

    # -- sync -----------------------------------------------------------------------------
    def request(
        self, method: str, path: str, *, json: Any = None, idempotent: bool | None = None
    ) -> httpx.Response | Reply:
        idempotent = method == "GET" if idempotent is None else idempotent
        attempt = 1
        while True:
            try:
                response = self._send(method, path, json)
            except httpx.TransportError as exc:
                if self._retry(exc, None, idempotent, attempt):
                    time.sleep(self.retries.delay(attempt))
                    attempt += 1
                    continue
                raise self.unavailable(exc) from exc
            if self._retry(None, response.status_code, idempotent, attempt):
                time.sleep(self.retries.delay(attempt))
                attempt += 1
                continue
            return self.checked(response)

    def _send(self, method: str, path: str, json: Any) -> httpx.Response | Reply:
        if self._direct is None:
            with self._client.stream(method, self.url(path), json=json) as response:
                return self._whole(response, response.iter_bytes())
        written = self._written(method, path, json)
        return self._direct.exchange(method, self.url(path), written, self._timeouts)

    def _whole(self, response: httpx.Response, parts: Iterable[bytes]) -> Reply:
        """The answer read whole through httpx's client, bounded as kvgov's transports
        bound it."""
        return Reply(response.status_code, response.headers.raw, self._bounded(parts))

    def _bounded(self, parts: Iterable[bytes]) -> bytes:
        kept: list[bytes] = []
        num_bytes = 0
        for part in parts:
            num_bytes += len(part)
            if num_bytes > self.answer_limits.max_body_bytes:
                raise refused_body(self.answer_limits.max_body_bytes, num_bytes)
            kept.append(part)
        return b"".join(kept)

    def _written(self, method: str, path: str, json: Any) -> bytes:
        """The request ``_request`` makes, as the transport writes it: its head less the
        body's length is built by httpx once per method and path (``_request``), then
        each call adds its body and length. httpx's JSON: compact, UTF-8, no NaN."""
        key = (method, path, json is not None)
        unsized = self._heads.get(key)
        if unsized is None:
            unsized = unsized_head(self._request(method, path, None if json is None else {}))
            if len(self._heads) < _KEPT_URLS:
                self._heads[key] = unsized
        body = b""
        if json is not None:
            body = dumps(json, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        return sized(unsized, method, len(body)) + body

    def _request(self, method: str, path: str, json: Any) -> httpx.Request:
        """The request as the client would build it, less what kvgov serve never uses:
        cookies (httpx parses each answer's through urllib's cookie jar), auth flows,
        redirects and event hooks; a tenth of a served call's client CPU."""
        return httpx.Request(
            method,
            self.url(path),
            json=json,
            headers=self._headers,
            extensions={"timeout": self._timeouts},
        )

    # -- async ----------------------------------------------------------------------------
    async def arequest(
        self, method: str, path: str, *, json: Any = None, idempotent: bool | None = None
    ) -> httpx.Response | Reply:
        idempotent = method == "GET" if idempotent is None else idempotent
        entry = self._aclient()
        attempt = 1
        while True:
            try:
                response = await self._asend(entry, method, path, json)
            except httpx.TransportError as exc:
                if self._retry(exc, None, idempotent, attempt):
                    await asyncio.sleep(self.retries.delay(attempt))
                    attempt += 1
                    continue
                raise self.unavailable(exc) from exc
            if self._retry(None, response.status_code, idempotent, attempt):
                await asyncio.sleep(self.retries.delay(attempt))
                attempt += 1
                continue
            return self.checked(response)

    @asynccontextmanager
    async def astream(self, path: str, *, json: Any) -> AsyncIterator[AsyncIterator[str]]:
        """POST ``json`` and yield the answer's lines. Only connecting is retried (and
        only as ``request`` retries a POST): once sent, a stream is never sent again."""
        entry = self._aclient()
        request = self._request("POST", path, json)
        attempt = 1
        while True:
            try:
                if entry.direct is None:
                    response = await entry.client.send(request, stream=True)
                else:
                    response = await entry.direct.handle_async_request(request)
                    response.request = request
                break
            except httpx.TransportError as exc:
                if self._retry(exc, None, False, attempt):
                    await asyncio.sleep(self.retries.delay(attempt))
                    attempt += 1
                    continue
                raise self.unavailable(exc) from exc
        try:
            if response.status_code >= 400:
                try:
                    parts = [part async for part in _abounded(response, self.answer_limits)]
                except httpx.TransportError as exc:
                    raise self.unavailable(exc) from exc
                self.checked(Reply(response.status_code, response.headers.raw, b"".join(parts)))
            self.checked(response)
            yield _lines(response, self)
        finally:
            await response.aclose()  # a consumer that stopped early: the server aborts

    async def _asend(self, entry: _LoopClient, method: str, path: str, json: Any) -> Reply:
        if entry.direct is None:
            request = entry.client.build_request(method, self.url(path), json=json)
            response = await entry.client.send(request, stream=True)
            try:
                parts = [part async for part in _abounded(response, self.answer_limits)]
            finally:
                await response.aclose()
            return Reply(response.status_code, response.headers.raw, b"".join(parts))
        written = self._written(method, path, json)
        return await entry.direct.exchange(method, self.url(path), written, self._timeouts)

    # -- both -----------------------------------------------------------------------------
    def url(self, path: str) -> httpx.URL:
        """``path``'s absolute URL, as httpx merges it with the base URL, merged once."""
        url = self._urls.get(path)
        if url is None:
            url = self._client.build_request("GET", path).url
            if len(self._urls) < _KEPT_URLS:
                self._urls[path] = url
        return url

    def checked(self, response: R) -> R:
        """The response, or its typed error."""
        if isinstance(response, Reply):
            response.backend = self.name  # a body that is not JSON names this backend
        self._observe(response)
        if response.status_code < 400:
            return response
        headers = {k.lower(): v for k, v in response.headers.items()}
        raise error_from_response(
            response.status_code, response.content, backend=self.name, headers=headers
        )

    def unavailable(self, exc: BaseException) -> BackendUnavailable:
        return BackendUnavailable(
            f"{type(exc).__name__} talking to {self.base_url}: {exc}", backend=self.name
        )

    def close(self) -> None:
        self._client.close()

    async def aclose(self) -> None:
        """Close the current event loop's client now (it is closed at loop shutdown anyway)."""
        with self._lock:
            entry = self._aclients.pop(asyncio.get_running_loop(), None)
        if entry is not None:
            await entry.client.aclose()

    def _observe(self, response: httpx.Response | Reply) -> None:
        header = self._instance_header
        if header is None:
            return
        if type(response) is Reply:  # one header read, no ``headers`` built
            instance = response.header(header)
        else:
            instance = response.headers.get(header)
        if instance:
            self.on_instance(instance)

    def _retry(
        self, exc: BaseException | None, status: int | None, idempotent: bool, attempt: int
    ) -> bool:
        if attempt >= self.retries.attempts or isinstance(exc, AnswerRefused):
            return False  # tried enough, or an answer the same server would give again
        if exc is not None:
            return idempotent or isinstance(exc, _NOT_SENT)
        return idempotent and status in _RETRY_STATUS

    def _aclient(self) -> _LoopClient:
        loop = asyncio.get_running_loop()
        with self._lock:
            entry = self._aclients.get(loop)
            if entry is None:
                transport = self._async_transport
                direct = None
                if transport is None and self._lean:
                    transport = direct = AsyncHttp11Transport(
                        self._options["limits"], answer_limits=self.answer_limits
                    )
                client = httpx.AsyncClient(transport=transport, **self._options)
                entry = self._aclients[loop] = _LoopClient(client, direct)
                entry.start()
        return entry


class HttpLifecycle:
    """What every backend over a ``Transport`` does to start and end: its address, closing
    the connections (the server, and what this client set up there, stay), and the
    ``with`` block. The class mixing it in sets ``_transport`` and ``_closed``."""

    _transport: Transport
    _closed: bool

    @property
    def base_url(self) -> str:
        return self._transport.base_url

    def close(self) -> None:
        self._closed = True
        self._transport.close()

    async def aclose(self) -> None:
        self.close()
        await self._transport.aclose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _LoopClient:
    """An event loop's async client, closed when the loop shuts down its async
    generators: the loop tracks ``_closer`` from its first step and calls its
    ``aclose`` then, which runs the ``finally``."""

    __slots__ = ("_closer", "client", "direct")

    def __init__(self, client: httpx.AsyncClient, direct: AsyncHttp11Transport | None) -> None:
        self.client = client
        self.direct = direct  # the client's transport, sent to directly (Transport._request)
        self._closer = self._close_at_shutdown()

    def start(self) -> None:
        # The first step registers the generator with the running loop (its first-iter
        # hook) and stops at the ``yield``, which ends the step with StopIteration.
        step = self._closer.asend(None).__await__()
        with suppress(StopIteration):
            next(step)

    async def _close_at_shutdown(self) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            await self.client.aclose()


def _proxied(url: str) -> bool:
    """Whether the environment names a proxy for ``url`` (``HTTP_PROXY``/``ALL_PROXY`` and
    no ``NO_PROXY`` match): httpx's client then sends through it, as it always has."""
    proxies = urllib.request.getproxies()
    if not (proxies.get("http") or proxies.get("all")):
        return False
    return not urllib.request.proxy_bypass(httpx.URL(url).host)


async def _abounded(response: httpx.Response, limits: AnswerLimits) -> AsyncIterator[bytes]:
    """The body's parts as httpx decodes them, until they pass ``max_body_bytes``."""
    num_bytes = 0
    async for part in response.aiter_bytes():
        num_bytes += len(part)
        if num_bytes > limits.max_body_bytes:
            raise refused_body(limits.max_body_bytes, num_bytes)
        yield part


async def _lines(response: httpx.Response, transport: Transport) -> AsyncIterator[str]:
    """The answer's lines, split from its bytes: a stream of server-sent events is a read
    per event, and httpx's text and line layers (more async generators, each chunk
    decoded to text first) cost the client ~15% more CPU per streamed token. Lines end
    in LF or CRLF (the SSE framing servers use); UTF-8 split at LF decodes whole.

    A line's pieces are kept in a list and joined once it ends, so a line that comes in
    many reads costs linear time; one past ``max_line_bytes``, or one that is not UTF-8,
    raises ``BackendUnavailable``."""
    max_bytes = transport.answer_limits.max_line_bytes
    pending: list[bytes] = []  # the pieces of the line not yet ended
    num_pending = 0
    try:
        async for chunk in response.aiter_bytes():  # content-decoded, unlike aiter_raw
            if b"\n" not in chunk:
                pending.append(chunk)
                num_pending += len(chunk)
                if num_pending > max_bytes:
                    raise _line_too_long(transport, max_bytes, num_pending)
                continue
            first, *lines, rest = chunk.split(b"\n")
            pending.append(first)
            for line in (b"".join(pending), *lines):
                if len(line) > max_bytes:
                    raise _line_too_long(transport, max_bytes, len(line))
                yield _text(line.removesuffix(b"\r"), transport)
            pending, num_pending = [rest], len(rest)
            if num_pending > max_bytes:
                raise _line_too_long(transport, max_bytes, num_pending)
        if num_pending:
            yield _text(b"".join(pending).removesuffix(b"\r"), transport)
    except httpx.TransportError as exc:
        raise transport.unavailable(exc) from exc


def _text(line: bytes, transport: Transport) -> str:
    try:
        return line.decode()
    except UnicodeDecodeError as exc:
        raise BackendUnavailable(
            f"a streamed line from {transport.base_url} is not UTF-8 ({exc}): {line[:200]!r}",
            backend=transport.name,
        ) from None


def _line_too_long(transport: Transport, max_bytes: int, num_bytes: int) -> BackendUnavailable:
    return BackendUnavailable(
        f"a streamed line from {transport.base_url} ran past {max_bytes} bytes ({num_bytes} "
        "read) without ending; it is not read further (AnswerLimits.max_line_bytes)",
        backend=transport.name,
    )
