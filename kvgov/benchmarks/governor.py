"""``kvgov bench governor``: the cost of a lease, and what overcommit buys.

- ``lease_overhead_us``: one lease acquired and released, no contention, over a
  FakeBackend so only the governor's own work is timed (target <= 50 us).
- ``overcommit_admitted_ratio``: the most leases active at once in overcommit mode over
  guaranteed mode, on the design's workload shape scaled to the tiny model (ceilings of
  1,600 tokens with about 300 in use, i.e. 16k ceilings at a 3k average), run on the
  bundled engine (tiny-random). Every call must finish: zero lost, zero out-of-memory.
- ``count_us_per_1k_chars``: exact token counting of ASCII tool output (seeded build and
  service logs, every text different) by ``TokenCounter``, against tiktoken's own
  ``encode_ordinary`` on the same texts in the same run (reported: what the ASCII
  counter of ``governor._ascii_count`` saves the governor on every tool result).
- ``recount_us_per_1k_chars``: a conversation counted again, as the middleware and the
  ceiling policies count it at every turn: the same logs as tool results, their text
  given back as new strings each time (as a checkpointer gives them back). The counter
  notes a text the first time, keeps its count the second, and looks it up from the
  third: the figure is the third count; the note gives the first beside it.
- ``queued_lease_us``: a lease that queues behind a full backend, from request to
  release, with 2,000 waiting behind 200 active (asyncio, FakeBackend). The note gives
  the same run with the default policy made to order the whole queue on every pass (as
  a policy without a ``key`` is), side by side.
- ``capped_lease_us``: the same, but with memory for all and ``max_per_agent=200``
  holding them back (a verdict compares the agent's active leases, kept as they come
  and go, with the cap; a pass stops once the cap holds back every waiting lease); the
  note gives ``max_per_tenant=200``.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import math
import random
import statistics
import time
from collections.abc import Collection, Iterator, Mapping, Sequence

import tiktoken

from backends.local.backend import LocalBackend
from governor.admission_policy import PriorityWithAging
from governor.agent import AgentSpec
from governor.config import AdmissionMode, GovernorConfig
from governor.governor import Governor
from governor.lease import Lease
from governor.testing import FakeBackend
from governor.tokens import DEFAULT_ENCODING, TokenCounter

__all__ = ["run"]

_BENCH = "governor"


def run(*, quick: bool = False) -> Iterator[Mapping[str, object]]:
    yield _lease_overhead(num=2_000 if quick else 20_000, repeats=3 if quick else 5)
    yield _overcommit_ratio(num_agents=24 if quick else 60)
    yield _count_speed(num_texts=40 if quick else 400)
    yield _recount_speed(num_texts=40 if quick else 400)
    yield _queued_lease(num_waiting=300 if quick else 2_000, num_active=30 if quick else 200)
    yield _capped_lease(num_waiting=300 if quick else 2_000, cap=30 if quick else 200)


def _lease_overhead(*, num: int, repeats: int) -> Mapping[str, object]:
    agent = AgentSpec(name="worker", ceiling_tokens=1_600)
    governor = Governor(FakeBackend(num_blocks=10_000), agents=[agent])
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(num):
            with governor.lease("worker"):
                pass
        samples.append((time.perf_counter() - start) / num * 1e6)
    return {
        "bench": _BENCH,
        "metric": "lease_overhead_us",
        "value": statistics.median(samples),
        "unit": "us",
        "target": 50,
        "direction": "lower",
        "note": "acquire + release, no contention, FakeBackend (governor work only)",
    }


def _overcommit_ratio(*, num_agents: int) -> Mapping[str, object]:
    agent = AgentSpec(name="worker", ceiling_tokens=1_600)  # 100 blocks of 16 tokens
    prompt = [{"role": "user", "content": "check the build log and report " * 40}]
    peaks: dict[AdmissionMode, int] = {}
    finished: dict[AdmissionMode, list[str]] = {}
    for mode in (AdmissionMode.GUARANTEED, AdmissionMode.OVERCOMMIT):
        backend = LocalBackend(config={"num_blocks": 900})  # 810 usable at safety 0.9
        governor = Governor(backend, config=GovernorConfig(mode=mode), agents=[agent])
        try:

            async def one(governor: Governor = governor) -> str:
                async with governor.lease("worker") as lease:
                    result = await governor.acomplete(lease, prompt, max_tokens=20)
                    await asyncio.sleep(0.02)  # a tool call: the context stays resident
                    return result.finish_reason

            async def main() -> list[str]:
                return await asyncio.gather(*(one() for _ in range(num_agents)))

            finished[mode] = asyncio.run(main())
            peaks[mode] = governor.admission.counts()[2]
        finally:
            backend.close()
    lost = sum(1 for reasons in finished.values() for r in reasons if r not in ("length", "stop"))
    ratio = peaks[AdmissionMode.OVERCOMMIT] / peaks[AdmissionMode.GUARANTEED]
    return {
        "bench": _BENCH,
        "metric": "overcommit_admitted_ratio",
        "value": ratio,
        "unit": "x",
        "target": 2.5,
        "direction": "higher",
        "note": (
            f"peak active: {peaks[AdmissionMode.OVERCOMMIT]} overcommit vs "
            f"{peaks[AdmissionMode.GUARANTEED]} guaranteed; {num_agents} agents per mode, "
            f"{lost} lost or cut short"
        ),
    }


def _count_speed(*, num_texts: int) -> Mapping[str, object]:
    texts = _logs(num_texts)
    characters = sum(map(len, texts))
    encoding = tiktoken.get_encoding(DEFAULT_ENCODING)
    counter = TokenCounter()  # a new one: its memo of pieces starts empty
    started = time.perf_counter()
    ours = [counter.count(text) for text in texts]
    ours_s = time.perf_counter() - started
    started = time.perf_counter()
    theirs = [len(encoding.encode_ordinary(text)) for text in texts]
    theirs_s = time.perf_counter() - started
    assert ours == theirs, "the counter must agree with tiktoken"
    per_1k = 1e6 * 1_000 / characters
    return {
        "bench": _BENCH,
        "metric": "count_us_per_1k_chars",
        "value": ours_s * per_1k,
        "unit": "us",
        "target": None,
        "direction": "lower",
        "note": (
            f"tiktoken's encode_ordinary: {theirs_s * per_1k:.0f} us per 1,000 characters "
            f"({theirs_s / ours_s:.1f}x as long); {num_texts} distinct ASCII logs, "
            f"{characters:,} characters, {sum(ours):,} tokens, counts equal"
        ),
    }


def _recount_speed(*, num_texts: int) -> Mapping[str, object]:
    texts = _logs(num_texts)
    characters = sum(map(len, texts))
    counter = TokenCounter()

    def conversation() -> list[dict[str, str]]:  # new strings each time, equal text
        return [{"role": "tool", "content": "".join(list(text))} for text in texts]

    first_prompt = conversation()
    started = time.perf_counter()
    first = counter.count_messages(first_prompt)
    first_s = time.perf_counter() - started
    assert counter.count_messages(conversation()) == first  # the second turn keeps them
    again_prompt = conversation()
    started = time.perf_counter()
    again = counter.count_messages(again_prompt)
    again_s = time.perf_counter() - started
    assert first == again, "a recount must give the same tokens"
    per_1k = 1e6 * 1_000 / characters
    return {
        "bench": _BENCH,
        "metric": "recount_us_per_1k_chars",
        "value": again_s * per_1k,
        "unit": "us",
        "target": None,
        "direction": "lower",
        "note": (
            f"the first count: {first_s * per_1k:.0f} us per 1,000 characters "
            f"({first_s / again_s:.0f}x as long); {num_texts} tool results, "
            f"{characters:,} characters, {first:,} tokens"
        ),
    }


class _OrderEveryPass:
    """``policy`` without its ``key``: the controller sorts the whole queue each pass."""

    def __init__(self, policy: PriorityWithAging) -> None:
        self._policy = policy

    def order(
        self, waiting: Sequence[Lease], *, active: Collection[Lease], now: float
    ) -> list[Lease]:
        return self._policy.order(waiting, active=active, now=now)


def _queued_lease(*, num_waiting: int, num_active: int) -> Mapping[str, object]:
    per_lease_us = {}
    for name, policy in (
        ("key", PriorityWithAging()),
        ("ordered", _OrderEveryPass(PriorityWithAging())),
    ):
        agent = AgentSpec(name="worker", ceiling_tokens=1_600)  # 100 blocks each
        # Room for num_active of them, under the default safety factor of 0.9.
        backend = FakeBackend(num_blocks=math.ceil(num_active * 100 / 0.9) + 1)
        governor = Governor(backend, agents=[agent])
        governor.admission.policy = policy
        assert governor.admission.max_concurrent(1_600) == num_active
        per_lease_us[name] = _per_lease_us(governor, num_waiting + num_active)
    return {
        "bench": _BENCH,
        "metric": "queued_lease_us",
        "value": per_lease_us["key"],
        "unit": "us",
        "target": None,
        "direction": "lower",
        "note": (
            f"{num_waiting:,} waiting behind {num_active} active; ordering the whole queue "
            f"on every pass: {per_lease_us['ordered']:.0f} us "
            f"({per_lease_us['ordered'] / per_lease_us['key']:.1f}x as long)"
        ),
    }


def _capped_lease(*, num_waiting: int, cap: int) -> Mapping[str, object]:
    per_lease_us = {}
    agent = AgentSpec(name="worker", ceiling_tokens=1_600)
    for name, config in (
        ("agent", GovernorConfig(max_per_agent=cap)),
        ("tenant", GovernorConfig(max_per_tenant=cap)),
    ):
        # Memory for every lease at once: only the cap holds them back.
        backend = FakeBackend(num_blocks=200 * (num_waiting + cap))
        governor = Governor(backend, config=config, agents=[agent])
        per_lease_us[name] = _per_lease_us(governor, num_waiting + cap, tenant="acme")
    return {
        "bench": _BENCH,
        "metric": "capped_lease_us",
        "value": per_lease_us["agent"],
        "unit": "us",
        "target": None,
        "direction": "lower",
        "note": (
            f"{num_waiting:,} waiting behind max_per_agent={cap}; behind max_per_tenant={cap}: "
            f"{per_lease_us['tenant']:.0f} us"
        ),
    }


def _per_lease_us(governor: Governor, num: int, *, tenant: str | None = None) -> float:
    """``num`` leases of ``worker`` at once on one event loop, each held over one
    suspension: the microseconds per lease, request to release. Every lease must be
    returned."""

    async def main() -> float:
        async def one() -> None:
            async with governor.lease("worker", tenant=tenant):
                await asyncio.sleep(0)

        started = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(num)))
        return time.perf_counter() - started

    # The process's other objects (torch, the engine of the metrics before) out of the
    # collector's way: a full collection over them would cost more than the queue does,
    # and land on either variant by chance.
    gc.collect()
    gc.freeze()
    try:
        elapsed = asyncio.run(main())
    finally:
        gc.unfreeze()
    assert governor.admission.counts()[:2] == (0, 0)
    return elapsed / num * 1e6


def _logs(num: int) -> list[str]:
    """Build and service logs of 40-80 lines each, seeded: steps, paths, durations,
    hashes and the odd error, so no two texts are alike."""
    rng = random.Random(7)
    words = ["compiled", "linked", "tested", "cached", "fetched", "skipped", "wrote"]
    levels = ["INFO", "INFO", "INFO", "DEBUG", "WARN", "ERROR"]
    texts = []
    for number in range(num):
        lines = []
        for step in range(rng.randint(40, 80)):
            digest = hashlib.sha1(f"{number}/{step}".encode()).hexdigest()[:10]
            lines.append(
                f"2026-12-01T04:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z "
                f"{rng.choice(levels)} [job {number}] step {step}: {rng.choice(words)} "
                f"src/module_{rng.randint(0, 300)}/file_{step}.py in {rng.randint(1, 9_999)} ms "
                f"(sha {digest}, {rng.randint(0, 64)} warnings)"
            )
        texts.append("\n".join(lines))
    return texts
