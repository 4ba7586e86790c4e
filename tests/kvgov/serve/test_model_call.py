"""The per-request path of a non-streamed model call: what it does once that it used to
do twice, with the same answer as the engine in process."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from governor.backend import GenerationRequest
from tests.kvgov.serve.api_support import idle_metrics, served_app

MESSAGES = [{"role": "user", "content": "Summarize the build log of module 7 in one line."}]


def test_return_token_ids_tokenizes_the_prompt_once(monkeypatch: pytest.MonkeyPatch) -> None:
    with served_app() as (app, backend), TestClient(app) as client:
        tokenizer = backend.tokenizer
        expected_prompt = tokenizer.encode_chat(MESSAGES)
        expected = backend.generate(GenerationRequest(messages=MESSAGES, max_tokens=8))
        calls: list[Any] = []
        encode_chat = type(tokenizer).encode_chat

        def counted(self: Any, *args: Any, **kwargs: Any) -> list[int]:
            calls.append(args)
            return encode_chat(self, *args, **kwargs)

        monkeypatch.setattr(type(tokenizer), "encode_chat", counted)
        body = {"messages": MESSAGES, "max_tokens": 8, "temperature": 0, "return_token_ids": True}
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        answer = response.json()
        assert len(calls) == 1  # by the engine; the answer carries its ids
        assert answer["prompt_token_ids"] == expected_prompt
        assert tuple(answer["choices"][0]["token_ids"]) == expected.token_ids
        assert answer["usage"]["prompt_tokens"] == len(expected_prompt)
        assert idle_metrics(backend).num_blocks_in_use == 0
