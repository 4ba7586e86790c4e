"""``LlamaCppBackend`` against a real llama.cpp ``llama-server`` (a tiny random GGUF model
written by ``tests.llama_server``), 3 slots of 512 tokens each (``-c 1536 -np 3``).

The swarm: a planner fans out to 4 workers, 2 at a time; each worker's conversation
grows by a tool output of 135 tokens a turn, for 5 turns. Sent straight to the server
(the OpenAI client, no kvgov), each worker's fourth and fifth calls pass a slot's 512 tokens and
the server refuses it. Governed through ``LlamaCppBackend`` (ceilings of 448 tokens,
``SummarizeOldest``), every call finishes within its ceiling, each agent's calls go to
one slot, and agents that run at once never share one.

Without a llama-server binary these tests skip, saying how to provide one; under CI (``CI``
set) they fail instead (``tests.llama_server.need_llama_server``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from backends.http.errors import error_from_response
from backends.openai._llamacpp_slots import slot_filename
from backends.openai.llamacpp import LlamaCppBackend
from governor import (
    AgentSpec,
    BackendError,
    BackendUnavailable,
    GenerationRequest,
    Governor,
    GovernorConfig,
    GovernorEvent,
    Policies,
)
from policies import SummarizeOldest
from tests.llama_server import LlamaServer, llama_server, need_llama_server

SLOT_CTX = 512
ARGS = ["-c", str(3 * SLOT_CTX), "-np", "3", "--metrics"]
PLANNER = AgentSpec(name="planner", ceiling_tokens=448, max_fanout=2)
WORKER = AgentSpec(name="worker", ceiling_tokens=448)
NUM_WORKERS, NUM_TURNS = 4, 5
TOOL_OUTPUT = "test_login FAILED: expected 200, got 500\n" * 3


@pytest.fixture(scope="module")
def binary() -> str:
    """The llama-server binary: skipped without one, failed without one under CI."""
    return need_llama_server()


@pytest.fixture(scope="module")
def model(binary: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.llama_server import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture
def server(binary: str, model: Path, tmp_path: Path) -> Iterator[LlamaServer]:
    args = [*ARGS, "--slot-save-path", str(tmp_path)]
    with llama_server(binary, model, args=args) as running:
        yield running


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="kvgov")  # the missing-gauge warning, once


class _Sent(httpx.AsyncBaseTransport):
    """The real transport, keeping each chat body sent (to see its ``id_slot``)."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.bodies: list[dict[str, object]] = []
        self.cached: list[tuple[str, int, int]] = []  # first words, turn's messages, cached

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.url.path == "/v1/chat/completions":
            body = json.loads(request.content)
            self.bodies.append(body)
            await response.aread()
            usage = json.loads(response.content)["usage"]
            cached = usage["prompt_tokens_details"]["cached_tokens"]
            self.cached.append((_first_words(body), len(body["messages"]), cached))
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def _first_words(body: dict[str, object]) -> str:
    messages = body["messages"]
    assert isinstance(messages, list)
    return str(messages[0]["content"]).split(":")[0]


def test_ungoverned_the_swarm_overflows_a_slot(server: LlamaServer) -> None:
    client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="-", max_retries=0)
    counter = LlamaCppBackend(server.base_url)

    async def worker(number: int) -> list[tuple[int, bool]]:
        history = [{"role": "user", "content": f"Worker {number}: find the failing test."}]
        calls = []
        for turn in range(NUM_TURNS):
            history.append({"role": "user", "content": f"Turn {turn}:\n{TOOL_OUTPUT}"})
            prompt = counter.count_messages(history)
            try:
                await client.chat.completions.create(
                    model="tiny",
                    messages=history,
                    max_tokens=4,  # type: ignore[arg-type]
                )
                calls.append((prompt, True))
            except openai.BadRequestError as exc:
                assert exc.type == "exceed_context_size_error"
                calls.append((prompt, False))
        return calls

    async def main() -> list[tuple[int, bool]]:
        await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Plan."}], max_tokens=4
        )
        results = await asyncio.gather(*(worker(i) for i in range(NUM_WORKERS)))
        await client.close()
        return [call for calls in results for call in calls]

    with counter:
        calls = asyncio.run(main())
    # Exactly the calls whose prompt does not fit a slot failed: every worker's last two
    # (prompts of 586 and 721 tokens, counted by the server's own tokenizer).
    assert all(ok == (prompt + 4 <= SLOT_CTX) for prompt, ok in calls)
    assert sum(not ok for _, ok in calls) == 2 * NUM_WORKERS


def test_governed_the_swarm_finishes_within_ceilings_on_one_slot_each(
    server: LlamaServer,
) -> None:
    sent = _Sent()
    backend = LlamaCppBackend(server.base_url, async_transport=sent)
    capacity = backend.capacity()
    assert (capacity.num_blocks, capacity.max_model_len) == (3 * SLOT_CTX // 16, SLOT_CTX)
    policies = Policies(ceiling=SummarizeOldest(summary_tokens=24))
    config = GovernorConfig(park_after_s=0, retain_s=0)
    governor = Governor(backend, config=config, agents=[PLANNER, WORKER], policies=policies)
    assert governor.admission.max_concurrent(WORKER.ceiling_tokens) == 3  # = the slots
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)

    async def worker(child: object, number: int) -> None:
        async with child as lease:  # type: ignore[attr-defined]
            history = [{"role": "user", "content": f"Worker {number}: find the failing test."}]
            for turn in range(NUM_TURNS):
                history.append({"role": "user", "content": f"Turn {turn}:\n{TOOL_OUTPUT}"})
                await governor.acomplete(lease, history, max_tokens=4)

    async def main() -> None:
        async with governor.lease("planner") as planner:
            await governor.acomplete(planner, [{"role": "user", "content": "Plan."}], max_tokens=4)
            children = governor.fanout(planner, "worker", NUM_WORKERS)
            await asyncio.gather(*(worker(child, i) for i, child in enumerate(children)))
            await governor.acomplete(planner, [{"role": "user", "content": "Merge."}], max_tokens=4)
        await backend.aclose()

    opening = backend.count_tokens("<|assistant|>")
    first_prompts = []
    for number in range(NUM_WORKERS):
        first = [{"role": "user", "content": f"Worker {number}: find the failing test."}]
        first.append({"role": "user", "content": f"Turn 0:\n{TOOL_OUTPUT}"})
        first_prompts.append(backend.count_messages(first))
    asyncio.run(main())
    finished = [e for e in events if e.kind == "call.finished"]
    assert len(finished) == 2 + NUM_WORKERS * NUM_TURNS  # every call finished
    assert any(e.kind == "compacted" for e in events)  # the ceilings did their work
    for event in finished:
        used = event.attributes["prompt_tokens"] + event.attributes["completion_tokens"]
        assert used <= 448
    # Each agent's calls went to one slot, and agents running at once had slots apart.
    slots: dict[str, set[object]] = {}
    for body in sent.bodies:
        slots.setdefault(_first_words(body), set()).add(body.get("id_slot"))
    assert len(slots) == 2 + NUM_WORKERS  # "Plan", "Merge" and each worker
    assert all(len(ids) == 1 and None not in ids for ids in slots.values())
    assert slots["Worker 0"] != slots["Worker 1"]
    assert slots["Worker 2"] != slots["Worker 3"]
    # A worker's second call (its first conversation and one turn more, not yet compacted)
    # found its first prompt in its slot: all of it but the reply's opening ("<|assistant|>",
    # which the next user message replaces; one token of slack where the pieces meet).
    for number in range(NUM_WORKERS):
        prompt = first_prompts[number]
        cached = {n: c for words, n, c in sent.cached if words == f"Worker {number}"}
        assert prompt - opening - 1 <= cached[3] <= prompt
    assert governor.admission.ledger() == (0, 0, 0, 0)
    assert set(backend.slot_owners().values()) == {None}  # every slot given back


def test_a_slot_is_saved_and_restored_as_an_agent_parks(server: LlamaServer) -> None:
    with LlamaCppBackend(server.base_url) as backend:
        backend.open_budget("agent", max_blocks=28)
        history = [{"role": "user", "content": f"Worker 0: find the failing test.\n{TOOL_OUTPUT}"}]
        request = GenerationRequest(messages=history, max_tokens=4, budget="agent")
        first = backend.generate(request)
        held = backend.retain(budget="agent")
        assert held == first.prompt_tokens + first.completion_tokens
        backend.offload(budget="agent")
        assert backend.slot_of("agent") is None  # the slot is free for others
        assert backend.metrics().num_blocks_swapped == -(-held // 16)
        backend.restore(budget="agent")
        again = backend.generate(request)
        # The restored slot held the prompt: all of it but the last token came from it.
        assert again.cached_tokens == first.prompt_tokens - 1
        backend.close_budget("agent")


def test_the_context_400_is_the_typed_error_and_never_retried(server: LlamaServer) -> None:
    body = {"messages": [{"role": "user", "content": TOOL_OUTPUT * 8}], "max_tokens": 4}
    answer = httpx.post(f"{server.base_url}/v1/chat/completions", json=body)
    error = error_from_response(answer.status_code, answer.content, backend="llama.cpp")
    assert type(error).__name__ == "CeilingExceededError"
    assert not error.retriable
    assert (error.available, error.needed > SLOT_CTX) == (SLOT_CTX, True)  # type: ignore[attr-defined]
    with LlamaCppBackend(server.base_url) as backend:  # refused before it is sent
        request = GenerationRequest(messages=body["messages"], max_tokens=4)  # type: ignore[arg-type]
        with pytest.raises(Exception, match="does not fit the engine's context of 512") as info:
            backend.generate(request)
        assert info.value.needed == error.needed  # type: ignore[attr-defined]


def test_a_restart_fails_the_call_in_flight_and_forgets_the_slots(server: LlamaServer) -> None:
    with LlamaCppBackend(server.base_url) as backend:
        restarts: list[int] = []
        backend.on_restart(lambda: restarts.append(backend.num_restarts))
        backend.open_budget("agent", max_blocks=28)
        request = GenerationRequest(messages=[{"role": "user", "content": "Plan."}], budget="agent")
        backend.generate(GenerationRequest(messages=request.messages, max_tokens=4, budget="agent"))
        assert backend.slot_of("agent") is not None
        server.kill()
        with pytest.raises(BackendUnavailable):
            backend.generate(GenerationRequest(messages=request.messages, budget="agent"))
        server.start()
        result = backend.generate(
            GenerationRequest(messages=request.messages, max_tokens=4, budget="agent")
        )
        assert result.cached_tokens == 0  # the new server's slots hold nothing
        assert restarts == [1]
        assert backend.slot_of("agent") is not None  # the budget lives on, on a new slot


def test_a_stream_through_a_slot_ends_with_its_result(server: LlamaServer) -> None:
    backend = LlamaCppBackend(server.base_url)
    backend.open_budget("agent", max_blocks=28)
    messages = [{"role": "user", "content": "Worker 0: find the failing test."}]

    async def main() -> list[object]:
        try:
            request = GenerationRequest(messages=messages, max_tokens=6, budget="agent")
            return [chunk async for chunk in backend.astream(request)]
        finally:
            await backend.aclose()

    chunks = asyncio.run(main())
    result = chunks[-1].result  # type: ignore[attr-defined]
    assert result is not None and result.completion_tokens == 6
    assert result.prompt_tokens == backend.count_messages(messages)
    assert "".join(c.text for c in chunks[:-1]) == result.text  # type: ignore[attr-defined]
    assert backend.metrics().num_requests_running == 0


def test_unified_kv_is_one_pool_and_health_follows_the_server(binary: str, model: Path) -> None:
    args = ["-c", str(2 * SLOT_CTX), "-np", "2", "--kv-unified"]
    with (
        llama_server(binary, model, args=args) as unified,
        LlamaCppBackend(unified.base_url, kv_unified=True) as backend,
    ):
        capacity = backend.capacity()  # without --metrics: read from /props and /slots
        # Each slot may grow to the whole pool, and the pool is all there is.
        assert (capacity.num_blocks, capacity.max_model_len) == (2 * SLOT_CTX // 16, 1024)
        assert backend.health().ok
        unified.kill()
        health = backend.health()
        assert not health.ok and "ConnectError" in health.detail


def test_without_a_slot_save_path_offload_is_refused_and_the_slot_kept(
    binary: str, model: Path
) -> None:
    with (
        llama_server(binary, model, args=ARGS) as plain,
        LlamaCppBackend(plain.base_url) as backend,
    ):
        backend.open_budget("agent", max_blocks=28)
        messages = [{"role": "user", "content": "Plan."}]
        first = backend.generate(GenerationRequest(messages=messages, max_tokens=4, budget="agent"))
        slot = backend.slot_of("agent")
        with pytest.raises(BackendError, match="--slot-save-path") as info:
            backend.offload(budget="agent")
        assert not info.value.retriable  # asking again never helps
        assert backend.slot_of("agent") == slot  # the KV stays where it is, and is found
        again = backend.generate(GenerationRequest(messages=messages, max_tokens=4, budget="agent"))
        assert again.cached_tokens == first.prompt_tokens - 1
        # llama-server counts every prompt token it was sent and each it found cached.
        reading = backend.reading(fresh=True)
        assert reading.prefix_cache_queries == first.prompt_tokens + again.prompt_tokens
        assert reading.prefix_cache_hits == again.cached_tokens


def test_a_slot_another_tenant_used_is_erased_first(binary: str, model: Path) -> None:
    messages = [{"role": "user", "content": f"Worker 0: find the failing test.\n{TOOL_OUTPUT}"}]
    with (
        llama_server(binary, model, args=["-c", str(SLOT_CTX), "-np", "1"]) as one,
        LlamaCppBackend(one.base_url) as backend,
    ):

        def call(budget: str, tenant: str) -> int:
            backend.open_budget(budget, max_blocks=28)
            request = GenerationRequest(
                messages=messages, max_tokens=4, budget=budget, cache_salt=tenant
            )
            result = backend.generate(request)
            backend.close_budget(budget)
            return result.cached_tokens

        prompt = backend.count_messages(messages)
        assert call("a-1", "tenant-a") == 0
        # The same tenant's next agent on the slot reuses the prompt cached there...
        assert call("a-2", "tenant-a") == prompt - 1
        # ...another tenant's finds nothing of it, though it sends the very same prompt.
        assert call("b-1", "tenant-b") == 0
        assert call("b-2", "tenant-b") == prompt - 1


def test_two_backends_budgets_of_one_name_save_to_files_of_their_own(
    server: LlamaServer, tmp_path: Path
) -> None:
    """Two clients of one server, each with a budget named ``planner``: each restore finds
    its own prompt in the slot, never the other's."""
    prompts = {
        "a": [{"role": "user", "content": f"Worker 0: find the failing test.\n{TOOL_OUTPUT}"}],
        "b": [{"role": "user", "content": "Plan the merge of every branch, then run it."}],
    }
    backends = {name: LlamaCppBackend(server.base_url) for name in prompts}
    requests = {
        name: GenerationRequest(messages=prompts[name], max_tokens=4, budget="planner")
        for name in prompts
    }
    try:
        first = {}
        for name, backend in backends.items():  # a saves, then b saves: b's never over a's
            backend.open_budget("planner", max_blocks=28)
            first[name] = backend.generate(requests[name])
            backend.offload(budget="planner")
        files = sorted(p.name for p in tmp_path.iterdir())
        assert len(files) == 2 and all(f.startswith("kvgov-planner-") for f in files)
        for name, backend in backends.items():
            backend.restore(budget="planner")
            again = backend.generate(requests[name])
            # its own prompt was in the restored slot: all of it but the last token
            assert again.cached_tokens == first[name].prompt_tokens - 1
    finally:
        for backend in backends.values():
            backend.close()


def test_slot_files_are_named_apart_by_backend_tenant_and_budget() -> None:
    names = [
        slot_filename(backend=backend, cache_salt=salt, budget=budget)
        for backend in ("http://127.0.0.1:8080 1", "http://127.0.0.1:8080 2")
        for salt in (None, "acme", "globex")
        for budget in ("planner", "研究员", "分析师", "a/b", "a b", "a_b", "a.b", "../x", "")
    ]
    assert len(set(names)) == len(names) == 2 * 3 * 9
    for name in names:  # what llama-server's fs_validate_filename takes, under any folder
        assert re.fullmatch(r"kvgov-[A-Za-z0-9_-]{1,32}-[0-9a-f]{32}\.bin", name), name
    assert slot_filename(backend="x", cache_salt=None, budget="研究员").startswith("kvgov-___-")


def test_without_the_binary_these_tests_skip_but_fail_under_ci(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KVGOV_LLAMA_SERVER", str(tmp_path / "no-llama-server"))
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing named llama-server on it
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)  # the run below is CI's, whole
    with pytest.raises(pytest.skip.Exception, match="KVGOV_LLAMA_SERVER"):
        need_llama_server()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(BaseException) as caught:  # a skip too, which would skip this test
        need_llama_server()
    assert caught.type is pytest.fail.Exception
    assert "CI must run them: set KVGOV_LLAMA_SERVER" in str(caught.value)
    # This module as CI runs it, with no binary: every test fails, none skips. (It runs
    # every test but this one, which would run itself again.)
    command = [sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider"]
    command += ["-k", "not fail_under_ci and not named_apart", "-rfEs"]
    root = Path(__file__).resolve().parents[3]
    ran = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 1, ran.stdout[-2000:]
    summary = ran.stdout.strip().splitlines()[-1]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", summary)}
    assert set(counts) == {"deselected", "errors"} and counts["errors"] >= 10, summary
