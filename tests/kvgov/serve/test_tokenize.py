"""``/tokenize`` and ``/detokenize`` over a real server: the ids are the engine
tokenizer's, a chat's are the very ids the chat route prefills (its chat template's),
and the ids come back to the text. Fields are vLLM's (``TokenizeCompletionRequest``,
``TokenizeChatRequest``, ``TokenizeResponse``, ``DetokenizeRequest``,
``DetokenizeResponse``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from backends.local.backend import LocalBackend
from kvgov.serve.background import serving
from tests.kvgov.serve.api_support import served_app

TEXT = "The governor grants context like memory: requested, grown, returned."
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name three colours."},
]


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[httpx.Client, LocalBackend]]:
    with (
        served_app() as (app, backend),
        serving(app) as url,
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        yield client, backend


def post(client: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def test_a_prompt_is_the_engine_tokenizers_ids(server: tuple[httpx.Client, LocalBackend]) -> None:
    client, backend = server
    expected = backend.tokenizer.encode(TEXT)
    answer = post(client, "/tokenize", {"prompt": TEXT})
    assert answer == {
        "count": len(expected),
        "max_model_len": backend.capacity().max_model_len,
        "tokens": expected,
    }
    assert len(expected) > 5
    # what a completion of this text prefills, as the engine counted it
    completion = post(client, "/v1/completions", {"prompt": TEXT, "max_tokens": 1})
    assert completion["usage"]["prompt_tokens"] == answer["count"]


def test_messages_are_the_chat_templates_ids(server: tuple[httpx.Client, LocalBackend]) -> None:
    client, backend = server
    tokenizer = backend.tokenizer
    answer = post(client, "/tokenize", {"messages": MESSAGES})
    assert answer["tokens"] == tokenizer.encode_chat(MESSAGES)
    assert answer["count"] == len(answer["tokens"])
    # the very ids the chat route prefills for these messages
    body = {"messages": MESSAGES, "max_tokens": 1, "temperature": 0, "return_token_ids": True}
    chat = post(client, "/v1/chat/completions", body)
    assert chat["prompt_token_ids"] == answer["tokens"]
    # without the assistant's opening the template ends after the last message
    bare = post(client, "/tokenize", {"messages": MESSAGES, "add_generation_prompt": False})
    assert bare["tokens"] == tokenizer.encode_chat(MESSAGES, add_generation_prompt=False)
    assert len(bare["tokens"]) < answer["count"]
    assert answer["tokens"][: len(bare["tokens"])] == bare["tokens"]
    # add_special_tokens adds the tokenizer's own on top of the template (vLLM's meaning;
    # this tokenizer has no BOS, so the ids stay the template's)
    special = post(client, "/tokenize", {"messages": MESSAGES, "add_special_tokens": True})
    template = tokenizer.apply_chat_template(MESSAGES)
    assert special["tokens"] == tokenizer.encode(template, add_special_tokens=True)


def test_ids_come_back_to_their_text(server: tuple[httpx.Client, LocalBackend]) -> None:
    client, backend = server
    for body, text in [
        ({"prompt": TEXT}, TEXT),
        ({"prompt": "emoji 🙂 and 中文 too"}, "emoji 🙂 and 中文 too"),
        ({"messages": MESSAGES}, backend.tokenizer.apply_chat_template(MESSAGES)),
    ]:
        tokens = post(client, "/tokenize", body)["tokens"]
        assert post(client, "/detokenize", {"tokens": tokens}) == {"prompt": text}
    assert post(client, "/detokenize", {"tokens": []}) == {"prompt": ""}


def test_ids_past_the_vocabulary_are_a_400(server: tuple[httpx.Client, LocalBackend]) -> None:
    client, backend = server
    vocab = backend.tokenizer.vocab_size
    response = client.post("/detokenize", json={"tokens": [1, vocab, vocab + 7]})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "tokens" and error["code"] == "invalid_token_ids"
    assert f"0..{vocab - 1}" in error["message"] and str(vocab) in error["message"]
