"""VLLMBackend and SGLangBackend against the FAKE engines of tests/fake_engines.py (served
by uvicorn on loopback; vLLM and SGLang need CUDA): capacity from the probe, the body
fields each engine takes (cache_salt per tenant, priority in its polarity, only where it
schedules by priority), vLLM's priority refusal, the context-length 400s, and a call in
flight when the engine dies and restarts."""

from __future__ import annotations

import asyncio

import pytest

from backends.openai.sglang import SGLangBackend
from backends.openai.vllm import VLLMBackend
from governor import AgentSpec, BackendError, BackendUnavailable, GenerationRequest, Governor
from tests.fake_engines import FakeEngine, serving


def _request(**options) -> GenerationRequest:
    return GenerationRequest(
        messages=[{"role": "user", "content": "one two three"}], max_tokens=4, **options
    )


def test_vllm_capacity_salt_and_negated_priority():
    fake = FakeEngine("vllm")
    with (
        serving(fake) as url,
        VLLMBackend(url, model="Qwen/Qwen3-8B", priority_scheduling=True, salt_key=b"k") as backend,
    ):
        assert backend.reading().num_tokens == 27910 * 16
        backend.generate(_request(cache_salt="acme", priority=3))
        backend.generate(_request(cache_salt="globex", priority=0))
    first, second = fake.requests
    assert first["priority"] == -3 and "priority" not in second
    assert first["cache_salt"] != second["cache_salt"]
    assert "acme" not in first["cache_salt"] and len(first["cache_salt"]) == 43


def test_vllm_sends_no_priority_unless_it_knows_the_policy():
    fake = FakeEngine("vllm")
    with serving(fake) as url, VLLMBackend(url, model="m") as backend:
        backend.generate(_request(priority=3))
    assert "priority" not in fake.requests[0]


def test_sglang_priority_polarity_from_server_info():
    fake = FakeEngine("sglang", fixtures="dp2")  # low values first
    with serving(fake) as url, SGLangBackend(url, model="m") as backend:
        assert backend.reading().num_tokens == 2 * 327680
        backend.generate(_request(priority=3, cache_salt="acme"))
    assert fake.requests[0]["priority"] == -3 and "cache_salt" in fake.requests[0]
    fake = FakeEngine("sglang")  # no priority scheduling
    with serving(fake) as url, SGLangBackend(url, model="m") as backend:
        backend.generate(_request(priority=3))
    assert "priority" not in fake.requests[0]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_prompt_over_the_probed_context_is_refused_before_it_is_sent(engine):
    fake = FakeEngine(engine, max_model_len=8)
    backend_cls = VLLMBackend if engine == "vllm" else SGLangBackend
    with (
        serving(fake) as url,
        backend_cls(url, model="m", tokenizer=_Words()) as backend,
        pytest.raises(BackendError) as caught,
    ):
        backend.generate(GenerationRequest(prompt=" ".join(["w"] * 20), max_tokens=1))
    assert type(caught.value).__name__ == "CeilingExceededError"
    assert fake.requests == []  # max_model_len read off /v1/models


class _Words:
    def count(self, text: str) -> int:
        return len(text.split())

    def count_messages(self, messages) -> int:
        return sum(len(str(m.get("content", "")).split()) for m in messages)

    def encode(self, text: str) -> list[int]:
        return list(range(len(text.split())))


@pytest.mark.parametrize(
    "fixture",
    [
        "vllm/error_context_length.json",
        "sglang/error_context_length.json",
        "sglang/error_total_tokens.json",
    ],
)
def test_the_engines_recorded_context_400s_are_the_typed_error(fixture):
    from pathlib import Path

    from backends.http.errors import error_from_response

    body = (Path(__file__).resolve().parent.parent / "fixtures" / fixture).read_bytes()
    error = error_from_response(400, body, backend="x")
    assert type(error).__name__ == "CeilingExceededError" and not error.retriable


@pytest.mark.parametrize("how", ["sync", "async", "stream"])
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_call_in_flight_when_the_engine_restarts_fails_and_holds_nothing(engine, how):
    fake = FakeEngine(engine, dies_under_a_call=True)
    backend_cls = VLLMBackend if engine == "vllm" else SGLangBackend
    messages = [{"role": "user", "content": "one two three"}]
    with (
        serving(fake) as url,
        # readings kept for a minute: only the failed call makes the backend look again
        backend_cls(url, model="m", read_interval_s=60.0) as backend,
    ):
        restarts: list[int] = []
        backend.on_restart(lambda: restarts.append(backend.num_restarts))
        governor = Governor(backend, agents=[AgentSpec(name="agent", ceiling_tokens=64)])

        async def call(lease) -> list[str]:
            if how == "sync":  # generate, on a thread of its own
                done = await asyncio.to_thread(governor.complete, lease, messages, max_tokens=4)
                return [done.text]
            if how == "async":
                return [(await governor.acomplete(lease, messages, max_tokens=4)).text]
            return [c.text async for c in governor.astream(lease, messages, max_tokens=4)]

        async def run() -> None:
            async with governor.lease("agent") as lease:
                in_flight = asyncio.create_task(call(lease))
                assert await asyncio.to_thread(fake.call_arrived.wait, 10.0)
                assert backend._limits.num_calls == 1  # it holds its reservation now
                fake.restart()  # the engine dies under the call, and comes back
                with pytest.raises(BackendUnavailable) as caught:
                    await in_flight
                assert caught.value.retriable
                # nothing of the failed call is held: its reservation went back
                assert backend._limits.num_calls == 0
                assert backend._limits.tokens_reserved() == 0
                assert restarts == []  # not known yet: the next call looks first
                again = await call(lease)
                assert "".join(again) == "tok tok tok tok"  # the restarted engine answers
                assert restarts == [1]
                assert list(backend._limits.budgets()) == [lease.budget]  # it lives on

        asyncio.run(run())
        assert backend._limits.budgets() == {}
        assert (backend._limits.num_calls, backend._limits.tokens_reserved()) == (0, 0)
        assert governor.admission.ledger() == (0, 0, 0, 0)
    assert len(fake.requests) == 2
