"""What the engine hands back: per-step outputs, completions, capacity and metrics."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from engine.request import FinishReason, Request

__all__ = [
    "BudgetBlocks",
    "Capacity",
    "Completion",
    "EngineMetrics",
    "EngineSnapshot",
    "KVSnapshot",
    "RequestInfo",
    "RequestOutput",
]


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """One step's news for one request: the tokens and text it produced this step."""

    request_id: str
    new_token_ids: tuple[int, ...]
    new_text: str
    finished: bool
    finish_reason: FinishReason | None


@dataclass(frozen=True, slots=True)
class Completion:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]  # generated tokens
    text: str
    finish_reason: FinishReason
    stop_string: str | None  # the stop string that ended it, when one did
    num_cached_tokens: int  # prompt tokens served from the prefix cache
    num_preemptions: int
    time_to_first_token_s: float | None
    latency_s: float
    num_retained_tokens: int = 0  # held as it finished (``retain=True``): its context's KV


@dataclass(frozen=True, slots=True)
class Capacity:
    block_size: int
    num_blocks: int
    num_free_blocks: int
    num_pinned_blocks: int
    num_host_blocks: int
    bytes_per_block: int
    max_model_len: int

    @property
    def bytes_per_token(self) -> int:
        return self.bytes_per_block // self.block_size

    @property
    def num_available_blocks(self) -> int:
        """Blocks that leases can be sized from: the pool less pinned prefixes."""
        return self.num_blocks - self.num_pinned_blocks


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    num_blocks: int
    num_blocks_in_use: int
    num_blocks_free: int
    num_blocks_cached: int
    num_blocks_pinned: int
    num_blocks_swapped: int
    num_requests_running: int
    num_requests_waiting: int
    num_requests_swapped: int
    num_preemptions: int
    prefix_cache_queries: int  # tokens
    prefix_cache_hits: int  # tokens
    tokens_per_sequence: Mapping[str, int]
    num_tokens_in_use: int = 0  # slots of the in-use blocks that hold a token's K/V
    num_prefill_tokens: int = 0  # since the start (engine.prefill_counter)
    num_recomputed_tokens: int = 0  # prefilled again after their K/V was dropped
    num_blocks_swapped_out: int = 0  # device -> host copies since the start
    num_blocks_swapped_in: int = 0  # host -> device copies since the start
    num_holds_reclaimed: int = 0  # holds moved or ended for a running request, since the start
    num_swap_outs: int = 0  # sequences moved device -> host since the start (each many blocks)

    @property
    def kv_cache_usage(self) -> float:
        return self.num_blocks_in_use / self.num_blocks if self.num_blocks else 0.0


@dataclass(frozen=True, slots=True)
class BudgetBlocks:
    """What one budget holds at one instant: its unfinished requests and its retained
    context. A block shared with another budget (a pinned prefix, a prefix-cache hit)
    is listed by each holder; on the device it is one block."""

    device_block_ids: frozenset[int]
    num_device_tokens: int  # tokens whose K/V its device blocks hold, counted per holder
    num_host_blocks: int  # offloaded to host memory: swapped requests, an offloaded hold
    max_blocks: int  # the budget's cap
    num_host_tokens: int = 0  # tokens whose K/V its host blocks hold


@dataclass(frozen=True, slots=True)
class KVSnapshot:
    """The pool at one instant, between two engine steps: each open budget's blocks, the
    pinned prefixes' blocks, and the pool's own counts, all read together."""

    budgets: Mapping[str, BudgetBlocks]
    pinned_block_ids: frozenset[int]
    num_blocks: int
    num_blocks_in_use: int
    num_tokens_in_use: int


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """One unfinished request as the scheduler holds it: ``state`` names the queue it is
    in ("running", "waiting" or "swapped"), so the counts match ``EngineMetrics``."""

    request_id: str
    state: str
    budget: str | None
    priority: int
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int  # prompt tokens served from the prefix cache
    cache_salt: str | None = None  # says whose a request is where salts are per tenant

    @classmethod
    def of(cls, request: Request, state: str) -> RequestInfo:
        return cls(
            request.request_id,
            state,
            request.budget,
            request.priority,
            request.num_prompt_tokens,
            request.num_output_tokens,
            request.num_cached_tokens,
            request.cache_salt,
        )


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """What an observer shows (a live page, a metrics scrape), read at one instant between
    two steps, so its figures agree with each other."""

    metrics: EngineMetrics
    capacity: Capacity
    kv: KVSnapshot
    requests: tuple[RequestInfo, ...]
