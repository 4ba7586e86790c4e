"""``OpenAICompatibleBackend`` end to end against ``transformers serve`` (a server nobody
here wrote, CPU, the engine's ``tiny-random`` preset exported to a folder by
``engine.export_preset``, which gives the engine's greedy tokens),
and the parts that need no server: the engines' context-length 400s, the client-side
ceilings and budgets, the one-time warning for a field an engine does not expose.

``transformers serve`` has no ``/tokenize`` and says no KV capacity: the backend counts
with the local tokenizer it is given (the folder's) and admits against the capacity
declared.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from backends.http.errors import error_from_response
from backends.http.probe import EngineReading
from backends.openai._engine_state import EngineState
from backends.openai._limits import Limits
from backends.openai.backend import OpenAICompatibleBackend
from governor import (
    AgentSpec,
    BackendError,
    GenerationRequest,
    Governor,
    GovernorConfig,
    GovernorEvent,
)
from tests.transformers_server import TransformersServer, missing, transformers_server

AGENT = AgentSpec(name="agent", ceiling_tokens=48)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TransformersServer, Any]]:
    reason = missing()
    if reason is not None:
        pytest.skip(reason)
    import transformers

    from engine import export_preset

    folder = export_preset(tmp_path_factory.mktemp("tiny-random"), seed=0)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    with transformers_server(folder) as server:
        yield server, tokenizer


def _backend(served: tuple[TransformersServer, Any]) -> OpenAICompatibleBackend:
    server, tokenizer = served
    return OpenAICompatibleBackend(
        server.base_url,
        model=str(server.model),
        capacity=(32, 16),
        max_model_len=512,
        tokenizer=tokenizer,
    )


def test_transformers_serve_governed_end_to_end(
    served: tuple[TransformersServer, Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="kvgov")
    backend = _backend(served)
    capacity = backend.capacity()
    assert (capacity.num_blocks, capacity.block_size, capacity.max_model_len) == (32, 16, 512)
    governor = Governor(backend, config=GovernorConfig(park_after_s=0), agents=[AGENT])
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)
    history = [{"role": "user", "content": "the agent finds the failing test"}]

    async def main() -> list[str]:
        try:
            async with governor.lease("agent") as lease:
                await governor.acomplete(lease, history)  # as long as the ceiling allows
                return [
                    chunk.text
                    async for chunk in governor.astream(lease, history)
                    if chunk.result is None
                ]
        finally:
            await backend.aclose()

    pieces = asyncio.run(main())
    finished = [e.attributes for e in events if e.kind == "call.finished"]
    assert len(finished) == 2 and pieces
    prompt = backend.count_messages(history)
    for call in finished:
        assert call["prompt_tokens"] == prompt  # the local count is the server's
        assert call["prompt_tokens"] + call["completion_tokens"] <= AGENT.ceiling_tokens
    # The server says neither its capacity nor its context: each warned once, by name.
    warnings = sorted(r.getMessage() for r in caplog.records if r.name == "kvgov")
    assert len(warnings) == 2
    assert "KV capacity" in warnings[0] and "context length" in warnings[1]


def test_the_cap_sent_is_what_the_ceiling_leaves(served: tuple[TransformersServer, Any]) -> None:
    with _backend(served) as backend:
        messages = [{"role": "user", "content": "the agent finds the failing test"}]
        ceiling = backend.count_messages(messages) + 6
        request = GenerationRequest(messages=messages, ceiling_tokens=ceiling, max_tokens=400)
        result = backend.generate(request)
        assert result.prompt_tokens == backend.count_messages(messages)
        # The seeded random model, greedy, never says end of text this early: the cap the
        # ceiling set is reached, and named as the bundled engine names it.
        assert result.prompt_tokens + result.completion_tokens == ceiling
        assert result.finish_reason == "ceiling"


def test_the_served_export_generates_the_engines_greedy_tokens(
    served: tuple[TransformersServer, Any],
) -> None:
    from engine import Engine, EngineConfig, SamplingParams

    messages = [{"role": "user", "content": "Fix tests/test_api.py:88 (error 503) 🤖"}]
    with _backend(served) as backend:
        result = backend.generate(GenerationRequest(messages=messages, max_tokens=8))
    engine = Engine(EngineConfig(num_blocks=16, seed=0))
    prompt = engine.tokenizer.encode_chat(messages)
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    ours = engine.generate(prompt, greedy)[0]
    assert result.prompt_tokens == len(prompt)  # the server's count of the same prompt
    assert result.completion_tokens == len(ours.token_ids) == 8
    assert result.text == ours.text


def test_a_prompt_over_its_ceiling_is_refused_before_it_is_sent(
    served: tuple[TransformersServer, Any],
) -> None:
    with _backend(served) as backend:
        messages = [{"role": "user", "content": "the failing test " * 20}]
        needed = backend.count_messages(messages)
        request = GenerationRequest(messages=messages, ceiling_tokens=needed, max_tokens=4)
        with pytest.raises(BackendError) as info:
            backend.generate(request)
        assert type(info.value).__name__ == "CeilingExceededError"
        assert (info.value.needed, info.value.available) == (needed, needed)  # type: ignore[attr-defined]
        assert backend.metrics().num_requests_running == 0


# -- the context 400 of each engine, as its source writes it ----------------------------
CONTEXT_400S = {
    # OpenAI's API (and what vLLM's newer servers send in the same shape).
    "openai": {
        "error": {
            "message": "This model's maximum context length is 8192 tokens. However, your "
            "messages resulted in 9000 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    },
    # vLLM's older ErrorResponse, top level (vllm/entrypoints/openai/protocol.py).
    "vllm-old": {
        "object": "error",
        "message": "This model's maximum context length is 2048 tokens. However, you "
        "requested 2100 tokens (2096 in the messages, 4 in the completion). Please reduce "
        "the length of the messages or completion.",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    },
    # vLLM's v1 input processor.
    "vllm": {
        "error": {
            "message": "The decoder prompt (length 5000) is longer than the maximum model "
            "length of 4096. Make sure that `max_model_len` is no smaller than the number "
            "of text tokens.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }
    },
    # llama.cpp's server (the body the real llama-server sent, see test_llamacpp_backend).
    "llama.cpp": {
        "error": {
            "code": 400,
            "message": "request (1097 tokens) exceeds the available context size (1024 "
            "tokens), try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": 1097,
            "n_ctx": 1024,
        }
    },
}


@pytest.mark.parametrize("engine", sorted(CONTEXT_400S))
def test_every_engines_context_400_is_the_typed_error(engine: str) -> None:
    body = json.dumps(CONTEXT_400S[engine]).encode()
    error = error_from_response(400, body, backend=engine)
    assert type(error).__name__ == "CeilingExceededError"
    assert error.retriable is False
    if engine == "llama.cpp":
        assert (error.needed, error.available) == (1097, 1024)  # type: ignore[attr-defined]


def test_another_400_stays_a_plain_backend_error() -> None:
    body = json.dumps({"error": {"message": "temperature must be >= 0", "code": 400}}).encode()
    assert type(error_from_response(400, body, backend="vllm")) is BackendError


# -- client-side ceilings and budgets ---------------------------------------------------
def test_the_cap_sent_is_the_least_of_the_ceiling_the_budget_and_the_context() -> None:
    limits = Limits(block_size=16, backend="openai")
    limits.open("lease", 4)  # 64 tokens
    by_ceiling = limits.admit(
        prompt_tokens=20, max_tokens=100, ceiling=30, budget="lease", max_model_len=512
    )
    assert (by_ceiling.max_tokens, by_ceiling.limited_by) == (10, "ceiling")
    # The first call holds 30 of the budget's 64 tokens while it runs.
    by_budget = limits.admit(
        prompt_tokens=20, max_tokens=100, ceiling=None, budget="lease", max_model_len=512
    )
    assert (by_budget.max_tokens, by_budget.limited_by) == (14, "budget")
    with pytest.raises(BackendError, match="budget 'lease'"):
        limits.admit(
            prompt_tokens=20, max_tokens=1, ceiling=None, budget="lease", max_model_len=512
        )
    limits.release(by_ceiling)
    limits.release(by_budget)
    assert limits.tokens_reserved() == 0 and limits.num_calls == 0
    by_context = limits.admit(
        prompt_tokens=500, max_tokens=100, ceiling=None, budget=None, max_model_len=512
    )
    assert (by_context.max_tokens, by_context.limited_by) == (12, None)
    # "length" at a cap the ceiling lowered is the ceiling, as the bundled engine says.
    assert limits.finish_reason(by_ceiling, "length", 10) == "ceiling"
    assert limits.finish_reason(by_ceiling, "stop", 3) == "stop"
    assert limits.finish_reason(by_context, "length", 12) == "length"


class _Probe:
    engine = "test"

    def __init__(self) -> None:
        self.readings = [
            EngineReading(prefix_cache_queries=100, missing=("a KV usage gauge",)),
            EngineReading(prefix_cache_queries=150, missing=("a KV usage gauge",)),
            EngineReading(prefix_cache_queries=20, missing=("a KV usage gauge",)),
        ]

    def read(self, http: object) -> EngineReading:
        return self.readings.pop(0)


def test_a_missing_field_warns_once_and_a_counter_going_down_is_a_new_instance(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="kvgov")
    state = EngineState(_Probe(), http=object(), interval_s=0.0)  # type: ignore[arg-type]
    instances = [state.instance_of(state.read(fresh=True)) for _ in range(3)]
    assert instances[0] == instances[1] != instances[2]
    assert len([r for r in caplog.records if "KV usage gauge" in r.getMessage()]) == 1


def test_a_slot_goes_to_the_budget_idle_longest_never_to_one_held_or_busy() -> None:
    from backends.openai._llamacpp_slots import SlotTable

    table = SlotTable()
    table.resize([0, 1])
    assert [table.begin(name)[0] for name in ("a", "b")] == [0, 1]
    assert table.begin("c") == (None, False)  # both busy: the server picks
    table.end("a")
    table.end("b")
    table.hold("a", True)  # a retained its context: its slot is kept for it
    assert table.begin("c") == (1, False)  # b's, idle; same tenant (None): nothing to hide
    table.end("c")
    table.hold("a", False)
    assert table.begin("d", "other-tenant") == (0, True)  # a's, idle longest; a's tenant
    assert table.owners() == {0: "d", 1: "c"}
    assert table.slot_of("a") is None and table.slot_of("b") is None
