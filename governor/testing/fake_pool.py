"""``FakePool``: the fake backend's block accounting, with no model and no threads.

It keeps the engine's rules about memory:

- a pool of ``num_blocks`` blocks of ``block_size`` tokens; pins hold their full blocks
  until unpinned, and a call whose prompt starts with a pinned prefix (same cache salt)
  shares those blocks and reports them as ``cached_tokens``;
- a call holds the blocks of its prompt and output in its budget while it runs and
  returns them when it ends; like the engine it holds K/V for every token but the
  newest (that one would be written by the step that never comes), so a finished call
  held ``ceil((prompt + output - 1) / block_size)`` blocks;
- it ends with ``"ceiling"`` when prompt plus output reach the ceiling, ``"budget"`` when
  the next token's K/V would need a block past its budget (or past the whole pool), and
  is refused up front with ``BackendError`` when its prompt alone can never fit.

Because the script is known up front, a call takes every block it will need when it is
admitted (``plan_output`` decides what it will produce), where the engine takes them one
by one; the peaks agree, and the fake never needs to preempt. ``FakePool`` is a plain,
synchronous class: its owner holds a lock around every call and wakes its waiters after
a call that returns blocks.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import tiktoken

from governor.backend import GenerationRequest
from governor.errors import BackendError
from governor.testing.fake_plan import Plan, plan_output

__all__ = ["NAME", "Call", "FakePool", "block_keys", "fake_error"]

NAME = "fake"


@dataclass(slots=True, eq=False)
class Call:
    """A call in flight: what it will produce and the blocks it holds meanwhile."""

    plan: Plan
    budget: str | None
    num_pool_blocks: int  # device blocks it took from the pool
    shared: tuple[bytes, ...]  # keys of the pinned blocks it uses
    num_tokens: int = 0  # prompt plus planned output
    swapped: bool = False
    held: bool = False  # offloaded on request: stays swapped until restore
    ended: bool = False
    aborted: bool = False


@dataclass(slots=True)
class _Budget:
    max_blocks: int
    num_blocks: int = 0
    num_calls: int = 0
    latest_blocks: int = 0  # full blocks of K/V its latest finished call computed
    retained: int = 0  # of those, blocks held by ``retain``
    retained_swapped: bool = False


class FakePool:
    """Blocks, budgets, pins and the calls that hold them; guarded by its owner's lock.

    ``peak`` is the most device blocks ever in use at once (pins included);
    ``num_swapped`` the host blocks holding offloaded calls; ``prefix_cache_queries`` and
    ``prefix_cache_hits`` count prompt tokens looked up and served by pinned blocks.
    """

    def __init__(
        self,
        *,
        num_blocks: int,
        block_size: int,
        num_host_blocks: int,
        max_model_len: int,
        encoding: tiktoken.Encoding,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_model_len = max_model_len
        self._num_host_blocks = num_host_blocks
        self._encoding = encoding
        self._budgets: dict[str, _Budget] = {}
        self._pinned: dict[bytes, int] = {}  # block key -> number of pins holding it
        self._shared: dict[bytes, int] = {}  # pinned block key -> number of calls using it
        self._pins: dict[str, tuple[bytes, ...]] = {}
        self._shared_pins: dict[str, tuple[bytes, ...]] = {}  # unsalted keys, by pin
        self._num_pins = 0
        self._calls: set[Call] = set()
        self._num_call_blocks = 0  # device blocks held by calls
        self.num_swapped = 0
        self.peak = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    @property
    def num_in_use(self) -> int:
        # A block unpinned while calls still use it stays in use until they end.
        orphans = sum(key not in self._pinned for key in self._shared)
        return len(self._pinned) + orphans + self._num_call_blocks + self._num_retained

    @property
    def _num_retained(self) -> int:
        return sum(b.retained for b in self._budgets.values() if not b.retained_swapped)

    @property
    def num_free(self) -> int:
        return self.num_blocks - self.num_in_use

    @property
    def num_pinned(self) -> int:
        return len(self._pinned)

    @property
    def num_running(self) -> int:
        """Calls in flight that are not swapped out."""
        return sum(not c.swapped for c in self._calls)

    # -- budgets ------------------------------------------------------------------------
    def open_budget(self, name: str, *, max_blocks: int) -> None:
        if name in self._budgets:
            raise fake_error(f"budget {name!r} is already open; close it or pick another name")
        self._budgets[name] = _Budget(max_blocks)

    def resize_budget(self, name: str, *, max_blocks: int) -> None:
        budget = self._budget(name)
        if max_blocks < budget.num_blocks:
            raise fake_error(
                f"budget {name!r} holds {budget.num_blocks} block(s); it cannot shrink to "
                f"{max_blocks} until its calls return some"
            )
        budget.max_blocks = max_blocks

    def close_budget(self, name: str) -> None:
        budget = self._budget(name)
        if budget.num_calls:
            raise fake_error(
                f"budget {name!r} still has {budget.num_calls} call(s) in flight; let them "
                "finish before closing it"
            )
        self.release_retained(name)
        del self._budgets[name]

    # -- retained contexts --------------------------------------------------------------
    def retain(self, name: str) -> int:
        """Hold the full blocks of the budget's latest finished call (as many as are free:
        the engine holds only what its prefix cache still has); the tokens held."""
        budget = self._budget(name)
        self.release_retained(name)
        budget.retained = min(budget.latest_blocks, self.num_free)
        self.peak = max(self.peak, self.num_in_use)
        return budget.retained * self.block_size

    def release_retained(self, name: str) -> None:
        budget = self._budget(name)
        if budget.retained_swapped:
            self.num_swapped -= budget.retained
        budget.retained, budget.retained_swapped = 0, False

    def offload(self, budget: str) -> None:
        """Swap the budget's calls in flight and its retained blocks out to host blocks
        until ``restore``."""
        group = self._budget(budget)
        calls = [c for c in self._calls if c.budget == budget]
        needed = sum(c.num_pool_blocks for c in calls if not c.swapped)
        needed += 0 if group.retained_swapped else group.retained
        available = self._num_host_blocks - self.num_swapped
        if needed > available:  # all or nothing, as in the engine
            raise fake_error(
                f"offloading budget {budget!r} needs {needed} free host block(s) but only "
                f"{available} are free; restore other budgets first or give the backend "
                "more num_host_blocks"
            )
        for call in calls:
            if not call.swapped:
                call.swapped = True
                self._num_call_blocks -= call.num_pool_blocks
                self.num_swapped += call.num_pool_blocks
            call.held = True
        if group.retained and not group.retained_swapped:
            group.retained_swapped = True
            self.num_swapped += group.retained

    def restore(self, budget: str) -> None:
        """Let the budget's calls come back, each once its blocks are free (``resume``);
        its retained blocks now if they fit, else with its next call."""
        group = self._budget(budget)
        if group.retained_swapped and group.retained <= self.num_free:
            group.retained_swapped = False
            self.num_swapped -= group.retained
            self.peak = max(self.peak, self.num_in_use)
        for call in self._calls:
            if call.budget == budget:
                call.held = False

    # -- pins ---------------------------------------------------------------------------
    def pin(self, keys: tuple[bytes, ...], *, shared: bool = False) -> str:
        """Pin the blocks of ``keys`` (from ``block_keys``); the handle's key. ``shared``
        (unsalted keys): salted calls that start with them hit them too."""
        new = len({k for k in keys if k not in self._pinned and k not in self._shared})
        free = self.num_free
        if new > free:
            raise fake_error(
                f"pinning needs {new} free block(s) but only {free} are free; unpin "
                "prefixes, wait for calls to finish, or give the backend more blocks"
            )
        for key in keys:
            self._pinned[key] = self._pinned.get(key, 0) + 1
        handle_key = f"{NAME}-prefix-{self._num_pins}"
        self._num_pins += 1
        self._pins[handle_key] = keys
        if shared:
            self._shared_pins[handle_key] = keys
        self.peak = max(self.peak, self.num_in_use)
        return handle_key

    def unpin(self, handle_key: str) -> None:
        keys = self._pins.pop(handle_key, None)
        self._shared_pins.pop(handle_key, None)
        if keys is None:
            raise fake_error(
                f"prefix {handle_key!r} is not pinned here: it was already unpinned or was "
                "pinned by another backend; unpin each handle once, on the backend that "
                "made it"
            )
        for key in keys:
            self._pinned[key] -= 1
            if not self._pinned[key]:
                del self._pinned[key]

    def _keys(self, prompt_ids: list[int], salt: str | None) -> tuple[bytes, ...]:
        """A call's block keys: the leading blocks of a shared pin unsalted, as the
        engine hashes them (engine.prefix_hash), the rest salted."""
        if salt is None or not self._shared_pins:
            return block_keys(prompt_ids, self.block_size, salt)
        plain = block_keys(prompt_ids, self.block_size, None)
        shared = {key for keys in self._shared_pins.values() for key in keys}
        k = next((i for i, key in enumerate(plain) if key not in shared), len(plain))
        return block_keys(prompt_ids, self.block_size, salt, num_shared_blocks=k)

    # -- calls: admit, resume, release --------------------------------------------------
    def admit(
        self,
        request: GenerationRequest,
        prompt_ids: list[int] | None,
        num_prompt: int,
        script: list[int],
    ) -> Call | None:
        """Admit the call if its blocks are free now; None to wait; raise if it never fits."""
        bs = self.block_size
        ceiling = min(request.ceiling_tokens or self.max_model_len, self.max_model_len)
        if num_prompt == 0:
            raise fake_error("the prompt is empty; send at least one token")
        if num_prompt >= ceiling:
            raise fake_error(
                f"the prompt has {num_prompt} tokens, so the ceiling of {ceiling} leaves no room "
                "for a reply; compact the context or raise the ceiling"
            )
        num_prompt_blocks = math.ceil(num_prompt / bs)
        keys = () if prompt_ids is None else self._keys(prompt_ids, request.cache_salt)
        num_hit = next((i for i, key in enumerate(keys) if key not in self._pinned), len(keys))
        cached_tokens = min(num_hit * bs, (num_prompt - 1) // bs * bs)
        num_shared = cached_tokens // bs
        pool_limit = self.num_blocks - len(self._pinned) + num_shared
        if num_prompt_blocks > pool_limit:
            raise fake_error(
                f"the prompt needs {num_prompt_blocks} block(s) but the pool holds at most "
                f"{pool_limit} besides pinned prefixes; shorten it, unpin prefixes or give "
                "the backend more blocks"
            )
        limit = pool_limit
        budget = None if request.budget is None else self._budget(request.budget)
        if budget is not None:
            self.release_retained(request.budget)  # type: ignore[arg-type]  # the call takes over
            if num_prompt_blocks > budget.max_blocks:
                raise fake_error(
                    f"budget {request.budget!r} caps its calls at {budget.max_blocks} block(s) "
                    f"and the prompt alone needs {num_prompt_blocks}; shorten it or resize the "
                    "budget"
                )
            limit = min(limit, budget.max_blocks - budget.num_blocks)
            if num_prompt_blocks > limit:
                return None  # its budget is busy with calls in flight
        plan = plan_output(
            script,
            self._encoding,
            num_prompt=num_prompt,
            block_size=bs,
            max_tokens=request.max_tokens,
            ceiling=ceiling,
            max_table_blocks=limit,
            stop=request.stop,
            cached_tokens=cached_tokens,
        )
        num_pool_blocks = plan.num_table_blocks - num_shared
        if num_pool_blocks > self.num_free:
            return None
        num_tokens = num_prompt + len(plan.token_ids)
        call = Call(plan, request.budget, num_pool_blocks, keys[:num_shared], num_tokens)
        self._calls.add(call)
        for key in call.shared:
            self._shared[key] = self._shared.get(key, 0) + 1
        self._num_call_blocks += num_pool_blocks
        self.peak = max(self.peak, self.num_in_use)
        if budget is not None:
            budget.num_blocks += plan.num_table_blocks
            budget.num_calls += 1
        if prompt_ids is not None:
            self.prefix_cache_queries += num_prompt
            self.prefix_cache_hits += cached_tokens
        return call

    def resume(self, call: Call) -> bool | None:
        """True when the call may produce its next token, False when it was aborted, None
        while it is offloaded (held, or restored but waiting for free blocks)."""
        if call.aborted:
            return False
        if call.held:
            return None
        if call.swapped:
            if call.num_pool_blocks > self.num_free:
                return None
            call.swapped = False
            self.num_swapped -= call.num_pool_blocks
            self._num_call_blocks += call.num_pool_blocks
            self.peak = max(self.peak, self.num_in_use)
        return True

    def release(self, call: Call) -> None:
        """Return the call's blocks; a second release of the same call does nothing."""
        if call.ended:
            return
        call.ended = True
        self._calls.discard(call)
        for key in call.shared:
            self._shared[key] -= 1
            if not self._shared[key]:
                del self._shared[key]
        if call.swapped:
            self.num_swapped -= call.num_pool_blocks
        else:
            self._num_call_blocks -= call.num_pool_blocks
        if call.budget is not None:
            budget = self._budgets[call.budget]
            budget.num_blocks -= call.plan.num_table_blocks
            budget.num_calls -= 1
            budget.latest_blocks = (call.num_tokens - 1) // self.block_size

    def abort_all(self) -> None:
        """Mark every call in flight aborted; each ends at its next ``resume``."""
        for call in self._calls:
            call.aborted = True

    def _budget(self, name: str) -> _Budget:
        try:
            return self._budgets[name]
        except KeyError:
            raise fake_error(
                f"no budget named {name!r}; open it with open_budget() first"
            ) from None


def block_keys(
    token_ids: Sequence[int], block_size: int, salt: str | None, *, num_shared_blocks: int = 0
) -> tuple[bytes, ...]:
    """A key per full block, chained from the salt: equal keys mean equal prefixes. The
    first ``num_shared_blocks`` are unsalted, the salt coming in after them."""
    keys = []
    key = b"" if num_shared_blocks else (salt or "").encode()
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        if num_shared_blocks and start == num_shared_blocks * block_size and salt is not None:
            key = hashlib.sha256(key + b"|rekey|" + salt.encode()).digest()
        block = ",".join(map(str, token_ids[start : start + block_size])).encode()
        key = hashlib.sha256(key + b"|" + block).digest()
        keys.append(key)
    return tuple(keys)


def fake_error(problem: str) -> BackendError:
    return BackendError(problem, backend=NAME)
