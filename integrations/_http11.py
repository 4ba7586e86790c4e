"""kvgov's HTTP/1.1 transports for httpx, to plain-HTTP servers: what both share.

An answer streamed as server-sent events is one read per event. Through httpx's default
transport each read goes through httpcore, anyio (a timeout scope, a selector
registration and removal) and h11's pure-Python parser: about 0.15 ms of client CPU per
streamed token on the 2-core development machine, more than the server spends on it, and
a non-streamed call about 0.3 ms more than here. In these transports llhttp
(``httptools``, uvicorn's own parser) splits the bytes into the status line, headers and
body chunks (``Answer``); ``integrations._http11_async`` reads them as an
``asyncio.Protocol`` (the event loop hands it bytes as they arrive, a reader waits on one
future per read), ``integrations._http11_sync`` from a blocking socket. What httpx does
above a transport (the client, its ``Request`` and ``Response``, content decoding,
timeouts and limits as configured) is unchanged.

Scope: ``http://`` only (``Transport`` keeps httpx's own transport for ``https://``, and
httpx's proxy mounts take precedence as they do over any transport), HTTP/1.1 with
keep-alive, one request at a time per connection, ``Content-Length``, chunked or
until-close bodies. Errors are httpx's: ``ConnectError``/``ConnectTimeout`` before the
request is written (a retry cannot do it twice), ``ReadTimeout``, ``WriteTimeout``,
``PoolTimeout``, ``RemoteProtocolError`` for a malformed answer or a connection closed
mid-answer. A connection goes back to the pool only when its answer was read whole and
the server keeps it alive; an answer closed early (a consumer that stopped reading, a
cancelled task) closes its connection, so the server sees the client leave.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any, Protocol

import httptools
import httpx
from pydantic_core import from_json

__all__ = ["Answer", "Hold", "PoolLimits", "Reply", "head", "key_of", "sized", "unsized_head"]


@dataclass(frozen=True, slots=True)
class PoolLimits:
    """httpx's ``Limits``, as the transports read them."""

    max_connections: int | None
    max_keepalive: int | None
    keepalive_expiry: float | None

    @classmethod
    def of(cls, limits: httpx.Limits | None) -> PoolLimits:
        limits = limits or httpx.Limits()
        return cls(
            limits.max_connections, limits.max_keepalive_connections, limits.keepalive_expiry
        )


class _Pool(Protocol):
    """What a ``Hold`` hands its connection back to: either transport's pool."""

    def _checkin(self, key: tuple[str, int], connection: Any) -> None:
        """Keep the connection for the next request, or close it."""

    def _discard(self, connection: Any) -> None:
        """Close the connection and free its slot."""


class Answer:
    """llhttp's callbacks and what they gather: one answer at a time per connection."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.keep_alive = False
        self.idle_since = 0.0
        self._headers_done = False
        self._complete = False
        self._error: BaseException | None = None
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0

    def _next_answer(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status, self.reason, self.headers = 0, b"", []
        self._headers_done = self._complete = self.keep_alive = False
        self._chunks.clear()
        self._buffered = 0

    def _feed(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise httpx.RemoteProtocolError(f"a malformed answer: {exc}") from None

    def _ended(self) -> None:
        """The connection is gone: an answer with no length ends with it, any other
        that is not whole is cut."""
        if self._headers_done and not self._complete and self._until_close():
            self._complete = True
        elif not self._complete and self._error is None:
            self._error = httpx.RemoteProtocolError("the server closed the connection mid-answer")

    def _headers_read(self, method: str) -> None:
        if method == "HEAD":  # its answer has headers only, whatever they say
            self._complete = True
            self.keep_alive = self.parser.should_keep_alive()

    def _take(self) -> bytes:
        chunk = self._chunks.popleft()
        while self._chunks:  # what arrived together is read together
            chunk += self._chunks.popleft()
        self._buffered = 0
        return chunk

    def response(self, stream: httpx.SyncByteStream | httpx.AsyncByteStream) -> httpx.Response:
        """The answer's head as httpx's response, its body read through ``stream``."""
        return httpx.Response(
            self.status,
            headers=self.headers,
            stream=stream,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": self.reason},
        )

    def whole_response(self, content: bytes) -> httpx.Response | Reply:
        """The answer's head and its whole body: a ``Reply``, or httpx's response where
        the body is encoded (``Content-Encoding``: httpx decodes it as it would have)."""
        for name, value in self.headers:
            if name.lower() == b"content-encoding" and value.strip().lower() != b"identity":
                return httpx.Response(
                    self.status,
                    headers=self.headers,
                    content=content,
                    extensions={"http_version": b"HTTP/1.1", "reason_phrase": self.reason},
                )
        return Reply(self.status, self.headers, content)

    @property
    def whole(self) -> bool:
        """The answer was read to its end, without error: the connection may be reused."""
        return self._complete and self._error is None

    def _until_close(self) -> bool:
        names = {name.lower() for name, _ in self.headers}
        return b"content-length" not in names and b"transfer-encoding" not in names

    # -- llhttp's callbacks ---------------------------------------------------------------
    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)

    def on_message_complete(self) -> None:
        self._complete = True
        self.keep_alive = self.parser.should_keep_alive()


class Hold:
    """An answer's hold on its connection: ended once, it returns the connection to the
    pool when the answer was read whole, and closes it otherwise."""

    def __init__(
        self,
        pool: _Pool,
        connection: Answer,
        key: tuple[str, int],
        timeout: float | None,
        request: httpx.Request,
    ) -> None:
        self._pool = pool
        self._connection: Any = connection
        self._key = key
        self._timeout = timeout
        self._request = request

    def _end(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if connection.whole:
            self._pool._checkin(self._key, connection)
        else:
            self._pool._discard(connection)


def key_of(url: httpx.URL, closed: bool, request: httpx.Request | None) -> tuple[str, int]:
    """The pool's key for ``url``'s server; ``UnsupportedProtocol`` beyond plain HTTP."""
    if url.scheme != "http":
        raise httpx.UnsupportedProtocol(
            f"kvgov's HTTP/1.1 transport speaks plain HTTP only, not {url.scheme!r}; "
            "use httpx's own transport for it"
        )
    if closed:
        raise httpx.ConnectError("the transport is closed", request=request)
    return url.host, url.port or 80


def head(request: httpx.Request, length: int) -> bytes:
    """The request line and headers, as httpx built them (Host, Content-Length...)."""
    return sized(unsized_head(request), request.method, length)


def unsized_head(request: httpx.Request) -> bytes:
    """The request line and headers less the body's length (and any transfer encoding:
    the body is sent whole, with its length): what every request with this method, URL
    and headers begins with, whatever its body."""
    lines = [request.method.encode("ascii") + b" " + request.url.raw_path + b" HTTP/1.1"]
    for name, value in request.headers.raw:
        if name.lower() not in (b"transfer-encoding", b"content-length"):
            lines.append(name + b": " + value)
    return b"\r\n".join(lines) + b"\r\n"


def sized(unsized: bytes, method: str, length: int) -> bytes:
    """A head from ``unsized_head`` with the body's length, as httpx sets it (none for a
    GET, HEAD or DELETE without a body), and the blank line that ends it."""
    if length or method not in ("GET", "HEAD", "DELETE"):
        return unsized + b"Content-Length: %d\r\n\r\n" % length
    return unsized + b"\r\n"


class Reply:
    """A whole answer, as a call that is not streamed reads it: what it uses of httpx's
    ``Response`` (``status_code``, ``content``, ``text``, ``json()``, ``headers``), less
    what building one costs (its byte stream read back in, its headers parsed up front;
    about a quarter of such a call's client CPU). ``header(name)`` reads one header without building
    ``headers``, which only an error's path needs."""

    __slots__ = ("_headers", "_raw", "content", "status_code")

    def __init__(self, status_code: int, raw: list[tuple[bytes, bytes]], content: bytes) -> None:
        self.status_code = status_code
        self.content = content
        self._raw = raw
        self._headers: httpx.Headers | None = None

    @property
    def headers(self) -> httpx.Headers:
        if self._headers is None:
            self._headers = httpx.Headers(self._raw)
        return self._headers

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), as ``headers.get`` would give it."""
        wanted = name.lower().encode("latin-1")
        for key, value in self._raw:
            if key.lower() == wanted:
                return value.decode("latin-1")
        return None

    def json(self) -> Any:
        """The body as JSON (pydantic-core's parser: the values ``json.loads`` gives)."""
        return from_json(self.content)

    @property
    def text(self) -> str:
        """The body as text, as httpx decodes it: in the charset ``Content-Type`` names,
        else UTF-8, undecodable bytes replaced."""
        charset = "utf-8"
        for param in (self.header("content-type") or "").split(";")[1:]:
            name, _, value = param.strip().partition("=")
            if name.strip().lower() == "charset" and value.strip(" '\""):
                charset = value.strip(" '\"")
        try:
            return self.content.decode(charset, errors="replace")
        except LookupError:  # a charset Python does not know
            return self.content.decode("utf-8", errors="replace")
