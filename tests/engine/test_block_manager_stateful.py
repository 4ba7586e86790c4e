"""Random interleavings of every block-manager operation, checked after each step.

Besides the bookkeeping invariants (every block accounted for exactly once, reference
counts equal to the tables and pins that hold a block, budgets and ceilings never
exceeded, nothing leaks), the machine keeps a shadow of the KV data: each slot of each
device and host block holds the identity of the token prefix whose K/V it stores. The
moves the manager returns (copy on write, swap out, swap in) are applied to the shadow,
so a wrong move, a bad prefix-cache hit or a premature reuse shows up as a sequence
reading someone else's K/V.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from engine.block_manager import BlockManager
from engine.block_results import Fit
from engine.block_table import SequenceState
from engine.errors import CapacityError, SequenceStateError

BLOCK_SIZE = 4
NUM_BLOCKS = 24
NUM_HOST_BLOCKS = 10
SALTS = [None, "tenant-a"]
BUDGETS = ["b0", "b1"]

# A few shared openings so that prefix-cache hits and forks of equal text happen often.
PREFIXES = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9, 9, 9], [5] * 12]
tokens_st = st.lists(st.integers(0, 20), min_size=0, max_size=14)


def _slot_identity(salt: str | None, tokens: list[int], pos: int) -> tuple:
    # What a correct K/V slot at ``pos`` depends on: the tenant and every token up to it.
    return (salt, tuple(tokens[: pos + 1]))


class BlockManagerMachine(RuleBasedStateMachine):
    seqs = Bundle("seqs")

    def __init__(self) -> None:
        super().__init__()
        self.mgr = BlockManager(
            num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, num_host_blocks=NUM_HOST_BLOCKS
        )
        self.next_id = 0
        self.salt: dict[int, str | None] = {}
        self.device: dict[int, list[tuple | None]] = {}
        self.host: dict[int, list[tuple | None]] = {}
        self.pins: list = []

    # -- shadow data -----------------------------------------------------------------
    def _write(self, seq: int, start: int) -> None:
        tokens = self.mgr._tables[seq].token_ids
        ids = self.mgr.block_ids(seq)
        for pos in range(start, len(tokens)):
            slots = self.device.setdefault(ids[pos // BLOCK_SIZE], [None] * BLOCK_SIZE)
            slots[pos % BLOCK_SIZE] = _slot_identity(self.salt[seq], tokens, pos)

    def _move(self, moves, src: dict, dst: dict) -> None:
        snapshot = {s: list(src.get(s, [None] * BLOCK_SIZE)) for s, _ in moves}
        for s, d in moves:
            dst[d] = list(snapshot[s])

    def _refused_without_change(self, fit: Fit, act) -> None:
        before = (self.mgr.stats(), {s: self.mgr.block_ids(s) for s in self.mgr._tables})
        with pytest.raises(CapacityError) as info:
            act()
        assert info.value.needed == fit.needed and info.value.available == fit.available
        after = (self.mgr.stats(), {s: self.mgr.block_ids(s) for s in self.mgr._tables})
        assert before == after

    # -- rules -----------------------------------------------------------------------
    @rule(
        target=seqs,
        prefix=st.sampled_from([*PREFIXES, []]),
        tail=tokens_st,
        salt=st.sampled_from(SALTS),
        budget=st.sampled_from([*BUDGETS, None]),
        ceiling=st.sampled_from([None, 8, 20, 40]),
    )
    def allocate(self, prefix, tail, salt, budget, ceiling):
        tokens = prefix + tail or [0]
        if budget is not None and budget not in {b.name for b in self.mgr.budgets}:
            budget = None
        seq = self.next_id
        self.next_id += 1
        fit = self.mgr.can_allocate(tokens, budget=budget, ceiling_tokens=ceiling, cache_salt=salt)
        kwargs = dict(budget=budget, ceiling_tokens=ceiling, cache_salt=salt)
        if not fit:
            self._refused_without_change(fit, lambda: self.mgr.allocate(seq, tokens, **kwargs))
            return None
        alloc = self.mgr.allocate(seq, tokens, **kwargs)
        self.salt[seq] = salt
        assert alloc.num_cached_tokens < len(tokens)
        self._write(seq, alloc.num_cached_tokens)
        return seq

    @rule(seq=seqs, tokens=tokens_st)
    def append(self, seq, tokens):
        if seq not in self.mgr or self.mgr.sequence_state(seq) is SequenceState.SWAPPED:
            return
        fit = self.mgr.can_append(seq, len(tokens))
        if not fit:
            self._refused_without_change(fit, lambda: self.mgr.append(seq, tokens))
            return
        start = self.mgr.num_tokens(seq)
        result = self.mgr.append(seq, tokens)
        self._move(result.copies, self.device, self.device)
        self._write(seq, start)

    @rule(seq=seqs, fraction=st.floats(0, 1))
    def mark_computed(self, seq, fraction):
        if seq in self.mgr and self.mgr.sequence_state(seq) is SequenceState.RESIDENT:
            self.mgr.mark_computed(seq, int(self.mgr.num_tokens(seq) * fraction))

    @rule(target=seqs, seq=seqs)
    def fork(self, seq):
        if seq not in self.mgr or self.mgr.sequence_state(seq) is SequenceState.SWAPPED:
            return None
        fit = self.mgr.can_fork(seq)
        child = self.next_id
        self.next_id += 1
        if not fit:
            self._refused_without_change(fit, lambda: self.mgr.fork(seq, child))
            return None
        self.mgr.fork(seq, child)
        self.salt[child] = self.salt[seq]
        return child

    @rule(seq=consumes(seqs))
    def free(self, seq):
        if seq in self.mgr:
            self.mgr.free(seq)

    @rule(seq=seqs)
    def swap_out(self, seq):
        if seq not in self.mgr:
            return
        if self.mgr.sequence_state(seq) is SequenceState.SWAPPED:
            with pytest.raises(SequenceStateError):
                self.mgr.swap_out(seq)
            return
        fit = self.mgr.can_swap_out(seq)
        if not fit:
            self._refused_without_change(fit, lambda: self.mgr.swap_out(seq))
            return
        self._move(self.mgr.swap_out(seq), self.device, self.host)

    @rule(seq=seqs)
    def swap_in(self, seq):
        if seq not in self.mgr or self.mgr.sequence_state(seq) is SequenceState.RESIDENT:
            return
        fit = self.mgr.can_swap_in(seq)
        if not fit:
            self._refused_without_change(fit, lambda: self.mgr.swap_in(seq))
            return
        self._move(self.mgr.swap_in(seq), self.host, self.device)

    @rule(seq=seqs, num_tokens=st.integers(0, 40))
    def pin(self, seq, num_tokens):
        if seq not in self.mgr or self.mgr.sequence_state(seq) is SequenceState.SWAPPED:
            return
        table = self.mgr._tables[seq]
        n = min(num_tokens, table.num_tokens) // BLOCK_SIZE
        if 0 < n <= table.num_cached_blocks:
            self.pins.append(self.mgr.pin(seq, num_tokens))

    @precondition(lambda self: self.pins)
    @rule(index=st.integers(0, 100))
    def unpin(self, index):
        self.mgr.unpin(self.pins.pop(index % len(self.pins)))

    @rule(name=st.sampled_from(BUDGETS), max_blocks=st.integers(0, 16))
    def open_or_close_budget(self, name, max_blocks):
        names = {b.name for b in self.mgr.budgets}
        if name not in names:
            self.mgr.budgets.open(name, max_blocks=max_blocks)
        elif self.mgr.budgets.get(name).num_blocks == 0 and not self.mgr.budgets.get(name).seq_ids:
            self.mgr.budgets.close(name)

    # -- invariants ------------------------------------------------------------------
    @invariant()
    def every_block_accounted_once(self):
        pool, stats = self.mgr.pool, self.mgr.stats()
        assert stats.num_empty + stats.num_cached + stats.num_in_use == NUM_BLOCKS
        free_ids = [b.block_id for b in pool._free_queue]
        assert len(free_ids) == len(set(free_ids)) == stats.num_free
        assert set(free_ids) == {b.block_id for b in pool.blocks if b.ref_cnt == 0}
        assert stats.num_cached == sum(
            1 for b in pool.blocks if b.ref_cnt == 0 and b.block_hash is not None
        )
        assert stats.num_swapped + self.mgr.host_pool.num_free_blocks == NUM_HOST_BLOCKS
        # Where new runs may start: exactly the free blocks with no cached content.
        assert [i for i in range(NUM_BLOCKS) if pool.is_empty(i)] == [
            b.block_id for b in pool.blocks if b.ref_cnt == 0 and b.block_hash is None
        ]

    @invariant()
    def ref_counts_match_holders(self):
        expected = [0] * NUM_BLOCKS
        expected_host = [0] * NUM_HOST_BLOCKS
        for table in self.mgr._tables.values():
            target = expected if table.state is SequenceState.RESIDENT else expected_host
            for block in table.blocks:
                target[block.block_id] += 1
        for block in self.mgr.pool.blocks:
            assert block.ref_cnt >= 0 and 0 <= block.num_pins <= block.ref_cnt
            assert block.ref_cnt == expected[block.block_id] + block.num_pins
        for block in self.mgr.host_pool.blocks:
            assert block.ref_cnt == expected_host[block.block_id] <= 1
        assert self.mgr.pool.num_pinned == sum(1 for b in self.mgr.pool.blocks if b.num_pins)

    @invariant()
    def prefix_cache_is_consistent(self):
        for block_hash, block in self.mgr.pool.cached.items():
            assert block.block_hash == block_hash
        for block in self.mgr.pool.blocks:
            if block.block_hash is not None:
                assert self.mgr.pool.cached[block.block_hash] is block

    @invariant()
    def budgets_and_ceilings_hold(self):
        for budget in self.mgr.budgets:
            held = sum(len(self.mgr._tables[s].blocks) for s in budget.seq_ids)
            assert budget.num_blocks == held <= budget.max_blocks
        for table in self.mgr._tables.values():
            assert len(table.blocks) == -(-table.num_tokens // BLOCK_SIZE)
            if table.ceiling_tokens is not None:
                assert table.num_tokens <= table.ceiling_tokens

    @invariant()
    def every_sequence_reads_its_own_kv(self):
        for seq, table in self.mgr._tables.items():
            store = self.device if table.state is SequenceState.RESIDENT else self.host
            for pos in range(table.num_tokens):
                block_id = table.blocks[pos // BLOCK_SIZE].block_id
                got = store[block_id][pos % BLOCK_SIZE]
                assert got == _slot_identity(self.salt[seq], table.token_ids, pos), (seq, pos)

    def teardown(self):
        for pin in self.pins:
            self.mgr.unpin(pin)
        for seq in list(self.mgr._tables):
            self.mgr.free(seq)
        for budget in list(self.mgr.budgets):
            assert budget.num_blocks == 0
            self.mgr.budgets.close(budget.name)
        stats = self.mgr.stats()
        assert stats.num_in_use == 0 and stats.num_swapped == 0 and stats.num_pinned == 0
        assert stats.num_empty + stats.num_cached == NUM_BLOCKS


_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
TestBlockManagerStateful = BlockManagerMachine.TestCase
TestBlockManagerStateful.settings = settings(max_examples=200, stateful_step_count=50, **_common)


class _SlowMachine(BlockManagerMachine):
    pass


TestBlockManagerStatefulLong = pytest.mark.slow(_SlowMachine.TestCase)
TestBlockManagerStatefulLong.settings = settings(
    max_examples=2000, stateful_step_count=100, **_common
)
