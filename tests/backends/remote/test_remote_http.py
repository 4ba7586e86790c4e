"""``Transport``'s hot path: what each request costs the client besides httpx's own work.
The server is ``httpx.MockTransport`` here (the URL a request goes to is all that is
checked, no server is needed for it)."""

from __future__ import annotations

import asyncio
import itertools

import httpx
import httpx._urls  # where httpx parses a URL: counted below
import pytest

from backends.http.transport import Retries, Transport, _lines

BASE = "http://127.0.0.1:9/prefix/"
PATHS = ["/v1/chat/completions", "/kvgov/v1/budgets/agent%201", "/tokenize?x=1", "/health"]


def _transport(seen: list[httpx.URL]) -> Transport:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.url)
        return httpx.Response(200, json={})

    mock = httpx.MockTransport(answer)
    return Transport(
        BASE,
        api_key=None,
        timeout=httpx.Timeout(5.0),
        retries=Retries(),
        limits=httpx.Limits(),
        name="remote",
        transport=mock,
        async_transport=mock,
    )


def test_each_request_goes_where_httpx_merges_its_path_and_parses_no_url(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A served call's client CPU is mostly httpx's; parsing and merging the path with the
    base URL on every request was a twentieth of it. Paths are merged once (by httpx,
    so to the same URL) and every later request, sync or async, parses no URL."""
    seen: list[httpx.URL] = []
    transport = _transport(seen)
    with httpx.Client(base_url=BASE) as plain:
        expected = [plain.build_request("POST", path).url for path in PATHS]
    for path in PATHS:
        transport.request("POST", path, json={"a": 1})
    assert seen == expected

    parsed: list[str] = []
    urlparse = httpx._urls.urlparse

    def counting(url: str = "", **kwargs: object) -> object:
        parsed.append(url)
        return urlparse(url, **kwargs)

    monkeypatch.setattr(httpx._urls, "urlparse", counting)

    async def again() -> None:
        await transport.arequest("POST", PATHS[0], json={"a": 1})
        parsed.clear()  # the loop's client parsed its base URL as it was made: once a loop
        for path in PATHS:
            await transport.arequest("POST", path, json={"a": 1})

    asyncio.run(again())
    for path in PATHS:
        transport.request("POST", path, json={"a": 1})
    assert parsed == []
    assert seen == expected + expected[:1] + expected * 2
    transport.close()


class _Chunks(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self):  # type: ignore[no-untyped-def]
        for chunk in self.chunks:
            yield chunk


def test_a_stream_reads_the_same_lines_however_its_bytes_arrive() -> None:
    """Events split across reads or several in one, CRLF or LF, a multi-byte character
    cut between reads, no final newline: the lines httpx's own line reader gives."""
    body = 'data: {"a": 1}\n\ndata: {"b": "héllo ✓"}\r\n\r\n: note\ndata: [DONE]'.encode()
    cuts = [0, 3, 7, 15, 16, 30, 31, 32, len(body) - 2, len(body)]
    transport = _transport([])

    async def read(chunks: list[bytes], *, ours: bool) -> list[str]:
        response = httpx.Response(200, stream=_Chunks(chunks))
        lines = _lines(response, transport) if ours else response.aiter_lines()
        return [line async for line in lines]

    expected = asyncio.run(read([body], ours=False))
    assert expected == [
        'data: {"a": 1}',
        "",
        'data: {"b": "héllo ✓"}',
        "",
        ": note",
        "data: [DONE]",
    ]
    pieces = [body[a:b] for a, b in itertools.pairwise(cuts)]
    for chunks in ([body], pieces, [bytes([b]) for b in body]):
        assert asyncio.run(read(chunks, ours=True)) == expected


def test_answers_and_stream_events_of_another_shape_are_backend_errors() -> None:
    """What an engine may send in place of an OpenAI answer: each is a ``BackendError``
    naming the backend, never a bare ``TypeError`` or ``AttributeError``."""
    from backends.remote.generation import StreamState, result_of
    from governor import BackendError

    answers = [
        [1, 2],
        {"choices": "abc"},
        {"choices": [["x"]]},
        {"choices": [{"text": "a"}], "usage": {"prompt_tokens": "many"}},
        {"choices": [{"text": "a"}], "usage": ["x"]},
    ]
    for answer in answers:
        with pytest.raises(BackendError, match="shape kvgov cannot read") as caught:
            result_of(answer, backend="engine")  # type: ignore[arg-type]
        assert type(caught.value) is BackendError and caught.value.backend == "engine"
    for event in ("[1, 2]", '{"choices": [7]}', '{"choices": [{"delta": "x", "token_ids": 5}]}'):
        with pytest.raises(BackendError, match="shape kvgov cannot read"):
            StreamState("engine").chunk(event)
