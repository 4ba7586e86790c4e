"""``RemoteBackend`` beyond the shared contract (tests/governor/test_backend_protocol.py):
typed errors rebuilt from the server's body, retries only where a retry cannot do a thing
twice, counting exactly as the server does without a round trip per count, and an event
loop that never waits on the network.

Against the session's real ``kvgov serve`` process, except where the server must
misbehave on cue (a 503, a refused connection, a body without kvgov's detail): there an
``httpx.MockTransport`` answers, and the test says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import pickle
import ssl
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from backends.remote.backend import InvalidNameError, RemoteBackend, Retries
from governor.backend import GenerationRequest
from governor.errors import BackendError, BackendUnavailable, ConfigError
from tests.loop_ticker import loop_ticker
from tests.serve_process import ServerProcess

FAST = Retries(attempts=3, backoff_s=0.001)


@pytest.fixture
def remote(kvgov_server: ServerProcess) -> Iterator[RemoteBackend]:
    with RemoteBackend(kvgov_server.base_url) as backend:
        yield backend


def test_engine_errors_arrive_typed_with_their_fields(remote: RemoteBackend) -> None:
    remote.open_budget("typed-a", max_blocks=2)
    try:
        with pytest.raises(BackendError) as caught:
            remote.open_budget("typed-a", max_blocks=2)
        assert type(caught.value).__name__ == "DuplicateBudgetError"
        assert (caught.value.name, caught.value.backend) == ("typed-a", "remote")
        assert not caught.value.retriable
        too_long = GenerationRequest(prompt=list(range(5_000, 5_040)), budget="typed-a")
        with pytest.raises(BackendError) as caught:
            remote.generate(too_long)
        assert type(caught.value).__name__ == "BudgetExceededError"
        assert (caught.value.needed, caught.value.max_blocks) == (3, 2)
        # Errors cross process boundaries (worker pools): they pickle, fields and all.
        again = pickle.loads(pickle.dumps(caught.value))
        assert (type(again).__name__, again.needed, str(again)) == (
            "BudgetExceededError",
            3,
            str(caught.value),
        )
    finally:
        remote.close_budget("typed-a")
    with pytest.raises(BackendError) as caught:
        remote.generate(GenerationRequest(prompt=list(range(10)), ceiling_tokens=10))
    assert type(caught.value).__name__ == "CeilingExceededError"
    assert caught.value.ceiling_tokens == 10


def _mock(handler: httpx.MockTransport, **options: object) -> RemoteBackend:
    return RemoteBackend("http://kvgov.test", transport=handler, retries=FAST, **options)  # type: ignore[arg-type]


def test_a_context_length_refusal_is_typed_and_never_retried() -> None:
    """A mock server: a body with OpenAI's code and no kvgov detail, as a proxy in front
    of kvgov serve might pass it on."""
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        body = {"error": {"message": "too long", "type": "invalid_request_error",
                          "param": "messages", "code": "context_length_exceeded"}}  # fmt: skip
        return httpx.Response(400, json=body, headers={"x-should-retry": "false"})

    backend = _mock(httpx.MockTransport(answer), model="m")
    backend._session.suspect = False  # no /version probe: only the call itself
    with pytest.raises(BackendError) as caught:
        backend.generate(GenerationRequest(prompt="hi"))
    assert type(caught.value).__name__ == "CeilingExceededError"
    assert not caught.value.retriable and not isinstance(caught.value, BackendUnavailable)
    assert seen == ["/v1/completions"]


def test_only_safe_requests_are_retried() -> None:
    """A mock server that answers 503 to everything, then one whose connections are
    refused: a GET is retried (it cannot do a thing twice), a POST that reached the
    server is not, a POST whose connection failed before it was sent is."""
    seen: list[tuple[str, str]] = []

    def busy(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path))
        return httpx.Response(503, json={"error": {"message": "down", "type": "x"}})

    backend = _mock(httpx.MockTransport(busy), model="m")
    backend._session.suspect = False
    with pytest.raises(BackendUnavailable) as caught:
        backend.capacity()
    assert caught.value.retriable
    assert seen == [("GET", "/kvgov/v1/capacity")] * FAST.attempts
    seen.clear()
    backend._session.suspect = False
    with pytest.raises(BackendUnavailable):
        backend.generate(GenerationRequest(prompt="hi"))
    assert seen == [("POST", "/v1/completions")]

    def refused(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path))
        raise httpx.ConnectError("connection refused", request=request)

    seen.clear()
    backend = _mock(httpx.MockTransport(refused), model="m")
    backend._session.suspect = False
    with pytest.raises(BackendUnavailable):
        backend.generate(GenerationRequest(prompt="hi"))
    assert seen == [("POST", "/v1/completions")] * FAST.attempts


def test_an_event_loops_client_loads_no_certificates_on_that_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Loading the CA bundle takes 60-120 ms here; an event loop's client is made by that
    loop's first call, so loading it there would stall the loop that long. A mock
    transport: what is checked is where the client is built, not a call."""
    loaded: list[bool] = []
    load = ssl.SSLContext.load_verify_locations

    def counted(self: ssl.SSLContext, *args: Any, **kwargs: Any) -> None:
        loaded.append(_on_a_loop())
        load(self, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counted)
    backend = _mock(httpx.MockTransport(lambda request: httpx.Response(200)), model="m")

    async def first_async_client() -> None:
        backend._transport._aclient()

    asyncio.run(first_async_client())
    asyncio.run(first_async_client())  # another loop, another client
    assert loaded and not any(loaded)  # loaded once, at construction, on no loop
    backend.close()


def _on_a_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def test_counts_match_the_server_with_few_round_trips(remote: RemoteBackend) -> None:
    counter = remote.counter
    tokenizer = counter._tokenizer
    bodies: list[object] = []
    ask = tokenizer._count
    tokenizer._count = lambda body: bodies.append(body) or ask(body)
    texts = ["hello world", "<|endoftext|> ends", "naïve café " * 30]
    for text in texts:
        expected = remote._call("POST", "/kvgov/v1/count", {"text": text}).json()["tokens"]
        assert remote.count_tokens(text) == expected
    assert bodies == []  # text: counted here, with the server's own tiktoken encoding
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
    first = remote.count_messages(messages)
    for _ in range(3):  # a governor counts the same conversation at every turn
        assert remote.count_messages(messages) == first
    assert len(bodies) == 1  # chat templates render on the server, once per conversation
    result = remote.generate(GenerationRequest(messages=messages, max_tokens=1))
    assert result.prompt_tokens == first


def test_async_calls_leave_the_event_loop_free(
    remote: RemoteBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every blocking send (the sync transport's, which ``_call`` and a restart's set-up
    use) is recorded with whether its thread runs an event loop: none may. A call here
    is far shorter than the gap threshold, so the gaps alone would not show a blocking
    call on the loop; the record does."""
    on_loop: list[bool] = []
    send = remote._transport._send

    def recorded(method: str, path: str, json: Any) -> Any:
        on_loop.append(_on_a_loop())
        return send(method, path, json)

    monkeypatch.setattr(remote._transport, "_send", recorded)

    async def main() -> float:
        async with loop_ticker() as gaps:
            await remote.aopen_budget("loop-free", max_blocks=8)
            request = GenerationRequest(prompt=list(range(6_000, 6_020)), max_tokens=24,
                                        budget="loop-free")  # fmt: skip
            result = await remote.agenerate(request)
            chunks = [chunk async for chunk in remote.astream(request)]
            assert chunks[-1].result is not None
            assert chunks[-1].result.token_ids == result.token_ids
            assert (await remote.aretain(budget="loop-free")) > 0
            await remote.arelease_retained(budget="loop-free")
            await remote.aclose_budget("loop-free")
            assert (await remote.ametrics()).num_requests_running == 0
        return max(gaps)

    assert asyncio.run(main()) < 0.1  # a blocking call would hold it for a whole call
    assert on_loop and not any(on_loop)  # the /version probe ran, on a worker thread
    assert json.dumps(remote.kv_map().budgets) == "{}"


def test_each_answer_carries_the_engines_own_time_for_the_call(remote: RemoteBackend) -> None:
    """``usage.kvgov_engine_ms``: the engine's time for the call, from its arrival at the
    engine to its end, which the whole call (client, network, server) contains."""
    import time

    request = GenerationRequest(prompt=list(range(7_000, 7_020)), max_tokens=4)
    started = time.perf_counter()
    result = remote.generate(request)
    whole = time.perf_counter() - started
    assert result.engine_s is not None and 0 < result.engine_s < whole

    async def streamed() -> float | None:
        chunks = [chunk async for chunk in remote.astream(request)]
        assert chunks[-1].result is not None
        return chunks[-1].result.engine_s

    engine_s = asyncio.run(streamed())
    assert engine_s is not None and engine_s > 0


def test_a_calls_order_time_travels_as_its_age(remote: RemoteBackend) -> None:
    """Two machines' monotonic clocks do not compare: ``order_time`` goes out as
    ``order_age_s`` (how long ago it was), which kvgov serve takes back to its own clock.
    The call is answered as one without it."""
    import time

    from backends.remote.generation import body_of

    plain = GenerationRequest(prompt=list(range(7_100, 7_110)), max_tokens=3)
    ordered = GenerationRequest(prompt=plain.prompt, max_tokens=3, order_time=time.monotonic() - 5)
    assert "order_age_s" not in body_of(plain, model="m", stream=False)
    age = body_of(ordered, model="m", stream=False)["order_age_s"]
    assert 5.0 <= age < 6.0
    assert remote.generate(ordered).token_ids == remote.generate(plain).token_ids


def test_a_budget_name_is_one_path_segment_and_reaches_no_other_route(
    remote: RemoteBackend,
) -> None:
    """Against the real server. Sent unescaped, ``../prefixes/{key}`` closed nothing and
    unpinned that prefix (httpx removes the dot segments), and ``worker?x=1`` resized
    ``worker``; a name with ``#``, ``%`` or ``?`` reached another path."""
    handle = remote.pin_prefix(list(range(7_000, 7_040)))
    pinned = remote.capacity().num_pinned_blocks
    assert pinned >= 2
    key = remote._session.server_key(handle.key)
    refusals: list[BackendError] = []
    for close in (remote.close_budget, lambda name: asyncio.run(remote.aclose_budget(name))):
        try:
            close(f"../prefixes/{key}")
        except BackendError as exc:
            refusals.append(exc)
        assert remote.capacity().num_pinned_blocks == pinned  # still pinned
    assert [type(exc) for exc in refusals] == [InvalidNameError] * 2
    assert "'/'" in str(refusals[0]) and refusals[0].name == f"../prefixes/{key}"
    remote.unpin_prefix(handle)
    assert remote.capacity().num_pinned_blocks == pinned - handle.num_blocks

    remote.open_budget("worker", max_blocks=4)
    try:
        with contextlib.suppress(BackendError):  # no budget of that name: refused
            remote.resize_budget("worker?x=1", max_blocks=9)
        assert remote.kv_map().budgets["worker"].max_blocks == 4  # not resized
    finally:
        remote.close_budget("worker")
    for name in ("planner #1 ?x=50%", "a..b.", "研究员 a b", "x" * 256):
        remote.open_budget(name, max_blocks=3)
        remote.resize_budget(name, max_blocks=5)
        assert remote.kv_map().budgets[name].max_blocks == 5
        remote.release_retained(budget=name)
        remote.close_budget(name)
        assert name not in remote.kv_map().budgets


def test_a_name_the_server_would_refuse_is_refused_before_any_request() -> None:
    """A mock server that records every request: none is sent for a name with ``/``, a
    control or bidirectional-format character, spaces at an end, an empty or an
    overlong one, ``.`` or ``..`` (the server's rule, ``backends.remote.wire.name_problem``)."""
    seen: list[str] = []
    backend = _mock(httpx.MockTransport(lambda r: seen.append(r.url.path) or httpx.Response(204)))
    backend._session.suspect = False
    bad = ("a/b", "nul\x00", "line\r\nbreak", "\u202eevil", "", "x" * 257, ".", "..", " a", "a ")
    for name in bad:
        for call in (
            lambda name=name: backend.open_budget(name, max_blocks=2),
            lambda name=name: backend.resize_budget(name, max_blocks=2),
            lambda name=name: backend.close_budget(name),
            lambda name=name: backend.retain(budget=name),
            lambda name=name: backend.offload(budget=name),
            lambda name=name: asyncio.run(backend.aopen_budget(name, max_blocks=2)),
        ):
            with pytest.raises(InvalidNameError) as caught:
                call()
            assert isinstance(caught.value, BackendError) and not caught.value.retriable
    assert seen == []
    backend.close()


def test_an_answer_past_max_response_bytes_is_not_read(kvgov_server: ServerProcess) -> None:
    """Against the real server: small answers pass, a model call's larger one (its token
    ids and text) raises ``BackendUnavailable``, sync and async."""
    with RemoteBackend(kvgov_server.base_url, max_response_bytes=600) as small:
        assert small.capacity().num_blocks > 0
        request = GenerationRequest(prompt=list(range(8_000, 8_040)), max_tokens=64)
        with pytest.raises(BackendUnavailable, match="ran past 600 bytes"):
            small.generate(request)
        with pytest.raises(BackendUnavailable, match="ran past 600 bytes"):
            asyncio.run(small.agenerate(request))
        assert small.metrics().num_requests_running == 0
    with pytest.raises(ConfigError, match="max_response_bytes"):
        RemoteBackend(kvgov_server.base_url, max_response_bytes=0)
