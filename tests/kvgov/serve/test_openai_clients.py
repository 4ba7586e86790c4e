"""The real ``openai`` client and LangChain's ``ChatOpenAI`` against ``kvgov serve``,
over real sockets (a uvicorn server on 127.0.0.1), unchanged: only ``base_url`` and
``api_key`` point them here. kvgov's extras go in ``extra_body``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.messages import AIMessageChunk
from langchain_openai import ChatOpenAI
from openai import OpenAI

from backends.local.backend import LocalBackend
from kvgov.serve.background import serving
from kvgov.serve.security import tenant_id
from kvgov.serve.tenancy import scoped_budget
from tests.kvgov.serve.api_support import idle_metrics, served_app

KEY = "sk-clients-test"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name three colours."},
]


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, LocalBackend]]:
    with served_app(api_keys=(KEY,)) as (app, backend), serving(app) as url:
        yield url, backend


@pytest.fixture
def client(server: tuple[str, LocalBackend]) -> Iterator[OpenAI]:
    url, backend = server
    with OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=60) as client:
        yield client
    assert idle_metrics(backend).num_blocks_in_use == 0  # nothing held after a test


def test_chat_completion_matches_the_engine_and_counts_usage(
    client: OpenAI, server: tuple[str, LocalBackend]
) -> None:
    _, backend = server
    reply = client.chat.completions.create(
        model="tiny-random", messages=MESSAGES, max_tokens=6, temperature=0
    )
    prompt_tokens = backend.count_messages(MESSAGES)
    choice = reply.choices[0]
    assert reply.object == "chat.completion" and reply.model == "tiny-random"
    assert choice.message.role == "assistant" and choice.finish_reason == "length"
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == prompt_tokens
    assert reply.usage.completion_tokens == 6
    assert reply.usage.total_tokens == prompt_tokens + 6
    # the same greedy call through the backend in process gives the same text
    from governor.backend import GenerationRequest

    direct = backend.generate(GenerationRequest(messages=MESSAGES, max_tokens=6))
    assert choice.message.content == direct.text
    # the second call found the first's prompt blocks in the prefix cache
    assert reply.usage.prompt_tokens_details is not None
    again = client.chat.completions.create(
        model="tiny-random", messages=MESSAGES, max_completion_tokens=6, temperature=0
    )
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached == (prompt_tokens // 16) * 16  # every full block of the prompt


def test_streamed_chat_joins_to_the_whole_answer_and_ends_with_usage(client: OpenAI) -> None:
    whole = client.chat.completions.create(
        model="tiny-random", messages=MESSAGES, max_tokens=8, temperature=0
    )
    stream = client.chat.completions.create(
        model="tiny-random",
        messages=MESSAGES,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason is not None]
    assert [c.choices[0].finish_reason for c in finals] == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 8
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_plain_and_streamed(client: OpenAI) -> None:
    reply = client.completions.create(
        model="tiny-random", prompt="Once upon a time", max_tokens=5, temperature=0, stop=["\n"]
    )
    assert reply.object == "text_completion" and reply.usage is not None
    assert reply.usage.prompt_tokens == 4
    stream = client.completions.create(
        model="tiny-random",
        prompt="Once upon a time",
        max_tokens=5,
        temperature=0,
        stop=["\n"],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == reply.choices[0].text
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == reply.usage.completion_tokens


def test_seeded_sampling_repeats(client: OpenAI) -> None:
    def sample() -> str | None:
        reply = client.chat.completions.create(
            model="tiny-random", messages=MESSAGES, max_tokens=8, temperature=1.0, seed=7
        )
        return reply.choices[0].message.content

    assert sample() == sample()


def test_temperature_seed_and_top_p_reach_the_engine(client: OpenAI) -> None:
    """A server that answered every call greedily, or dropped ``top_p``, would pass the
    repeat above; these answers tell each setting apart (token ids: text could hide a
    difference in how tokens split)."""

    def tokens(**sampling: Any) -> list[int]:
        reply = client.chat.completions.create(
            model="tiny-random",
            messages=MESSAGES,
            max_tokens=8,
            extra_body={"return_token_ids": True},
            **sampling,
        )
        ids: list[int] = reply.model_dump()["choices"][0]["token_ids"]
        assert len(ids) == 8
        return ids

    greedy = tokens(temperature=0)
    seven, eight = tokens(temperature=1.0, seed=7), tokens(temperature=1.0, seed=8)
    assert seven != greedy and eight != greedy and seven != eight
    assert tokens(temperature=1.0, seed=7, top_p=1.0) == seven  # 1.0 turns top-p off
    # top_p keeps the fewest likeliest tokens that hold that much probability: a tiny one
    # keeps only the likeliest, so every seed draws the greedy answer
    for seed in (7, 8):
        assert tokens(temperature=1.0, seed=seed, top_p=1e-6) == greedy


def test_extras_token_ids_ceiling_and_salt(
    client: OpenAI, server: tuple[str, LocalBackend]
) -> None:
    _, backend = server
    prompt_ids = backend.tokenizer.encode_chat(MESSAGES)
    reply = client.chat.completions.create(
        model="tiny-random",
        messages=MESSAGES,
        max_tokens=50,
        temperature=0,
        extra_body={
            "return_token_ids": True,
            "ceiling_tokens": len(prompt_ids) + 3,
            "priority": -1,
            "cache_salt": "fresh-salt",
        },
    )
    body = reply.model_dump()
    choice = body["choices"][0]
    assert body["prompt_token_ids"] == prompt_ids
    assert len(choice["token_ids"]) == 3 == body["usage"]["completion_tokens"]
    assert choice["finish_reason"] == "length" and choice["kvgov_finish_reason"] == "ceiling"
    assert backend.tokenizer.decode(choice["token_ids"]) == choice["message"]["content"]
    # a salt no earlier call used: nothing cached, though the same prompt ran before
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0

    stream = client.chat.completions.create(
        model="tiny-random",
        messages=MESSAGES,
        max_tokens=4,
        temperature=0,
        stream=True,
        extra_body={"return_token_ids": True},
    )
    chunks = [c.model_dump() for c in stream]
    assert chunks[0]["prompt_token_ids"] == prompt_ids
    assert all("prompt_token_ids" not in c or c["prompt_token_ids"] is None for c in chunks[1:])
    streamed_ids = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    assert len(streamed_ids) == 4
    assert chunks[-1]["choices"][0]["kvgov_finish_reason"] == "length"


def test_budget_and_retain_keep_the_kv_until_released(
    client: OpenAI, server: tuple[str, LocalBackend]
) -> None:
    _, backend = server
    # what the control plane does for this key's tenant (POST /kvgov/v1/budgets)
    budget = scoped_budget(tenant_id(KEY), "agent-1")
    backend.open_budget(budget, max_blocks=8)
    try:
        reply = client.chat.completions.create(
            model="tiny-random",
            messages=MESSAGES,
            max_tokens=4,
            temperature=0,
            extra_body={"budget": "agent-1", "retain": True},
        )
        assert reply.usage is not None
        held = backend.metrics().num_blocks_in_use
        # the full blocks of the context (its last token is never written to the KV)
        # stay resident
        assert held == (reply.usage.total_tokens - 1) // 16
        backend.release_retained(budget=budget)
        assert backend.metrics().num_blocks_in_use == 0
    finally:
        backend.close_budget(budget)


def test_models_lists_the_served_model(client: OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny-random"]
    assert models.data[0].model_dump()["max_model_len"] == 32768


def test_langchain_chat_openai_invokes_and_streams(server: tuple[str, LocalBackend]) -> None:
    url, backend = server
    model = ChatOpenAI(
        base_url=f"{url}/v1",
        api_key=KEY,
        model="tiny-random",
        max_tokens=6,
        temperature=0,
        max_retries=0,
        stream_usage=True,
    )
    message = model.invoke([("system", "You are terse."), ("user", "Name three colours.")])
    assert message.usage_metadata is not None
    assert message.usage_metadata["output_tokens"] == 6
    assert message.usage_metadata["input_tokens"] == backend.count_messages(MESSAGES)
    pieces = list(model.stream([("system", "You are terse."), ("user", "Name three colours.")]))
    assert all(isinstance(p, AIMessageChunk) for p in pieces)
    assert "".join(str(p.content) for p in pieces) == message.content
    joined = pieces[0]
    for piece in pieces[1:]:
        joined = joined + piece
    assert joined.usage_metadata is not None and joined.usage_metadata["output_tokens"] == 6
    assert idle_metrics(backend).num_blocks_in_use == 0


def test_remote_backend_sends_its_key_on_every_route(server: tuple[str, LocalBackend]) -> None:
    """RemoteBackend's own HTTP/1.1 transport carries the key (and without it, 401)."""
    from backends.remote.backend import RemoteBackend
    from governor import BackendError, GenerationRequest

    url, _ = server
    request = GenerationRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    with RemoteBackend(url, api_key=KEY) as remote:
        assert remote.generate(request).completion_tokens == 2
        assert remote.capacity().num_blocks > 0

        async def streamed() -> int:
            return sum([len(c.token_ids) async for c in remote.astream(request)])

        assert asyncio.run(streamed()) == 2
    with RemoteBackend(url, api_key="sk-wrong") as remote, pytest.raises(BackendError) as refused:
        remote.generate(request)
    assert type(refused.value).__name__ == "AuthenticationError"


def test_a_retain_call_says_what_the_engine_held(server: tuple[str, LocalBackend]) -> None:
    """``retain`` holds the context as the call ends; ``usage.kvgov_retained_tokens`` says
    how much, and RemoteBackend reads it (sync and streamed) so the governor need not ask."""
    from backends.remote.backend import RemoteBackend
    from governor import GenerationRequest

    url, _ = server
    with RemoteBackend(url, api_key=KEY) as remote:
        remote.open_budget("held", max_blocks=16)
        words = " ".join(f"w{i}" for i in range(40))
        request = GenerationRequest(
            messages=[{"role": "user", "content": words}], max_tokens=4, budget="held", retain=True
        )
        result = remote.generate(request)
        assert result.retained_tokens > 0
        assert result.retained_tokens == (result.prompt_tokens + 3) // 16 * 16  # full blocks

        async def streamed() -> int:
            chunks = [c async for c in remote.astream(request)]
            assert chunks[-1].result is not None
            return chunks[-1].result.retained_tokens

        assert asyncio.run(streamed()) == result.retained_tokens
        plain = remote.generate(GenerationRequest(messages=request.messages, max_tokens=4))
        assert plain.retained_tokens == 0
        remote.close_budget("held")
