"""What kvgov reads off an engine it did not build: ``EngineReading`` and ``EngineProbe``.

An external engine (vLLM, SGLang, llama.cpp's llama-server, any OpenAI-compatible
server) says what it can about its KV capacity and pressure on routes of its own
(``/metrics``, ``/server_info``, ``/props``, ``/slots``, ``/v1/models``...). A probe
reads those routes through ``ProbeHTTP`` and returns one ``EngineReading``; the backend
(``OpenAICompatibleBackend`` and its engine-specific subclasses) turns readings into the
governor's ``BackendCapacity`` and ``BackendMetrics`` and notices restarts.

Every field the engine does not expose is ``None``, never a guess: a backend falls back
to what the user declared and warns once (``missing``), so a capacity is never silently
wrong. Probes are synchronous and cheap (a few GETs); async callers run them on a worker
thread. They import no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["EngineProbe", "EngineReading", "ProbeHTTP", "SlotReading"]


@dataclass(frozen=True, slots=True)
class SlotReading:
    """One llama-server slot: its id, its context size and the tokens it holds now."""

    id: int
    n_ctx: int
    num_tokens: int | None = None  # tokens of context cached in the slot
    is_processing: bool | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineReading:
    """One reading of an engine's KV capacity and pressure; ``None``: the engine did not say."""

    block_size: int | None = None  # tokens per KV block (vLLM block_size, SGLang page_size)
    num_blocks: int | None = None  # KV capacity in blocks; tokens = num_blocks x block_size
    # KV capacity in tokens when the engine says it outright (vLLM's kv_cache_size_tokens,
    # SGLang's max_total_num_tokens): for a hybrid model vLLM's blocks x block size is
    # wrong, since one request holds blocks in several KV groups.
    kv_tokens: int | None = None
    max_model_len: int | None = None  # the longest context one request may have
    kv_usage: float | None = None  # fraction of KV in use, 0 to 1
    num_tokens_in_use: int | None = None
    num_requests_running: int | None = None
    num_requests_waiting: int | None = None
    num_preemptions: int | None = None  # a counter since the engine started
    prefix_cache_queries: int | None = None  # a counter, in tokens
    prefix_cache_hits: int | None = None  # a counter, in tokens
    # Anything that changes when the engine restarts (a start time, a version, an id);
    # counters going down also mean a restart.
    instance: str | None = None
    slots: tuple[SlotReading, ...] = ()  # llama-server's, when it lists them
    missing: tuple[str, ...] = ()  # what this engine version did not expose, for one warning
    # The engine's own figures as read, for the record (per data-parallel rank, raw labels).
    raw: Mapping[str, Any] | None = None

    @property
    def num_tokens(self) -> int | None:
        """KV capacity in tokens: as the engine said it, else blocks x block size."""
        if self.kv_tokens is not None:
            return self.kv_tokens
        if self.num_blocks is None or self.block_size is None:
            return None
        return self.num_blocks * self.block_size


@runtime_checkable
class ProbeHTTP(Protocol):
    """The GETs a probe may make, relative to the engine's base URL."""

    def get_text(self, path: str) -> str | None:
        """The body of ``GET path``; ``None`` when the route does not exist (404)."""
        ...

    def get_json(self, path: str) -> Any | None:
        """The JSON of ``GET path``; ``None`` when the route does not exist (404)."""
        ...


@runtime_checkable
class EngineProbe(Protocol):
    @property
    def engine(self) -> str:
        """The engine's name in messages: "vllm", "sglang", "llama.cpp", "openai"."""
        ...

    def read(self, http: ProbeHTTP) -> EngineReading: ...
