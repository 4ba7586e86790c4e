"""InferCept's min-waste handling of a context while its agent waits on a tool: preserve,
swap or discard, each iteration's swaps within what its compute hides."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from engine import Engine, Shortfall
from kvgov.benchmarks.baselines.costs import Costs
from kvgov.benchmarks.swarm.runner import Agent

__all__ = ["Intercept"]

_STEP_WEIGHT = 0.2  # of the newest step in the running mean of a step's seconds


@dataclass(slots=True)
class _Paused:
    """A context whose agent waits on a tool, as InferCept prices it."""

    budget: str
    num_blocks: int
    num_tokens: int
    expected_s: float  # the tool's expected duration, known when it was called
    since: float  # run seconds when the call ended in the tool call

    def remaining_s(self, now: float) -> float:
        return max(0.0, self.expected_s - (now - self.since))


@dataclass(slots=True)
class Intercept:
    """InferCept (Abhyankar et al., "INFERCEPT: Efficient Intercept Support for Augmented
    Large Language Model Inference", ICML 2024; its reference scheduler is
    WukLab/InferCept, vllm/core/scheduler_v2.py). What it follows, on the bundled engine:

    - Original arrival: a resumed call is the same request to InferCept, so it keeps the
      arrival of the agent's program (``order_time``, the agent's start) and is not
      queued behind calls of programs that arrived later; every call has priority 0
      (first come, first served on that arrival).
    - Min-waste choice (the paper's waste equations, memory held x time, in
      block-seconds), for a context of ``C`` blocks whose tool has ``T_tool`` seconds
      left, with ``C_others`` the blocks other requests hold on the device now (running
      requests and other agents' retained contexts, a shared block counted once):

      - preserve (``keep``): ``T_tool x C``;
      - discard: ``T_recompute(C) x (C + C_others)``: the recompute holds its own blocks
        and stalls every other resident block;
      - swap: ``2 x T_swap(C) x (C + C_others)``: out and back in, the batch waiting on
        each copy that compute does not hide.

      ``T_recompute`` and ``T_swap`` come from ``Costs``. Preserve is the engine's
      ``retain``; swap is ``retain`` then ``offload``, back with ``restore`` before the
      next call (the engine also brings it back before the call's request is allocated);
      discard lets the blocks go to the prefix cache, whatever is still cached there is
      reused. Swap is out of the running when the host lacks room for the context.
    - Swap pipelining and the per-iteration swap limit: copies that run beside an
      iteration's compute waste nothing, so each iteration may swap out at most
      ``step seconds / T_swap(one block)`` blocks (one iteration's compute times the link's
      bandwidth over a block's bytes): a context that fits what is left of it is swapped
      at no waste; one beyond it is preserved or discarded by its waste, and may be
      swapped in a later iteration (below). The step's seconds are ``step_s`` or the
      running mean of the intervals between the runner's ticks around a step (the
      runner's clock: virtual on the twin). The swap back in comes with the next call,
      beside that iteration's compute in the same way. Copies overlap compute where
      ``copies_overlap`` says so, by default on CUDA, where the engine copies on a side
      stream (on the twin, pass the modelled device's ``copies_overlap_compute``); on the
      CPU a copy is a memcpy between two steps, overlapping nothing, so the limit is 0
      blocks. Where the limit is 0 (no overlap, or no step timed yet) the paper's rule
      with no overlap remains: swap only when its full waste is the least of the three.
    - Chunked recomputation: a discarded context comes back through the engine's chunked
      prefill (``engine.scheduler``): its next request is admitted with blocks for all of
      its tokens and computed ``max_num_batched_tokens`` at a time beside the running
      decodes, which keep decoding. On this engine a step's time grows with its tokens,
      so the other blocks still wait for the recompute's seconds: the discard waste keeps
      its ``C_others`` term.
    - Re-decision under pressure: InferCept weighs each paused context again every
      iteration, with its tool's remaining time and the batch as it is then. Here that
      happens at each ``tick`` (between two steps) while the device runs short (the
      request first in the scheduler's order lacks blocks): preserved contexts are
      taken in the paper's order, the longest remaining tool first, and each whose
      waste now favours swapping (within this iteration's limit, or at the least full
      waste where copies do not overlap) or discarding is moved, until the shortfall is
      covered.

    ``decisions`` counts the choices: ``keep``, ``swap`` and ``discard`` when a call
    ends in a tool call, ``swap later`` and ``discard later`` for preserved contexts
    re-decided under pressure; ``swapped_blocks`` is the blocks swapped out in each
    iteration that swapped any (where copies overlap, each within that iteration's limit).
    """

    # The paper derives its choices from profiled costs; a user may only fix the
    # iteration's seconds that set the swap limit (``step_s``) instead of timing them.
    KNOBS: ClassVar[tuple[str, ...]] = ("step_s",)
    costs: Costs
    name: str = "intercept"
    copies_overlap: bool | None = field(default=None, kw_only=True)  # None: on CUDA
    step_s: float | None = field(default=None, kw_only=True)  # None: measured per step
    decisions: dict[str, int] = field(default_factory=dict)
    swapped_blocks: list[int] = field(default_factory=list)
    _preserved: dict[str, _Paused] = field(default_factory=dict, init=False, repr=False)
    _swapped: set[str] = field(default_factory=set, init=False, repr=False)
    # Blocks this iteration may still swap out, and those it has.
    _swap_left: int | None = field(default=None, init=False, repr=False)
    _swapped_now: int = field(default=0, init=False, repr=False)
    _measured_step_s: float | None = field(default=None, init=False, repr=False)
    _last_tick: float | None = field(default=None, init=False, repr=False)
    # Requests were unfinished at the last tick: the runner steps before the next one.
    _stepping: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.step_s is not None and not (
            isinstance(self.step_s, (int, float))
            and not isinstance(self.step_s, bool)
            and 0 < self.step_s < math.inf
        ):
            raise ValueError(
                f"step_s is one iteration's compute in seconds, a positive number; got "
                f"{self.step_s!r} (leave it None to time the engine's steps)"
            )
        if not (self.copies_overlap is None or isinstance(self.copies_overlap, bool)):
            raise ValueError(
                f"copies_overlap must be True, False or None (None: on CUDA), got "
                f"{self.copies_overlap!r}"
            )

    def priority(self, agent: Agent) -> int:
        return 0

    def order_time(self, agent: Agent) -> float | None:
        return agent.started_at

    # -- the waste terms --------------------------------------------------------------
    def num_other_blocks(self, engine: Engine, budget: str) -> int:
        """``C_others``: device blocks that requests of other budgets hold now, running
        or retained (a block two of them share counted once)."""
        manager = engine.block_manager
        held: set[int] = set()
        for request in engine.scheduler.running:
            if request.budget != budget:
                held.update(manager.block_ids(request.request_id))
        retained = engine.retained
        for other in retained.held_budgets():
            seq_id = retained.held_seq_id(other)
            if other != budget and seq_id is not None and not retained.is_offloaded(other):
                held.update(manager.block_ids(seq_id))
        return len(held)

    def waste(
        self, *, num_blocks: int, num_tokens: int, remaining_s: float, num_other_blocks: int
    ) -> dict[str, float]:
        """Each choice's waste in block-seconds, none of its copies hidden."""
        batch = num_blocks + num_other_blocks
        return {
            "keep": remaining_s * num_blocks,
            "discard": num_tokens * self.costs.prefill_s_per_token * batch,
            "swap": 2 * num_blocks * self.costs.swap_s_per_block * batch,
        }

    def overlaps(self, engine: Engine) -> bool:
        """Whether the engine's copies run beside its compute."""
        if self.copies_overlap is not None:
            return self.copies_overlap
        return engine.device.type == "cuda"

    def swap_limit(self, engine: Engine) -> int:
        """Blocks one iteration may swap out with its compute hiding the copies (0 where
        copies do not overlap, or before a step's seconds are known)."""
        step_s = self.step_s if self.step_s is not None else self._measured_step_s
        if not self.overlaps(engine) or step_s is None:
            return 0
        if self.costs.swap_s_per_block <= 0:  # a free link: every copy is hidden
            return engine.block_manager.host_pool.num_blocks
        return int(step_s / self.costs.swap_s_per_block)

    def _choose(self, engine: Engine, paused: _Paused, now: float) -> str:
        waste = self.waste(
            num_blocks=paused.num_blocks,
            num_tokens=paused.num_tokens,
            remaining_s=paused.remaining_s(now),
            num_other_blocks=self.num_other_blocks(engine, paused.budget),
        )
        if engine.block_manager.host_pool.num_free_blocks < paused.num_blocks:
            del waste["swap"]
        elif self.swap_limit(engine) > 0:
            if self._limit_left(engine) >= paused.num_blocks:
                waste["swap"] = 0.0  # hidden behind this iteration's compute
            else:  # it would stall the batch: preserve or discard it for now
                del waste["swap"]
        return min(waste, key=waste.__getitem__)  # a tie keeps the context

    # -- the runner's hooks -------------------------------------------------------------
    def on_idle(self, engine: Engine, agent: Agent, now: float) -> None:
        num_blocks = math.ceil(agent.context_tokens / engine.config.block_size)
        paused = _Paused(agent.budget, num_blocks, agent.context_tokens, agent.tool_expected_s, now)
        choice = self._choose(engine, paused, now)
        self._count(choice)
        if choice == "discard" or not engine.retain(agent.budget):
            return  # nothing of it is cached any more: as good as discarded
        if choice == "swap" and self._swap(engine, agent.budget):
            return
        self._preserved[agent.budget] = paused

    def before_call(self, engine: Engine, agent: Agent) -> None:
        self._preserved.pop(agent.budget, None)  # its request takes the held blocks over
        if agent.budget in self._swapped:
            self._swapped.discard(agent.budget)
            engine.restore(budget=agent.budget)

    def quiet_until(self, now: float) -> float:
        """Preserved contexts are decided again under pressure at every step, which needs
        each step's engine state; without any, a tick only times the steps."""
        return now if self._preserved else math.inf

    def tick(self, engine: Engine, now: float) -> None:
        if self._stepping and self._last_tick is not None:
            seen = now - self._last_tick
            mean = self._measured_step_s
            self._measured_step_s = seen if mean is None else mean + _STEP_WEIGHT * (seen - mean)
        self._last_tick, self._stepping = now, engine.has_unfinished()
        self._forget_reclaimed(engine)
        if self._preserved:
            num_short = _num_short_blocks(engine)
            if num_short > 0:
                self._redecide(engine, now, num_short)
        if self._swapped_now:
            self.swapped_blocks.append(self._swapped_now)
        self._swap_left, self._swapped_now = self.swap_limit(engine), 0

    # -- helpers ------------------------------------------------------------------------
    def _redecide(self, engine: Engine, now: float, num_short: int) -> None:
        """Move preserved contexts whose waste now favours it, the longest remaining tool
        first, until ``num_short`` device blocks are freed."""
        for paused in sorted(self._preserved.values(), key=lambda p: -p.remaining_s(now)):
            if num_short <= 0:
                return
            choice = self._choose(engine, paused, now)
            if choice == "keep":
                continue
            del self._preserved[paused.budget]
            num_short -= engine.retained.num_host_blocks_needed(paused.budget)  # on device
            if choice == "swap" and self._swap(engine, paused.budget):
                self._count("swap later")
            else:
                engine.release_retained(paused.budget)
                self._count("discard later")

    def _swap(self, engine: Engine, budget: str) -> bool:
        """Offload the budget's held context; False when the host has no room for it."""
        num_blocks = engine.retained.num_host_blocks_needed(budget)
        if num_blocks > engine.block_manager.host_pool.num_free_blocks:
            return False
        engine.offload(budget=budget)
        self._swapped.add(budget)
        self._swap_left = max(0, self._limit_left(engine) - num_blocks)
        self._swapped_now += num_blocks
        return True

    def _limit_left(self, engine: Engine) -> int:
        if self._swap_left is None:  # the first iteration's
            self._swap_left = self.swap_limit(engine)
        return self._swap_left

    def _forget_reclaimed(self, engine: Engine) -> None:
        """The engine takes holds back when a request is short of blocks (to host memory,
        else ended): what it moved is swapped, what it ended is discarded, no longer ours
        to re-decide."""
        retained = engine.retained
        held = retained.held_budgets()
        for budget in list(self._preserved):
            if budget not in held:
                del self._preserved[budget]
            elif retained.is_offloaded(budget):
                del self._preserved[budget]
                self._swapped.add(budget)

    def _count(self, choice: str) -> None:
        self.decisions[choice] = self.decisions.get(choice, 0) + 1


def _num_short_blocks(engine: Engine) -> int:
    """Device blocks the request first in the scheduler's order lacks to be admitted (a
    resumed call waiting for its context to come back included); 0 when it fits or
    nothing waits."""
    waiting = engine.scheduler.waiting
    if not waiting:
        return 0
    head = min(waiting, key=lambda request: request.sort_key())
    fit = engine.scheduler.admission_fit(head)
    if fit or fit.shortfall is not Shortfall.POOL:
        return 0
    return fit.needed - fit.available
