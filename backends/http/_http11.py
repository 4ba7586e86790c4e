"""kvgov's HTTP/1.1 transports for httpx, to plain-HTTP servers: what both share.

An answer streamed as server-sent events is one read per event. Through httpx's default
transport each read goes through httpcore, anyio (a timeout scope, a selector
registration and removal) and h11's pure-Python parser: about 0.15 ms of client CPU per
streamed token on the 2-core development machine, more than the server spends on it, and
a non-streamed call about 0.3 ms more than here. In these transports llhttp
(``httptools``, uvicorn's own parser) splits the bytes into the status line, headers and
body chunks (``Answer``); ``backends.http._http11_async`` reads them as an
``asyncio.Protocol`` (the event loop hands it bytes as they arrive, a reader waits on one
future per read), ``backends.http._http11_sync`` from a blocking socket. What httpx does
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

The server is not trusted with the client's memory (``AnswerLimits``): a head (status
line and headers) past ``max_head_bytes`` or ``max_headers``, a whole body past
``max_body_bytes`` (decoded too, where it is compressed), and any byte after a complete
answer (a second answer the client never asked for) end the answer with
``AnswerRefused``, a ``RemoteProtocolError``, and close its connection; each part is
gathered in a list and joined once, so reading stays linear in what arrived. A header
value with CR, LF or NUL is never written (``LocalProtocolError``): it would end the
head early and write a request of the server's choosing.
"""

from __future__ import annotations

import collections
import zlib
from dataclasses import dataclass
from typing import Any, Protocol

import httptools
import httpx
from pydantic_core import from_json

from governor import BackendUnavailable

__all__ = [
    "Answer",
    "AnswerLimits",
    "AnswerRefused",
    "Hold",
    "PoolLimits",
    "Reply",
    "head",
    "key_of",
    "refused_body",
    "sized",
    "unsized_head",
]

_WBITS = {b"gzip": 16 + zlib.MAX_WBITS, b"x-gzip": 16 + zlib.MAX_WBITS, b"deflate": zlib.MAX_WBITS}


@dataclass(frozen=True, slots=True, kw_only=True)
class AnswerLimits:
    """The most of the client's memory one answer may take. The defaults are far above
    what ``kvgov serve`` or an engine answers (a Hugging Face ``tokenizer.json``, the
    largest, is some MiB) and far below what would hurt the client."""

    max_head_bytes: int = 64 * 1024  # status line and headers (h11's default is 16 KiB)
    max_headers: int = 100
    max_body_bytes: int = 64 * 1024 * 1024  # a whole body; a stream is bounded per line
    max_line_bytes: int = 8 * 1024 * 1024  # one line of a streamed answer (an SSE event)

    def __post_init__(self) -> None:
        for name in ("max_head_bytes", "max_headers", "max_body_bytes", "max_line_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"AnswerLimits.{name} must be a positive int, not {value!r}")


class AnswerRefused(httpx.RemoteProtocolError):
    """The server's answer went past an ``AnswerLimits`` bound, or went on after it was
    complete: it is not read further, and its connection is closed."""


def refused_body(max_bytes: int, num_bytes: int) -> AnswerRefused:
    """The refusal of a whole body that passed ``max_bytes`` (``num_bytes`` read)."""
    return AnswerRefused(
        f"the answer's body ran past {max_bytes} bytes ({num_bytes} read); a server that "
        "sends more is not read (AnswerLimits.max_body_bytes, RemoteBackend's "
        "max_response_bytes)"
    )


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

    def __init__(self, limits: AnswerLimits) -> None:
        self.limits = limits
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.keep_alive = False
        self.idle_since = 0.0
        self._headers_done = False
        self._complete = False
        self._error: BaseException | None = None
        self._refusal: AnswerRefused | None = None  # raised by a callback, for _feed
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._num_head_bytes = 0
        self._reason_parts: list[bytes] = []

    def _next_answer(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status, self.reason, self.headers = 0, b"", []
        self._headers_done = self._complete = self.keep_alive = False
        self._chunks.clear()
        self._buffered = self._num_head_bytes = 0
        self._reason_parts = []
        self._refusal = None

    def _feed(self, data: bytes) -> None:
        if not self._headers_done:
            self._num_head_bytes += len(data)  # at most one read more than the head
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self._refusal is not None:
                raise self._refusal from None
            raise httpx.RemoteProtocolError(f"a malformed answer: {exc}") from None
        if not self._headers_done:
            if self._num_head_bytes > self.limits.max_head_bytes:
                raise AnswerRefused(
                    f"the answer's head (status line and headers) ran past "
                    f"{self.limits.max_head_bytes} bytes; a server that sends more is not "
                    "read (AnswerLimits.max_head_bytes)"
                )
            if len(self.headers) > self.limits.max_headers:
                raise AnswerRefused(self._too_many_headers())

    def _too_many_headers(self) -> str:
        return (
            f"the answer has over {self.limits.max_headers} headers; a server that sends "
            "more is not read (AnswerLimits.max_headers)"
        )

    def _refuse(self, message: str) -> None:
        """From a callback: stop the parser; ``_feed`` raises ``AnswerRefused(message)``."""
        self._refusal = AnswerRefused(message)
        raise self._refusal

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
        # What arrived together is read together, joined once (a server's one-byte chunks
        # would make a join by += quadratic in the bytes of one read).
        chunk = self._chunks.popleft() if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
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

    def whole_response(self, content: bytes) -> Reply:
        """The answer's head and its whole body as a ``Reply``; a body compressed with
        gzip or deflate (``Content-Encoding``) is decoded, and refused once it decodes past
        ``max_body_bytes``. The client asks for no encoding, so any other is refused."""
        encodings = [
            encoding.strip().lower()
            for name, value in self.headers
            if name.lower() == b"content-encoding"
            for encoding in value.split(b",")
        ]
        for encoding in reversed(encodings):  # the last one applied comes off first
            if encoding not in (b"", b"identity"):
                content = _inflate(content, encoding, self.limits.max_body_bytes)
        return Reply(self.status, self.headers, content)

    @property
    def whole(self) -> bool:
        """The answer was read to its end, without error: the connection may be reused."""
        return self._complete and self._error is None

    def _until_close(self) -> bool:
        names = {name.lower() for name, _ in self.headers}
        return b"content-length" not in names and b"transfer-encoding" not in names

    # -- llhttp's callbacks ---------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self._complete:  # llhttp read on into a second answer
            self._refuse(
                "the server sent bytes after a complete answer, which the client never "
                "asked for; the connection is closed"
            )

    def on_status(self, reason: bytes) -> None:
        self._reason_parts.append(reason)  # joined once, when the head is complete

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.reason = b"".join(self._reason_parts)
        self._reason_parts = []
        if len(self.headers) > self.limits.max_headers:
            self._refuse(self._too_many_headers())
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
    and headers begins with, whatever its body. ``LocalProtocolError`` for a header
    with CR, LF or NUL, which would end the head early."""
    lines = [request.method.encode("ascii") + b" " + request.url.raw_path + b" HTTP/1.1"]
    for name, value in request.headers.raw:
        if name.lower() not in (b"transfer-encoding", b"content-length"):
            if any(char in name + value for char in b"\r\n\0"):
                raise httpx.LocalProtocolError(
                    f"the header {name.decode('latin-1')!r} holds CR, LF or NUL, which "
                    "would end the request's head early: remove them from its value",
                    request=request,
                )
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
    ``headers``, which only an error's path needs. ``backend``: the name its errors
    carry (set by the transport that read it)."""

    __slots__ = ("_headers", "_raw", "backend", "content", "status_code")

    def __init__(self, status_code: int, raw: list[tuple[bytes, bytes]], content: bytes) -> None:
        self.status_code = status_code
        self.content = content
        self.backend: str | None = None
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
        """The body as JSON (pydantic-core's parser: the values ``json.loads`` gives);
        ``BackendUnavailable`` for a body that is not (a server that answers garbage is
        as good as away)."""
        try:
            return from_json(self.content)
        except ValueError as exc:
            raise BackendUnavailable(
                f"an answer that is not JSON ({exc}): {self.content[:200]!r}",
                backend=self.backend,
            ) from None

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


def _inflate(content: bytes, encoding: bytes, max_bytes: int) -> bytes:
    """``content`` decoded from ``encoding`` (gzip, or deflate with or without its zlib
    header, as httpx reads them), no more than ``max_bytes`` + 1 bytes at a time: a
    bomb of a few KiB is refused before it becomes more than the bound."""
    wbits = _WBITS.get(encoding)
    if wbits is None:
        raise AnswerRefused(
            f"the answer is encoded as {encoding.decode('latin-1')!r}, which the client did "
            "not ask for (it asks for no encoding, and decodes only gzip and deflate)"
        )
    try:
        return _inflated(content, zlib.decompressobj(wbits), max_bytes)
    except zlib.error:
        if encoding != b"deflate":
            raise AnswerRefused("the answer's gzip body does not decode") from None
    try:  # deflate without the zlib header, which some servers send
        return _inflated(content, zlib.decompressobj(-zlib.MAX_WBITS), max_bytes)
    except zlib.error as exc:
        raise AnswerRefused(f"the answer's deflate body does not decode: {exc}") from None


def _inflated(content: bytes, inflater: Any, max_bytes: int) -> bytes:
    parts: list[bytes] = []
    num_bytes = 0
    data = content
    while data:
        part = inflater.decompress(data, max_bytes + 1 - num_bytes)
        num_bytes += len(part)
        if num_bytes > max_bytes:
            raise AnswerRefused(
                f"the answer's body decodes past {max_bytes} bytes (AnswerLimits.max_body_bytes)"
            )
        parts.append(part)
        data = inflater.unconsumed_tail
    rest = inflater.flush()
    if num_bytes + len(rest) > max_bytes:
        raise AnswerRefused(
            f"the answer's body decodes past {max_bytes} bytes (AnswerLimits.max_body_bytes)"
        )
    parts.append(rest)
    return b"".join(parts)
