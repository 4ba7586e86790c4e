"""``MultiBackend``: several backends (replicas of one model, any mix) behind one ``Backend``.

Budgets (one per lease) are the unit of routing. A budget opens on no replica at first;
its first call picks one (``backends.multi._routing``: prefix match over the text the
router sent each replica, else free blocks, else least load) and opens it there; every
later call, and its held, offloaded and restored KV, goes to that replica (affinity)
while the lease is parked and when it comes back, unless that replica leaves rotation
or has no room for it when it is admitted again (then it moves: closed there, opened on
the new one at its next call; its KV there is not carried).

Admission: ``capacity()`` is the sum of the replicas in rotation, and ``placement()``
(``governor.placement``) lets guaranteed-mode admission admit a lease only where one
replica has room for its whole reservation. Overcommit mode routes by free blocks and
the engines' own limits.

Pins go to every replica in rotation, and to a replica that comes back: any agent may
run anywhere, and a pin's blocks count once per replica in ``capacity()``.

Failover: a call that finds its replica unreachable (``BackendUnavailable``) takes it
out of rotation; its budgets are placed elsewhere and opened there at their next call;
a model call is sent once more (``Routing.failover_retries``) to another replica, as a
router's retry would (a stream only when nothing of it was yielded). The held KV went
with the replica: the ``on_lost`` hooks run with its budgets (the governor's forgets
their holds, only theirs, and reads the capacity again; a replica that restarts behind
its ``RemoteBackend`` is told the same way). A replica out of rotation is asked ``health()`` every
``probe_interval_s`` by the next call that routes, and comes back once it answers ok.

Lock order: the ledger's lock is a leaf (``backends.multi._ledger``); no replica is
called and no hook run under it. Thread-safe; one call at a time per budget (a lease's
calls are).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from contextlib import aclosing, contextmanager

from backends.multi._ledger import Ledger, Move
from backends.multi._pins import Pin, Pins, summed_capacity, summed_metrics
from backends.multi._routing import Routing, request_text
from backends.multi._tokens import FailoverTokenizer
from backends.multi.kv_events import KVEventIndex
from governor import (
    Backend,
    BackendCapacity,
    BackendError,
    BackendHealth,
    BackendMetrics,
    BackendUnavailable,
    ConfigError,
    GenerationChunk,
    GenerationRequest,
    GenerationResult,
    Message,
    PrefixHandle,
    TokenCounter,
)

__all__ = ["MultiBackend", "Routing"]

_NAME = "multi"


class MultiBackend:
    """``replicas``: the backends, in order (``RemoteBackend``s, ``OpenAICompatibleBackend``s,
    ``LocalBackend``s, any mix of one model and block size). ``routing``: the rule and its
    thresholds (``Routing``). ``kv_events``: where the replicas are vLLM publishing KV
    events, the index fed from them (``backends.multi.kv_events``): calls that send token
    ids are matched against what the engines say they hold under the call's cache salt
    (as each replica sends it: ``VLLMBackend.sent_cache_salt``), not the client's record.
    Reads each replica's capacity now; one unreachable starts out of rotation."""

    def __init__(
        self,
        replicas: Sequence[Backend],
        *,
        routing: Routing | None = None,
        kv_events: KVEventIndex | None = None,
    ) -> None:
        if not replicas:
            raise ConfigError("MultiBackend needs at least one replica", setting="replicas")
        self.replicas = list(replicas)
        self.routing = routing or Routing()
        self._ledger = Ledger(
            self.routing, len(self.replicas), kv_events=kv_events, sent_salt=self._sent_salt
        )
        self._pins = Pins()
        self._lock = threading.Lock()  # the counter (a leaf, as the ledger's and the pins')
        self._hooks: list[Callable[[frozenset[str]], None]] = []
        self._counter: TokenCounter | None = None
        self._up_at_start = 0
        for i, replica in enumerate(self.replicas):
            try:
                self._ledger.set_capacity(i, replica.capacity())
                self._up_at_start += 1
            except BackendUnavailable:
                self._ledger.down(i)
            on_restart = getattr(replica, "on_restart", None)
            if callable(on_restart):
                on_restart(functools.partial(self._replica_restarted, i))
        sizes = {s.capacity.block_size for s in self._ledger.replicas if s.capacity}
        if len(sizes) > 1:
            raise ConfigError(
                f"the replicas have different block sizes {sorted(sizes)}; serve one model "
                "with one block size behind a MultiBackend",
                setting="replicas",
            )
        if not self._up_at_start:
            raise BackendUnavailable("no replica answered; start one first", backend=_NAME)

    def __repr__(self) -> str:
        return f"<MultiBackend of {len(self.replicas)} replicas, {self.routing.policy}>"

    @property
    def name(self) -> str:
        return _NAME

    @property
    def model(self) -> str:
        return self.replicas[self._any_up()].model

    def in_rotation(self) -> list[int]:
        """The indexes of the replicas in rotation now."""
        return self._ledger.up()

    def budgets(self) -> dict[str, int | None]:
        """Every budget open here, and the replica it is open on (None: none yet)."""
        return self._ledger.where()

    def placed_on(self, budget: str) -> int | None:
        """The replica the budget's calls go to now (None: not open on one in rotation)."""
        return self._ledger.opened_on(budget)

    def on_lost(self, hook: Callable[[frozenset[str]], None]) -> Callable[[], None]:
        """Call ``hook(budgets)`` after a replica lost the KV of those budgets (it left
        rotation, or restarted), and ``hook(frozenset())`` after one came back: the
        capacity changed either way. Returns the function that removes it."""
        self._hooks.append(hook)
        return lambda: self._hooks.remove(hook) if hook in self._hooks else None

    def placement(self, *, safety_factor: float) -> Ledger:
        """Where a lease fits, for guaranteed-mode admission (``governor.placement``)."""
        self._ledger.set_safety_factor(safety_factor)
        return self._ledger

    def close(self) -> None:
        for replica in self.replicas:
            replica.close()

    # -- capacity and metrics -----------------------------------------------------------
    def capacity(self) -> BackendCapacity:
        self._probe_due()
        readings = []
        for i in self._ledger.up():
            try:
                reading = self.replicas[i].capacity()
            except BackendUnavailable as exc:
                self._down(i, exc)
                continue
            self._ledger.set_capacity(i, reading)
            readings.append(reading)
        return summed_capacity(readings, backend=_NAME)

    async def acapacity(self) -> BackendCapacity:
        return await asyncio.to_thread(self.capacity)

    def metrics(self) -> BackendMetrics:
        """The replicas in rotation, summed (one that fails to answer leaves rotation)."""
        return summed_metrics([m for m in self.replica_metrics() if m is not None])

    async def ametrics(self) -> BackendMetrics:
        return await asyncio.to_thread(self.metrics)

    def replica_metrics(self) -> list[BackendMetrics | None]:
        """Each replica's own metrics (None: out of rotation)."""
        readings: list[BackendMetrics | None] = [None] * len(self.replicas)
        for i in self._ledger.up():
            try:
                readings[i] = self.replicas[i].metrics()
            except BackendUnavailable as exc:
                self._down(i, exc)
        return readings

    def health(self) -> BackendHealth:
        self._probe_due()
        up = self._ledger.up()
        down = [i for i in range(len(self.replicas)) if i not in up]
        detail = f"{len(up)} of {len(self.replicas)} replicas in rotation"
        if down:
            detail += f"; out: {', '.join(map(str, down))}"
        return BackendHealth(ok=bool(up), detail=detail)

    # -- budgets ------------------------------------------------------------------------
    def open_budget(self, name: str, *, max_blocks: int) -> None:
        self._ledger.open(name, max_blocks)  # opened on a replica at its first call

    async def aopen_budget(self, name: str, *, max_blocks: int) -> None:
        self._ledger.open(name, max_blocks)

    def resize_budget(self, name: str, *, max_blocks: int) -> None:
        replica = self._ledger.resize(name, max_blocks)
        if replica is not None:
            with self._failing(replica):
                self.replicas[replica].resize_budget(name, max_blocks=max_blocks)

    async def aresize_budget(self, name: str, *, max_blocks: int) -> None:
        replica = self._ledger.resize(name, max_blocks)
        if replica is not None:
            try:
                await self.replicas[replica].aresize_budget(name, max_blocks=max_blocks)
            except BackendUnavailable as exc:
                await asyncio.to_thread(self._down, replica, exc)
                raise

    def close_budget(self, name: str) -> None:
        replica = self._ledger.close(name)
        if replica is None:
            return
        try:  # one out of rotation is told too: it may come back
            self.replicas[replica].close_budget(name)
        except BackendUnavailable as exc:  # the budget went with it
            self._down(replica, exc)

    async def aclose_budget(self, name: str) -> None:
        replica = self._ledger.close(name)
        if replica is None:
            return
        try:
            await self.replicas[replica].aclose_budget(name)
        except BackendUnavailable as exc:
            await asyncio.to_thread(self._down, replica, exc)

    # -- held KV: on the budget's replica; none where it is out of rotation ---------------
    def retain(self, *, budget: str) -> int:
        replica = self._ledger.opened_on(budget)
        if replica is None:
            return 0
        try:
            return self.replicas[replica].retain(budget=budget)
        except BackendUnavailable as exc:
            self._down(replica, exc)
            return 0

    async def aretain(self, *, budget: str) -> int:
        return await asyncio.to_thread(self.retain, budget=budget)

    def release_retained(self, *, budget: str) -> None:
        self._on_budget(budget, "release_retained")

    async def arelease_retained(self, *, budget: str) -> None:
        await asyncio.to_thread(self.release_retained, budget=budget)

    def offload(self, *, budget: str) -> None:
        self._on_budget(budget, "offload")

    async def aoffload(self, *, budget: str) -> None:
        await asyncio.to_thread(self.offload, budget=budget)

    def restore(self, *, budget: str) -> None:
        self._on_budget(budget, "restore")

    async def arestore(self, *, budget: str) -> None:
        await asyncio.to_thread(self.restore, budget=budget)

    def _on_budget(self, budget: str, method: str) -> None:
        replica = self._ledger.opened_on(budget)
        if replica is None:
            return  # nothing held anywhere: a replica that went lost it
        try:
            getattr(self.replicas[replica], method)(budget=budget)
        except BackendUnavailable as exc:
            self._down(replica, exc)

    # -- pins ---------------------------------------------------------------------------
    def pin_prefix(
        self,
        prefix: str | Sequence[int] | Sequence[Message],
        *,
        cache_salt: str | None = None,
        shared: bool = False,
    ) -> PrefixHandle:
        pin = Pin(prefix, cache_salt, shared)
        for i in self._ledger.up():
            try:
                pin.handles[i] = self.replicas[i].pin_prefix(
                    prefix, cache_salt=cache_salt, shared=shared
                )
            except BackendUnavailable as exc:
                self._down(i, exc)  # pinned there when it comes back
        if not pin.handles:
            raise BackendUnavailable("no replica in rotation to pin on", backend=_NAME)
        return self._pins.add(pin)

    def unpin_prefix(self, handle: PrefixHandle) -> None:
        pin = self._pins.pop(handle.key)
        if pin is None:
            raise BackendError(
                f"prefix {handle.key!r} is not pinned here: unpin each handle once, on the "
                "backend that made it",
                backend=_NAME,
            )
        for i, replica_handle in pin.handles.items():
            with contextlib.suppress(BackendUnavailable):  # it lost the pin with the rest
                self.replicas[i].unpin_prefix(replica_handle)

    # -- counting: every replica serves the same model ------------------------------------
    @property
    def counter(self) -> TokenCounter:
        if self._counter is None:
            name = self.replicas[self._any_up()].counter.name  # a round trip: not locked
            tokenizer = FailoverTokenizer(self.replicas, self._ledger.up, self._down, name)
            with self._lock:
                if self._counter is None:
                    self._counter = TokenCounter(tokenizer=tokenizer)
        return self._counter

    def count_tokens(self, text: str) -> int:
        return self.counter.count(text)

    def count_messages(self, messages: Sequence[Message]) -> int:
        return self.counter.count_messages(messages)

    # -- model calls ----------------------------------------------------------------------
    def generate(self, request: GenerationRequest) -> GenerationResult:
        for attempt in range(self.routing.failover_retries + 1):
            replica = self._prepare(request)
            try:
                return self.replicas[replica].generate(request)
            except BackendUnavailable as exc:
                self._down(replica, exc)
                if attempt == self.routing.failover_retries:
                    raise
            finally:
                self._ledger.finished(replica)
        raise AssertionError("unreachable")  # pragma: no cover

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        for attempt in range(self.routing.failover_retries + 1):
            replica = await self._aprepare(request)
            try:
                return await self.replicas[replica].agenerate(request)
            except BackendUnavailable as exc:
                await asyncio.to_thread(self._down, replica, exc)
                if attempt == self.routing.failover_retries:
                    raise
            finally:
                self._ledger.finished(replica)
        raise AssertionError("unreachable")  # pragma: no cover

    async def astream(self, request: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
        for attempt in range(self.routing.failover_retries + 1):
            replica = await self._aprepare(request)
            yielded = False
            try:
                async with aclosing(self.replicas[replica].astream(request)) as chunks:
                    async for chunk in chunks:
                        yielded = True
                        yield chunk
                return
            except BackendUnavailable as exc:
                await asyncio.to_thread(self._down, replica, exc)
                if yielded or attempt == self.routing.failover_retries:
                    raise
            finally:
                self._ledger.finished(replica)

    # -- routing --------------------------------------------------------------------------
    def _prepare(self, request: GenerationRequest) -> int:
        """The replica for this call, with the call's budget open there."""
        self._probe_due()
        move = self._route(request)
        try:
            if move.close_on is not None:
                self._close_quietly(move.close_on, request.budget or "")
            if move.open_on is not None:
                self.replicas[move.open_on].open_budget(
                    request.budget or "", max_blocks=move.max_blocks
                )
                self._ledger.opened(request.budget or "", move.open_on)
        except BaseException as exc:
            self._ledger.finished(move.replica)
            if isinstance(exc, BackendUnavailable):
                self._down(move.replica, exc)
            raise
        return move.replica

    async def _aprepare(self, request: GenerationRequest) -> int:
        due = self._ledger.due_for_probe()
        if due:
            await asyncio.to_thread(self._probe, due)
        move = self._route(request)
        budget = request.budget or ""
        try:
            if move.close_on is not None:
                await asyncio.to_thread(self._close_quietly, move.close_on, budget)
            if move.open_on is not None:
                await self.replicas[move.open_on].aopen_budget(budget, max_blocks=move.max_blocks)
                self._ledger.opened(budget, move.open_on)
        except BaseException as exc:
            self._ledger.finished(move.replica)
            if isinstance(exc, BackendUnavailable):
                await asyncio.to_thread(self._down, move.replica, exc)
            raise
        return move.replica

    def _route(self, request: GenerationRequest) -> Move:
        ids = None if request.prompt is None or isinstance(request.prompt, str) else request.prompt
        move = self._ledger.route(request.budget, request_text(request), request.cache_salt, ids)
        if move is None:
            raise BackendUnavailable(
                "no replica is in rotation; they are probed again every "
                f"{self.routing.probe_interval_s} s",
                backend=_NAME,
            )
        return move

    def _sent_salt(self, replica: int, cache_salt: str | None) -> str | None:
        """The salt the replica's engine is sent for ``cache_salt`` (no I/O: the ledger's
        lock may be held)."""
        sent = getattr(self.replicas[replica], "sent_cache_salt", None)
        return sent(cache_salt) if callable(sent) else cache_salt

    def _close_quietly(self, replica: int, budget: str) -> None:
        with contextlib.suppress(BackendError):  # gone with its replica, or closed already
            self.replicas[replica].close_budget(budget)

    # -- failover ---------------------------------------------------------------------
    def _down(self, replica: int, exc: BaseException) -> None:
        """Take the replica out of rotation (once) and tell the hooks its KV is gone."""
        was_open = self._ledger.down(replica)
        if was_open is None:
            return
        for budget in was_open:  # so that it never opens them again when it is back
            self._close_quietly(replica, budget)
        self._run_hooks(frozenset(was_open))

    def _probe_due(self) -> None:
        self._probe(self._ledger.due_for_probe())

    def _probe(self, due: list[int]) -> None:
        """Bring back each replica of ``due`` that answers ok, its pins set up again."""
        for i in due:
            try:
                if not self.replicas[i].health().ok:
                    continue
                self._ledger.set_capacity(i, self.replicas[i].capacity())
                self._pin_again(i)
            except BackendError:
                continue
            self._ledger.back(i)
            self._run_hooks(frozenset())

    def _pin_again(self, replica: int) -> None:
        for pin in self._pins.missing_on(replica):
            handle = self.replicas[replica].pin_prefix(
                pin.prefix, cache_salt=pin.cache_salt, shared=pin.shared
            )
            self._pins.pinned(pin, replica, handle)

    def _replica_restarted(self, replica: int) -> None:
        self._run_hooks(frozenset(self._ledger.lost_cache(replica)))

    def _run_hooks(self, budgets: frozenset[str]) -> None:
        for hook in list(self._hooks):
            hook(budgets)

    @contextmanager
    def _failing(self, replica: int) -> Iterator[None]:
        try:
            yield
        except BackendUnavailable as exc:
            self._down(replica, exc)
            raise

    def _any_up(self) -> int:
        up = self._ledger.up()
        return up[0] if up else 0
