"""The ``Backend`` protocol: all the governor needs from an inference engine.

The governor drives any engine through this protocol: the bundled engine in process
(``LocalBackend``), a server speaking HTTP, or ``governor.testing.FakeBackend`` in
tests. Capacity is counted in the engine's own KV blocks, so the governor's admission
arithmetic matches what the engine can actually hold.

Bookkeeping calls (capacity, budgets, prefixes, counting, offload, metrics) are
synchronous and cheap in process, but a backend across a network waits on I/O for each:
those an event loop makes come in ``a``-prefixed twins too (``aopen_budget``,
``aclose_budget``, ...), which never block the loop (``LocalBackend``'s run on a worker
thread, ``RemoteBackend``'s on ``httpx.AsyncClient``). A model call comes as
``generate`` (blocking), ``agenerate`` and ``astream``; all three are safe to call from
any thread or event loop at once.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from governor.errors import ConfigError
from governor.tokens import TokenCounter

__all__ = [
    "Backend",
    "BackendCapacity",
    "BackendHealth",
    "BackendMetrics",
    "GenerationChunk",
    "GenerationRequest",
    "GenerationResult",
    "Message",
    "PrefixHandle",
]

Message = Mapping[str, Any]  # {"role": ..., "content": ...}, as chat templates take them


@dataclass(frozen=True, slots=True)
class BackendCapacity:
    block_size: int  # tokens per KV block
    num_blocks: int
    num_free_blocks: int
    num_pinned_blocks: int
    bytes_per_block: int
    max_model_len: int  # the model's maximum context, in tokens
    weights_bytes: int = 0  # device memory the model's weights take; 0 when unknown

    @property
    def num_available_blocks(self) -> int:
        """What leases are sized from: every block less the pinned shared prefixes."""
        return self.num_blocks - self.num_pinned_blocks


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerationRequest:
    """One model call. Exactly one of ``messages`` (rendered with the backend's chat
    template) and ``prompt`` (text or token ids) is set."""

    messages: Sequence[Message] | None = None
    prompt: str | Sequence[int] | None = None
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ceiling_tokens: int | None = None  # prompt plus output never exceed this
    budget: str | None = None  # the engine budget (one per lease) that caps its blocks
    cache_salt: str | None = None  # per tenant: no prefix-cache hits across tenants
    priority: int = 0
    # When the call counts as arrived, for first come, first served within its priority
    # (time.monotonic()); None: as it arrives. The governor sends its lease tree's start,
    # so an older program's calls go first (LocalBackend, kvgov serve; others ignore it).
    order_time: float | None = None
    # Hold the budget's context once the call finishes, as ``retain`` would, in the
    # engine step that finishes it (LocalBackend; elsewhere ``retain`` after the call).
    retain: bool = False

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt is None):
            raise ConfigError("set exactly one of messages and prompt", setting="prompt")


@dataclass(frozen=True, slots=True)
class GenerationResult:
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str  # "stop" | "length" | "ceiling" | "budget" | "abort"
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens served from the prefix cache
    # The prompt as the engine saw it, where the backend knows it (LocalBackend, kvgov
    # serve); () elsewhere. Not compared: backends that do not know it give equal results.
    prompt_token_ids: tuple[int, ...] = field(default=(), compare=False)
    # Tokens of its context the backend held as it finished (``GenerationRequest.retain``);
    # 0 where none was asked for or made.
    retained_tokens: int = field(default=0, compare=False)
    # Seconds the engine spent on the call, from its arrival at the engine to its end
    # (queueing for a batch slot included), where the backend knows it (LocalBackend,
    # kvgov serve); None elsewhere. What a call took beyond it is the caller's side of the
    # hand-off, HTTP included. Not compared: it differs from call to call.
    engine_s: float | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class GenerationChunk:
    """A piece of a streamed call. The last chunk carries only ``result`` (no text, no
    token ids); the chunks before it join to ``result.text`` and ``result.token_ids``."""

    text: str
    token_ids: tuple[int, ...]
    result: GenerationResult | None = None


@dataclass(frozen=True, slots=True)
class PrefixHandle:
    """A pinned shared prefix: its full blocks stay resident until unpinned."""

    key: str  # the backend's own id for the pin
    num_tokens: int  # tokens the prefix has
    num_pinned_tokens: int  # of those, tokens in pinned full blocks
    num_blocks: int
    cache_salt: str | None = None
    shared: bool = False  # every tenant's calls that start with it reuse its blocks


@dataclass(frozen=True, slots=True)
class BackendMetrics:
    num_blocks_in_use: int
    num_blocks_free: int
    num_blocks_cached: int
    num_blocks_pinned: int
    num_blocks_swapped: int
    num_requests_running: int
    num_requests_waiting: int
    num_preemptions: int
    prefix_cache_queries: int  # tokens
    prefix_cache_hits: int  # tokens
    num_tokens_in_use: int = 0  # tokens the in-use blocks hold; 0 when unknown
    # Held contexts the engine moved or ended itself for a running request, since the
    # start (``held_contexts`` then says which); 0 when unknown
    num_holds_reclaimed: int = 0


@dataclass(frozen=True, slots=True)
class BackendHealth:
    ok: bool
    detail: str = ""


@runtime_checkable
class Backend(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def model(self) -> str: ...

    def capacity(self) -> BackendCapacity: ...

    def open_budget(self, name: str, *, max_blocks: int) -> None: ...

    def resize_budget(self, name: str, *, max_blocks: int) -> None: ...

    def close_budget(self, name: str) -> None: ...

    def pin_prefix(
        self,
        prefix: str | Sequence[int] | Sequence[Message],
        *,
        cache_salt: str | None = None,
        shared: bool = False,
    ) -> PrefixHandle:
        """Pin a shared prefix. Messages are rendered with the chat template and no
        generation prompt, so a chat call that starts with them reuses the blocks.
        ``cache_salt``: only calls with that salt reuse them. ``shared`` (no salt then):
        calls of every salt that start with it reuse them, each salt's own blocks
        starting right after it (a system prompt all tenants send)."""
        ...

    def unpin_prefix(self, handle: PrefixHandle) -> None: ...

    @property
    def counter(self) -> TokenCounter:
        """Counts exactly as this backend's tokenizer does (policies count with it)."""
        ...

    def count_tokens(self, text: str) -> int: ...

    def count_messages(self, messages: Sequence[Message]) -> int:
        """Tokens the prompt of these messages takes, template overhead included."""
        ...

    def generate(self, request: GenerationRequest) -> GenerationResult: ...

    async def agenerate(self, request: GenerationRequest) -> GenerationResult: ...

    def astream(self, request: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
        """An async generator: the governor closes it (``aclose``) when its consumer stops
        early, and closing it must end the call (its blocks back)."""
        ...

    def retain(self, *, budget: str) -> int:
        """Keep the KV of the budget's latest finished call resident until its next call
        (or ``release_retained``), so an agent back from a tool call reuses it; returns
        the tokens held (0 when nothing is left to hold)."""
        ...

    def release_retained(self, *, budget: str) -> None:
        """End ``retain``: the blocks become evictable again (a no-op without a hold)."""
        ...

    def offload(self, *, budget: str) -> None:
        """Move the KV of the budget's in-flight calls and of its retained context to host
        memory until restore (or, for a retained context, until the budget's next call)."""
        ...

    def restore(self, *, budget: str) -> None: ...

    def metrics(self) -> BackendMetrics: ...

    def health(self) -> BackendHealth: ...

    # -- the bookkeeping calls an event loop makes, without blocking it ----------------
    async def acapacity(self) -> BackendCapacity: ...

    async def aopen_budget(self, name: str, *, max_blocks: int) -> None: ...

    async def aresize_budget(self, name: str, *, max_blocks: int) -> None: ...

    async def aclose_budget(self, name: str) -> None: ...

    async def aretain(self, *, budget: str) -> int: ...

    async def arelease_retained(self, *, budget: str) -> None: ...

    async def aoffload(self, *, budget: str) -> None: ...

    async def arestore(self, *, budget: str) -> None: ...

    async def ametrics(self) -> BackendMetrics: ...

    def close(self) -> None: ...
