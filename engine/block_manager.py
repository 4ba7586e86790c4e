"""The block manager: where every token's K/V lives.

It owns the device ``BlockPool`` (with the prefix cache), the host swap pool, one
``BlockTable`` per sequence, the named budgets and the pinned prefixes, and moves no
tensor: an operation returns its moves as ``(src, dst)`` block-id pairs, to be performed
before the next call into the manager. Every operation is a check/act pair
(``can_allocate`` returns a ``Fit``; ``allocate`` raises ``CapacityError`` and changes
nothing); none allocates partially or goes past the pool, a budget or a ceiling. A
sequence keeps for life the number of shared-pin blocks it was allocated with.

Shared pins and the rest: docs/design/engine-step.md.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from engine.block_pool import BlockPool
from engine.block_results import (
    Allocation,
    AllocationPlan,
    AppendResult,
    BlockMove,
    BlockStats,
    Fit,
    PinnedPrefix,
    Shortfall,
    refusal,
)
from engine.block_table import BlockTable, SequenceState
from engine.budget import BudgetRegistry
from engine.errors import (
    DuplicateSequenceError,
    InvalidRequestError,
    SequenceStateError,
    UnknownSequenceError,
)
from engine.pins import PinRegistry
from engine.prefix_hash import ExtraKey, encode_extra_keys, hash_chain
from engine.swap_space import SwapSpace
from engine.validation import require_int, require_token_ids

__all__ = ["BlockManager"]

_FITS = Fit()


class BlockManager:
    def __init__(
        self,
        *,
        num_blocks: int,
        block_size: int = 16,
        num_host_blocks: int = 0,
        enable_prefix_caching: bool = True,
    ) -> None:
        require_int("num_blocks", num_blocks, minimum=1)
        require_int("block_size", block_size, minimum=1)
        require_int("num_host_blocks", num_host_blocks, minimum=0)
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks=num_blocks, enable_caching=enable_prefix_caching)
        self.host_pool = BlockPool(num_blocks=num_host_blocks, enable_caching=False)
        self.swap_space = SwapSpace(device_pool=self.pool, host_pool=self.host_pool)
        self._tables: dict[Hashable, BlockTable] = {}
        self.budgets = BudgetRegistry()
        self.pins = PinRegistry(self.pool)
        self._prefix_queries = 0
        self._prefix_hits = 0

    # -- prefix cache -----------------------------------------------------------------
    def block_hashes(
        self,
        token_ids: Sequence[int],
        *,
        cache_salt: str | None = None,
        extra_keys: Sequence[ExtraKey] = (),
        num_shared_blocks: int = 0,
        known: Sequence[bytes] = (),
    ) -> list[bytes]:
        """The chained hashes of the full blocks of ``token_ids``; ``known``: the hashes
        of its leading full blocks, where the caller has them (a context these tokens
        repeat, hashed with the same salt, shared blocks and keys): only the rest are
        hashed."""
        extra = encode_extra_keys(extra_keys)
        return self._hashes(token_ids, cache_salt, num_shared_blocks, extra, known)

    def _hashes(
        self,
        token_ids: Sequence[int],
        cache_salt: str | None,
        num_shared_blocks: int,
        extra: bytes,
        known: Sequence[bytes] = (),
    ) -> list[bytes]:
        num_known = min(len(known), len(token_ids) // self.block_size)
        hashes = list(known[:num_known])
        hashes += hash_chain(
            token_ids,
            self.block_size,
            cache_salt=cache_salt,
            num_shared_blocks=num_shared_blocks,
            extra=extra,
            start_block=num_known,
            previous=hashes[-1] if hashes else None,
        )
        return hashes

    def computed_hashes(self, seq_id: Hashable) -> tuple[bytes, ...]:
        """The hashes of the sequence's full blocks computed so far (what the prefix
        cache was offered), in order."""
        table = self._table(seq_id)
        return tuple(table.block_hashes[: table.num_cached_blocks])

    def num_shared_blocks(
        self, token_ids: Sequence[int], *, extra_keys: Sequence[ExtraKey] = ()
    ) -> int:
        """How many leading full blocks of ``token_ids`` are blocks of a shared pin: the k
        to allocate a salted sequence with (``PinRegistry.num_shared_blocks``)."""
        return self.pins.num_shared_blocks(
            token_ids, self.block_size, extra=encode_extra_keys(extra_keys)
        )

    def longest_cached_prefix(
        self,
        token_ids: Sequence[int],
        *,
        cache_salt: str | None = None,
        extra_keys: Sequence[ExtraKey] = (),
        num_shared_blocks: int = 0,
    ) -> int:
        """How many leading tokens of ``token_ids`` have their K/V in the cache."""
        hashes = self.block_hashes(
            token_ids,
            cache_salt=cache_salt,
            extra_keys=extra_keys,
            num_shared_blocks=num_shared_blocks,
        )
        return len(self.pool.match(hashes)) * self.block_size

    def mark_computed(self, seq_id: Hashable, num_tokens: int) -> None:
        """The K/V of the first ``num_tokens`` tokens is written: cache their full blocks.

        Blocks enter the prefix cache only here, never at allocation, so no other
        sequence can be handed a block whose K/V has not been computed yet. A block whose
        content is already cached in another block is swapped for that block (its K/V
        is identical), so the table may change: rebuild block tables after this call.
        """
        table = self._resident(seq_id, "mark computed")
        require_int("num_tokens", num_tokens, minimum=0)
        if num_tokens > table.num_tokens:
            raise InvalidRequestError(
                f"num_tokens must be at most {table.num_tokens} for sequence {seq_id!r}, "
                f"got {num_tokens}"
            )
        table.cache_computed(self.pool, num_tokens // self.block_size, self.block_size)

    def reset_prefix_cache(self) -> bool:
        """Drop the content of every cached block that nothing holds (vLLM's name): the
        next requests start cold. Blocks held by a sequence or a pin keep their entries;
        True when none did, so the cache is now empty."""
        self.pool.reset_cache()
        return not self.pool.cached

    # -- allocate -----------------------------------------------------------------------
    def can_allocate(
        self,
        token_ids: Sequence[int],
        *,
        budget: str | None = None,
        ceiling_tokens: int | None = None,
        cache_salt: str | None = None,
        extra_keys: Sequence[ExtraKey] = (),
        num_reserve_blocks: int = 0,
        num_shared_blocks: int = 0,
        prompt_hashes: Sequence[bytes] | None = None,
    ) -> Fit:
        """``num_reserve_blocks``: the pool must keep this many free after (a scheduler's
        reserve for what runs next; never charged to the budget). ``prompt_hashes``: what
        ``prompt_hashes`` returned for the same tokens and keys, where the caller keeps
        it (a request that waits is asked again at every step)."""
        reserve = require_int("num_reserve_blocks", num_reserve_blocks, minimum=0)
        return self._plan_allocate(
            token_ids,
            budget,
            ceiling_tokens,
            cache_salt,
            extra_keys,
            num_shared_blocks,
            reserve,
            prompt_hashes=prompt_hashes,
        ).fit

    def allocate(
        self,
        seq_id: Hashable,
        token_ids: Sequence[int],
        *,
        budget: str | None = None,
        ceiling_tokens: int | None = None,
        cache_salt: str | None = None,
        extra_keys: Sequence[ExtraKey] = (),
        num_shared_blocks: int = 0,
        prompt_hashes: Sequence[bytes] | None = None,
    ) -> Allocation:
        """Give a new sequence blocks for ``token_ids``, reusing its longest cached prefix.

        The cached prefix stops short of the last token: the caller must compute at
        least one token to get logits. ``num_shared_blocks``: the k of the module
        docstring (``num_shared_blocks(token_ids)``); 0 salts every block.
        ``prompt_hashes``: as in ``can_allocate``.
        """
        if seq_id in self._tables:
            raise DuplicateSequenceError(seq_id)
        plan = self._plan_allocate(
            token_ids,
            budget,
            ceiling_tokens,
            cache_salt,
            extra_keys,
            num_shared_blocks,
            prompt_hashes=prompt_hashes,
        )
        group = self.budgets.get(budget) if budget is not None else None
        if not plan.fit:
            raise refusal(plan.fit, seq_id, group, ceiling_tokens)
        pool = self.pool
        for block in plan.hits:
            pool.touch(block)
        blocks = list(plan.hits)
        blocks += pool.allocate_blocks(
            self._num_blocks_for(len(token_ids)) - len(blocks), blocks[-1] if blocks else None
        )
        table = BlockTable(
            seq_id=seq_id,
            token_ids=list(token_ids),
            blocks=blocks,
            ceiling_tokens=ceiling_tokens,
            budget=group,
            cache_salt=cache_salt,
            num_shared_blocks=num_shared_blocks,
            extra=plan.extra,
            block_hashes=plan.hashes,
            num_cached_blocks=len(plan.hits),
        )
        self._tables[seq_id] = table
        if group is not None:
            group.num_blocks += len(blocks)
            group.seq_ids.add(seq_id)
        num_cached_tokens = len(plan.hits) * self.block_size
        self._prefix_queries += len(token_ids)
        self._prefix_hits += num_cached_tokens
        return Allocation(block_ids=tuple(table.block_ids), num_cached_tokens=num_cached_tokens)

    def hold_cached(
        self,
        seq_id: Hashable,
        token_ids: Sequence[int],
        *,
        cache_salt: str | None = None,
        num_shared_blocks: int = 0,
        known: Sequence[bytes] = (),
        checked: bool = False,
    ) -> int:
        """Make ``seq_id`` a sequence of the cached full blocks that ``token_ids`` start
        with: no new block, no compute, no budget charge. It keeps an idle context's K/V
        resident (and swappable) until freed. Returns the tokens held, 0 for none.
        ``known`` and ``checked``: as in ``block_hashes`` and ``prompt_hashes``."""
        if seq_id in self._tables:
            raise DuplicateSequenceError(seq_id)
        if not checked:
            require_token_ids(token_ids, allow_empty=True)
        if not self.enable_prefix_caching:
            return 0
        hashes = self.block_hashes(
            token_ids, cache_salt=cache_salt, num_shared_blocks=num_shared_blocks, known=known
        )
        hits = self.pool.match(hashes)
        if not hits:
            return 0
        for block in hits:
            self.pool.touch(block)
        num_tokens = len(hits) * self.block_size
        self._tables[seq_id] = BlockTable(
            seq_id=seq_id,
            token_ids=list(token_ids[:num_tokens]),
            blocks=hits,
            cache_salt=cache_salt,
            num_shared_blocks=num_shared_blocks,
            block_hashes=hashes[: len(hits)],
            num_cached_blocks=len(hits),
        )
        return num_tokens

    def prompt_hashes(
        self,
        token_ids: Sequence[int],
        *,
        cache_salt: str | None = None,
        extra_keys: Sequence[ExtraKey] = (),
        num_shared_blocks: int = 0,
        known: Sequence[bytes] = (),
        checked: bool = False,
    ) -> list[bytes]:
        """The hashes by which an allocation of ``token_ids`` looks its prefix up in the
        cache: its full blocks before the last token (validated as ``allocate`` would);
        ``known``: as in ``block_hashes``; ``checked``: the caller has validated the
        token ids already (the engine's own requests: ``Engine.add_request`` did)."""
        extra = self._check_prompt(token_ids, cache_salt, extra_keys, num_shared_blocks, checked)
        return self._prompt_hashes(token_ids, cache_salt, num_shared_blocks, extra, known)

    def _check_prompt(
        self,
        token_ids: Sequence[int],
        cache_salt: str | None,
        extra_keys: Sequence[ExtraKey],
        num_shared_blocks: int,
        checked: bool = False,
    ) -> bytes:
        if not checked:
            require_token_ids(token_ids, allow_empty=False)
        if cache_salt is not None and not isinstance(cache_salt, str):
            raise InvalidRequestError(f"cache_salt must be a str or None, got {cache_salt!r}")
        require_int("num_shared_blocks", num_shared_blocks, minimum=0)
        try:
            return encode_extra_keys(extra_keys)
        except TypeError as exc:
            raise InvalidRequestError(str(exc)) from None

    def _prompt_hashes(
        self,
        token_ids: Sequence[int],
        cache_salt: str | None,
        num_shared_blocks: int,
        extra: bytes,
        known: Sequence[bytes] = (),
    ) -> list[bytes]:
        if not self.enable_prefix_caching:
            return []
        # Only full blocks before the last token may come from the cache.
        before_last = token_ids[: len(token_ids) - 1]
        return self._hashes(before_last, cache_salt, num_shared_blocks, extra, known)

    def _plan_allocate(
        self,
        token_ids: Sequence[int],
        budget: str | None,
        ceiling_tokens: int | None,
        cache_salt: str | None,
        extra_keys: Sequence[ExtraKey],
        num_shared_blocks: int = 0,
        num_reserve_blocks: int = 0,
        *,
        prompt_hashes: Sequence[bytes] | None = None,
    ) -> AllocationPlan:
        if prompt_hashes is None:  # else checked when they were made (prompt_hashes)
            extra = self._check_prompt(token_ids, cache_salt, extra_keys, num_shared_blocks)
        else:
            extra = encode_extra_keys(extra_keys)
        if ceiling_tokens is not None:
            require_int("ceiling_tokens", ceiling_tokens, minimum=1)
        group = self.budgets.get(budget) if budget is not None else None
        num_tokens = len(token_ids)
        if ceiling_tokens is not None and num_tokens > ceiling_tokens:
            return AllocationPlan(Fit(Shortfall.CEILING, num_tokens, ceiling_tokens), [], [])
        num_blocks = self._num_blocks_for(num_tokens)
        if group is not None and num_blocks > group.num_free_blocks:
            fit = Fit(Shortfall.BUDGET, num_blocks, group.num_free_blocks)
            return AllocationPlan(fit, [], [])
        hashes = (
            prompt_hashes
            if prompt_hashes is not None
            else self._prompt_hashes(token_ids, cache_salt, num_shared_blocks, extra)
        )
        hits = self.pool.match(hashes)
        num_free_hits = sum(1 for block in hits if block.ref_cnt == 0)
        needed = num_blocks - len(hits) + num_free_hits + num_reserve_blocks
        if needed > self.pool.num_free_blocks:
            return AllocationPlan(Fit(Shortfall.POOL, needed, self.pool.num_free_blocks), [], [])
        return AllocationPlan(_FITS, hits, list(hashes), extra)  # all: none is made twice

    # -- append -------------------------------------------------------------------------
    def can_append(self, seq_id: Hashable, num_new_tokens: int = 1) -> Fit:
        table = self._resident(seq_id, "append to")
        return self._plan_append(table, num_new_tokens)[0]

    def append(self, seq_id: Hashable, token_ids: Sequence[int]) -> AppendResult:
        """Append tokens: a new block only when the last one is full.

        Writing into a partly filled block that another sequence shares (after a fork)
        first moves this sequence onto a private copy; the copy is returned to perform.
        """
        table = self._resident(seq_id, "append to")
        require_token_ids(token_ids, allow_empty=True)
        fit, copy_on_write, num_new_blocks = self._plan_append(table, len(token_ids))
        if not fit:
            raise refusal(fit, seq_id, table.budget, table.ceiling_tokens)
        pool = self.pool
        blocks = table.blocks
        copies: tuple[BlockMove, ...] = ()
        if copy_on_write:
            shared = blocks[-1]
            private = pool.allocate_after(blocks[-2] if len(blocks) > 1 else None)
            blocks[-1] = private
            pool.free(shared)
            copies = ((shared.block_id, private.block_id),)
        new_ids: tuple[int, ...] = ()
        if num_new_blocks:  # most decode steps need none
            after = blocks[-1] if blocks else None
            if after is not None and not pool.is_empty(after.block_id + 1):
                after = pool.run_start() or after  # its run is blocked: start a new one
            new_blocks = pool.allocate_blocks(num_new_blocks, after)
            blocks += new_blocks
            new_ids = tuple(block.block_id for block in new_blocks)
        if table.budget is not None:
            table.budget.num_blocks += num_new_blocks
        table.token_ids.extend(token_ids)
        return AppendResult(new_block_ids=new_ids, copies=copies)

    def can_append_together(self, appends: Mapping[Hashable, int]) -> bool:
        """Whether every resident sequence in ``appends`` can take its number of new tokens,
        appended one sequence after another, with no copy on write, within its ceiling,
        and within the pool and each budget summed over all of them: what ``append``
        checks one call at a time, for a batch of calls made together."""
        num_from_pool = 0
        from_budgets: dict[int, int] = {}
        for seq_id, num_new_tokens in appends.items():
            table = self._resident(seq_id, "append to")
            fit, copy_on_write, num_new_blocks = self._plan_append(table, num_new_tokens)
            if not fit or copy_on_write:
                return False
            num_from_pool += num_new_blocks
            budget = table.budget
            if budget is not None and num_new_blocks:
                key = id(budget)
                from_budgets[key] = from_budgets.get(key, 0) + num_new_blocks
                if from_budgets[key] > budget.num_free_blocks:
                    return False
        return num_from_pool <= self.pool.num_free_blocks

    def _plan_append(self, table: BlockTable, num_new_tokens: int) -> tuple[Fit, bool, int]:
        require_int("num_new_tokens", num_new_tokens, minimum=0)
        total = table.num_tokens + num_new_tokens
        if table.ceiling_tokens is not None and total > table.ceiling_tokens:
            return Fit(Shortfall.CEILING, total, table.ceiling_tokens), False, 0
        num_new_blocks = self._num_blocks_for(total) - len(table.blocks)
        budget = table.budget
        if budget is not None and num_new_blocks > budget.num_free_blocks:
            return Fit(Shortfall.BUDGET, num_new_blocks, budget.num_free_blocks), False, 0
        copy_on_write = (
            num_new_tokens > 0
            and table.num_tokens % self.block_size != 0
            and table.blocks[-1].ref_cnt > 1
        )
        needed = num_new_blocks + copy_on_write
        if needed > self.pool.num_free_blocks:
            return Fit(Shortfall.POOL, needed, self.pool.num_free_blocks), False, 0
        return _FITS, copy_on_write, num_new_blocks

    # -- fork / free --------------------------------------------------------------------
    def can_fork(self, parent_id: Hashable) -> Fit:
        table = self._resident(parent_id, "fork")
        budget = table.budget
        if budget is not None and len(table.blocks) > budget.num_free_blocks:
            return Fit(Shortfall.BUDGET, len(table.blocks), budget.num_free_blocks)
        return _FITS

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        """The child shares every block of the parent (in the parent's budget)."""
        if child_id in self._tables:
            raise DuplicateSequenceError(child_id)
        fit = self.can_fork(parent_id)
        parent = self._tables[parent_id]
        if not fit:
            raise refusal(fit, parent_id, parent.budget, parent.ceiling_tokens)
        for block in parent.blocks:
            self.pool.touch(block)
        self._tables[child_id] = BlockTable(
            seq_id=child_id,
            token_ids=list(parent.token_ids),
            blocks=list(parent.blocks),
            ceiling_tokens=parent.ceiling_tokens,
            budget=parent.budget,
            cache_salt=parent.cache_salt,
            num_shared_blocks=parent.num_shared_blocks,
            extra=parent.extra,
            block_hashes=list(parent.block_hashes),
            num_cached_blocks=parent.num_cached_blocks,
        )
        if parent.budget is not None:
            parent.budget.num_blocks += len(parent.blocks)
            parent.budget.seq_ids.add(child_id)

    def free(self, seq_id: Hashable) -> None:
        """Return every block of the sequence, tail first, so a chain's tail is evicted
        before its head (a later request is likelier to share the head)."""
        table = self._table(seq_id)
        pool = self.pool if table.state is SequenceState.RESIDENT else self.host_pool
        pool.free_blocks(reversed(table.blocks))
        del self._tables[seq_id]
        if table.budget is not None:
            table.budget.num_blocks -= len(table.blocks)
            table.budget.seq_ids.discard(seq_id)

    # -- swap ---------------------------------------------------------------------------
    def can_swap_out(self, seq_id: Hashable) -> Fit:
        return self.swap_space.can_swap_out(self._resident(seq_id, "swap out"))

    def swap_out(self, seq_id: Hashable) -> tuple[BlockMove, ...]:
        """Move the sequence to host blocks; returns (device, host) moves to perform."""
        return self.swap_space.swap_out(self._resident(seq_id, "swap out"))

    def can_swap_in(self, seq_id: Hashable, num_reserve_blocks: int = 0) -> Fit:
        """``num_reserve_blocks``: as in ``can_allocate``."""
        reserve = require_int("num_reserve_blocks", num_reserve_blocks, minimum=0)
        return self.swap_space.can_swap_in(self._swapped(seq_id, "swap in"), reserve)

    def swap_in(self, seq_id: Hashable) -> tuple[BlockMove, ...]:
        """Bring the sequence back; returns (host, device) moves to perform (none for the
        blocks whose content the prefix cache still holds)."""
        return self.swap_space.swap_in(self._swapped(seq_id, "swap in"))

    # -- pins ---------------------------------------------------------------------------
    def pin(
        self, seq_id: Hashable, num_tokens: int | None = None, *, shared: bool = False
    ) -> PinnedPrefix:
        """Pin the computed full blocks of the sequence's first ``num_tokens`` tokens (a
        shared system prompt or tool schema): they are never evicted until ``unpin``,
        and outlive the sequence. ``shared``: every salt's requests that start with these
        blocks reuse them (module docstring); the sequence must be unsalted."""
        return self.pins.pin_table(
            self._resident(seq_id, "pin"), num_tokens, shared=shared, block_size=self.block_size
        )

    def unpin(self, prefix: PinnedPrefix) -> None:
        self.pins.remove(prefix.pin_id)

    # -- introspection ------------------------------------------------------------------
    def __contains__(self, seq_id: Hashable) -> bool:
        return seq_id in self._tables

    def block_ids(self, seq_id: Hashable) -> list[int]:
        """Physical ids, of device blocks when resident or of host blocks when swapped."""
        return self._table(seq_id).block_ids

    def num_tokens(self, seq_id: Hashable) -> int:
        return self._table(seq_id).num_tokens

    def sequence_state(self, seq_id: Hashable) -> SequenceState:
        return self._table(seq_id).state

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def stats(self) -> BlockStats:
        tables = self._tables.values()
        return BlockStats(
            num_blocks=self.pool.num_blocks,
            num_empty=self.pool.num_empty,
            num_cached=self.pool.num_cached,
            num_in_use=self.pool.num_in_use,
            num_pinned=self.pool.num_pinned,
            num_host_blocks=self.host_pool.num_blocks,
            num_swapped=self.host_pool.num_in_use,
            num_sequences=len(self._tables),
            num_tokens=sum(t.num_tokens for t in tables),
            num_allocated_slots=sum(len(t.blocks) for t in tables) * self.block_size,
            prefix_cache_queries=self._prefix_queries,
            prefix_cache_hits=self._prefix_hits,
        )

    # -- helpers ------------------------------------------------------------------------
    def _num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _table(self, seq_id: Hashable) -> BlockTable:
        try:
            return self._tables[seq_id]
        except KeyError:
            raise UnknownSequenceError(seq_id) from None

    def _resident(self, seq_id: Hashable, action: str) -> BlockTable:
        table = self._table(seq_id)
        if table.state is not SequenceState.RESIDENT:
            raise SequenceStateError(seq_id, "swapped out", action, "swap it in first")
        return table

    def _swapped(self, seq_id: Hashable, action: str) -> BlockTable:
        table = self._table(seq_id)
        if table.state is not SequenceState.SWAPPED:
            raise SequenceStateError(seq_id, "resident", action, "swap it out first")
        return table
