"""The fake vLLM and SGLang servers answer generation in the engines' shapes, and their
too-long-prompt 400s are the recorded bodies (tests/backends/fixtures), so a backend
tested against the fake meets the engines' own errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from tests.fake_engines import FakeEngine, create_app

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_chat_completion_tokenize_and_recorded_request(engine):
    fake = FakeEngine(engine, max_model_len=64)
    with TestClient(create_app(fake)) as client:
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "one two three"}],
            "max_tokens": 4,
            "priority": -2,
            "cache_salt": "s",
        }
        answer = client.post("/v1/chat/completions", json=body).json()
        assert answer["choices"][0]["message"]["content"] == "tok tok tok tok"
        assert answer["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
        assert fake.requests == [body]
        counted = client.post("/tokenize", json={"prompt": "a b c d e"}).json()
        assert (counted["count"], counted["max_model_len"]) == (5, 64)
        stream = client.post("/v1/chat/completions", json={**body, "stream": True}).text
        assert stream.rstrip().endswith("data: [DONE]") and '"usage"' in stream


@pytest.mark.parametrize(
    ("engine", "fixture", "prompt", "max_tokens"),
    [
        ("vllm", "error_context_length.json", 40000, 16),
        ("sglang", "error_context_length.json", 41000, 16),
        ("sglang", "error_total_tokens.json", 40000, 1200),
    ],
)
def test_too_long_prompt_is_the_engines_recorded_400(engine, fixture, prompt, max_tokens):
    recorded = json.loads((FIXTURES / engine / fixture).read_text())
    fake = FakeEngine(engine)
    with TestClient(create_app(fake)) as client:
        body = {"model": "m", "prompt": " ".join(["w"] * prompt), "max_tokens": max_tokens}
        response = client.post("/v1/completions", json=body)
    assert response.status_code == 400
    assert response.json() == recorded
