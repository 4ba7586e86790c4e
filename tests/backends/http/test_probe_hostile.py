"""The external engines' probes against an engine that answers NaN, infinities or the
wrong shape: a STUB engine (a raw HTTP server on 127.0.0.1 started here; vLLM and SGLang
need CUDA and a real llama-server never answers so) serving the recorded fixtures of
``fixtures/`` with figures replaced, read by the real backends (``VLLMBackend``,
``SGLangBackend``, ``LlamaCppBackend``, ``OpenAICompatibleBackend``) over kvgov's own
HTTP client. A NaN or infinite figure reads as absent (the backend falls back as for a
figure the engine does not expose); a body of another shape is a ``BackendError``:
``health()`` reports it, and a call fails with it, never with a bare ``ValueError``,
``OverflowError`` or ``AttributeError``.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from backends import LlamaCppBackend, OpenAICompatibleBackend, SGLangBackend, VLLMBackend
from backends.http.transport import Retries
from governor import BackendError, ConfigError, GenerationRequest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
FAST = Retries(attempts=1)
Routes = dict[str, tuple[int, bytes]]


@contextmanager
def stub_engine(routes: Routes) -> Iterator[str]:
    """A raw HTTP/1.1 server answering each path (query included) with its status and
    JSON or text body, 404 elsewhere; on an event loop of its own thread."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                length = 0
                for line in head[1:]:
                    name, _, value = line.partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                await reader.readexactly(length)
                status, body = routes.get(head[0].split(" ")[1], (404, b'{"detail": "no"}'))
                writer.write(
                    b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    opened = asyncio.start_server(handle, "127.0.0.1", 0)
    server = asyncio.run_coroutine_threadsafe(opened, loop).result(5)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:

        async def shut() -> None:
            server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shut(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def _fixture(engine: str, name: str) -> bytes:
    return (FIXTURES / engine / name).read_bytes()


def _metrics(engine: str, name: str, values: dict[str, str]) -> bytes:
    """The fixture's exposition with the named samples' values replaced."""
    lines = []
    for line in _fixture(engine, name).decode().splitlines():
        sample = line.split("{")[0].split(" ")[0]
        if sample in values and not line.startswith("#"):
            line = line.rsplit(" ", 1)[0] + " " + values[sample]
        lines.append(line)
    return ("\n".join(lines) + "\n").encode()


def _json(body: object) -> bytes:
    return json.dumps(body).encode()  # NaN and Infinity as the engines' Python writes them


def test_vllm_nan_and_infinite_gauges_and_counters_read_as_absent() -> None:
    metrics = _metrics(
        "vllm",
        "metrics.txt",
        {
            "vllm:num_requests_running": "NaN",
            "vllm:num_requests_waiting": "+Inf",
            "vllm:kv_cache_usage_perc": "NaN",
            "vllm:prefix_cache_queries_total": "+Inf",
            "vllm:num_preemptions_total": "-Inf",
        },
    )
    routes: Routes = {
        "/metrics": (200, metrics),
        "/v1/models": (200, _fixture("vllm", "models.json")),
        "/version": (200, _fixture("vllm", "version.json")),
    }
    with stub_engine(routes) as url:
        backend = VLLMBackend(url, model="m", priority_scheduling=False, retries=FAST)
        reading = backend.reading(fresh=True)
        assert (reading.num_blocks, reading.block_size) == (27910, 16)  # the finite figures
        assert reading.kv_usage is None and reading.num_requests_running is None
        assert reading.num_requests_waiting is None and reading.num_preemptions is None
        assert reading.prefix_cache_queries is None and reading.prefix_cache_hits == 1500
        assert backend.health().ok
        metrics_now = backend.metrics()  # falls back to what the client knows
        assert metrics_now.num_requests_running == 0 and metrics_now.num_blocks_in_use == 0
        backend.close()


def test_sglang_nan_and_infinite_load_fields_read_as_absent() -> None:
    loads = json.loads(_fixture("sglang", "loads.json"))
    loads["loads"][0] |= {"token_usage": float("nan"), "num_running_reqs": float("inf")}
    metrics = _metrics(
        "sglang",
        "metrics.txt",
        {"sglang:token_usage": "NaN", "sglang:num_retracted_requests_total": "+Inf"},
    )
    routes: Routes = {
        "/server_info": (200, _fixture("sglang", "server_info.json")),
        "/v1/loads": (200, _json(loads)),
        "/v1/models": (200, _fixture("sglang", "models.json")),
        "/metrics": (200, metrics),
    }
    with stub_engine(routes) as url:
        backend = SGLangBackend(url, model="m", retries=FAST)
        reading = backend.reading(fresh=True)
        assert reading.kv_tokens == 327680
        assert reading.kv_usage is None  # NaN in both places
        assert reading.num_requests_running == 4  # /metrics', the load's being infinite
        assert reading.num_preemptions is None
        assert backend.health().ok
        backend.close()


def _llamacpp_routes(props: object, metrics: bytes) -> Routes:
    slot = {"n_ctx": 4096, "is_processing": False, "n_prompt_tokens": 10}
    slots = [slot | {"id": i, "next_token": [{"n_decoded": 2}]} for i in range(2)]
    completion = {
        "choices": [{"text": "ok", "index": 0, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }
    return {
        "/props": (200, _json(props)),
        "/slots": (200, _json(slots)),
        "/metrics": (200, metrics),
        "/v1/completions": (200, _json(completion)),
    }


def test_llamacpp_nan_and_infinite_figures_read_as_absent_and_calls_run() -> None:
    """``requests_processing NaN`` raised ``ValueError`` and ``+Inf`` ``OverflowError`` from
    every reading, so every budgeted call failed; ``/props``' NaN context too."""
    props = {"total_slots": float("inf"), "default_generation_settings": {"n_ctx": float("nan")}}
    metrics = (
        b"llamacpp:requests_processing NaN\nllamacpp:requests_deferred +Inf\n"
        b"llamacpp:prompt_tokens_total NaN\nllamacpp:kv_cache_usage_ratio +Inf\n"
        b"llamacpp:n_decode_total 7\n"
    )
    with stub_engine(_llamacpp_routes(props, metrics)) as url:
        backend = LlamaCppBackend(url, retries=FAST)
        reading = backend.reading(fresh=True)
        assert (reading.max_model_len, reading.num_blocks) == (4096, 8192)  # from /slots
        assert reading.num_requests_running is None and reading.num_requests_waiting is None
        assert reading.kv_usage is None and reading.prefix_cache_queries is None
        assert reading.raw is not None and reading.raw["metrics"] == {"n_decode_total": 7.0}
        assert backend.health().ok
        assert backend.capacity().num_blocks * backend.block_size <= 8192
        backend.open_budget("agent", max_blocks=64)
        request = GenerationRequest(prompt=[1, 2, 3], max_tokens=1, budget="agent")
        assert backend.generate(request).text == "ok"
        backend.close()


@pytest.mark.parametrize(
    "props",
    [[1, 2], "llama", {"default_generation_settings": ["n_ctx", 4096]}],
    ids=["props-list", "props-string", "settings-list"],
)
def test_llamacpp_props_of_another_shape_is_unhealthy_and_calls_fail_typed(
    props: object,
) -> None:
    """``/props`` as a list raised ``AttributeError`` from ``health()`` and every call."""
    with stub_engine(_llamacpp_routes(props, b"")) as url:
        backend = LlamaCppBackend(url, retries=FAST)
        health = backend.health()
        assert not health.ok and "/props" in health.detail and "llama.cpp" in health.detail
        backend.open_budget("agent", max_blocks=64)
        request = GenerationRequest(prompt=[1, 2, 3], max_tokens=1, budget="agent")
        for call in (backend.capacity, lambda: backend.generate(request)):
            with pytest.raises(BackendError, match="shape kvgov cannot read") as caught:
                call()
            assert type(caught.value) is BackendError and caught.value.backend == "llama.cpp"
        backend.close()


def test_an_openai_servers_models_of_another_shape_reads_as_nothing_said() -> None:
    for models in ([1], {"data": "x"}, {"data": [{"max_model_len": float("nan")}]}):
        with stub_engine({"/v1/models": (200, _json(models))}) as url:
            backend = OpenAICompatibleBackend(url, model="m", retries=FAST)
            assert backend.reading(fresh=True).max_model_len is None
            with pytest.raises(ConfigError, match="declare it"):
                backend.capacity()  # no capacity said, none declared: typed, as ever
            backend.close()
