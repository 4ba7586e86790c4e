"""``LocalBackend``'s engine-free helpers: the commands it queued without waiting, which
prompts are tokenized on the engine thread, and the engine's metrics, capacity and
completions as the governor's types (read by attribute, so this module imports nothing
of engine/; the layering rules keep that to ``backends.local.backend``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Collection, Mapping
from dataclasses import fields
from typing import Any, Protocol

from governor import (
    BackendCapacity,
    BackendMetrics,
    ConfigError,
    GenerationRequest,
    GenerationResult,
)

__all__ = [
    "UnwaitedCommands",
    "backend_capacity",
    "backend_metrics",
    "check_settings",
    "config_and_engine",
    "generation_result",
    "is_short_prompt",
    "merge_queued",
]

# Prompts up to this many characters are tokenized on the engine thread as they are added
# (a chat of this size encodes in well under a millisecond); longer ones on a worker thread.
SHORT_PROMPT_CHARS = 4096


def is_short_prompt(request: GenerationRequest) -> bool:
    """Whether to tokenize on the engine thread: a cheap bound on the tokenizer's work,
    the characters of text (ids need none) plus 64 a message for the template's share."""
    if request.messages is not None:
        chars = sum(len(str(message.get("content") or "")) + 64 for message in request.messages)
    else:
        chars = len(request.prompt) if isinstance(request.prompt, str) else 0
    return chars <= SHORT_PROMPT_CHARS


def backend_metrics(m: Any) -> BackendMetrics:
    """An ``engine.outputs.EngineMetrics`` as ``BackendMetrics`` (its fields by name)."""
    return BackendMetrics(**{f.name: getattr(m, f.name) for f in fields(BackendMetrics)})


def backend_capacity(cap: Any, weights_bytes: int) -> BackendCapacity:
    """An ``engine.outputs.Capacity`` as ``BackendCapacity``."""
    return BackendCapacity(
        block_size=cap.block_size,
        num_blocks=cap.num_blocks,
        num_free_blocks=cap.num_free_blocks,
        num_pinned_blocks=cap.num_pinned_blocks,
        bytes_per_block=cap.bytes_per_block,
        max_model_len=cap.max_model_len,
        weights_bytes=weights_bytes,
    )


def check_settings(config: Mapping[str, Any], known: Collection[str]) -> None:
    """Refuse an engine setting that is not a field of ``engine.EngineConfig``."""
    unknown = sorted(set(config) - set(known))
    if unknown:
        raise ConfigError(
            f"unknown engine setting(s) {', '.join(map(repr, unknown))}; the settings are the "
            f"fields of engine.EngineConfig: {', '.join(sorted(known))}",
            setting="config",
        )


def config_and_engine() -> ConfigError:
    return ConfigError(
        "pass either an engine (or engine loop) or config, not both; config only builds a "
        "new engine",
        setting="config",
    )


class UnwaitedCommands:
    """The engine commands a backend queued without waiting (budget closes, cancels), so
    that a read can wait for them first and see every change asked before it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # a leaf: nothing is called under it
        self._pending: set[concurrent.futures.Future[Any]] = set()

    def track(self, future: concurrent.futures.Future[Any] | None) -> None:
        if future is None:  # the loop had closed: nothing was queued
            return
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._forget)

    def wait(self) -> None:
        with self._lock:
            pending = list(self._pending)
        if pending:
            concurrent.futures.wait(pending)

    def _forget(self, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._pending.discard(future)


class _Output(Protocol):
    """What ``merge_queued`` reads of ``engine.outputs.RequestOutput``."""

    @property
    def new_text(self) -> str: ...
    @property
    def new_token_ids(self) -> tuple[int, ...]: ...


def merge_queued(
    items: asyncio.Queue[object], first: _Output, output_type: type[_Output]
) -> tuple[str, tuple[int, ...], object]:
    """``first``'s text and token ids with those of the outputs already queued behind it
    (steps a consumer fell behind on, merged into one chunk as vLLM's output collector
    merges them), and the first queued item that is not an ``output_type`` (None: none),
    for the consumer's next turn."""
    text, token_ids = first.new_text, first.new_token_ids
    while not items.empty():
        item = items.get_nowait()
        if not isinstance(item, output_type):
            return text, token_ids, item
        text, token_ids = text + item.new_text, token_ids + item.new_token_ids
    return text, token_ids, None


def generation_result(completion: Any) -> GenerationResult:
    """An engine ``Completion`` as the governor's result."""
    return GenerationResult(
        text=completion.text,
        token_ids=completion.token_ids,
        finish_reason=completion.finish_reason.value,
        prompt_tokens=len(completion.prompt_token_ids),
        completion_tokens=len(completion.token_ids),
        cached_tokens=completion.num_cached_tokens,
        prompt_token_ids=tuple(completion.prompt_token_ids),
        retained_tokens=completion.num_retained_tokens,
        engine_s=completion.latency_s,
    )
