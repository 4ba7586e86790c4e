"""A ceiling policy's compaction and the engine's prefix cache, on the bundled engine
(tiny-random) through the Governor: an agent loop that keeps the compacted history (as
``Governor.compact`` asks, and the LangChain middleware does) sends calls that extend
the prompt the engine computed last, until the next compaction rewrites it.
``SummarizeOldest`` compacting to the ceiling rewrites the summary at every call past
it, so the engine computes the whole history again each time; compacting under it
(``compact_to``) leaves the next calls room to append, and the engine serves their
history from its prefix cache."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from backends import LocalBackend
from governor import AgentSpec, Governor, Policies
from policies import ExtractiveSummarizer, SummarizeOldest

CEILING = 700
TURNS = 14
LOG = "".join(
    f"tests/test_mod{i}.py::test_case_{i} FAILED - KeyError 'k{i * 31}'\n" for i in range(8)
)


@pytest.fixture(scope="module")
def backend() -> Iterator[LocalBackend]:
    made = LocalBackend(config={"num_blocks": 256})
    yield made
    made.close()


def _loop(backend: LocalBackend, compact_to: float) -> tuple[int, int, int]:
    """One agent's loop of ``TURNS`` calls, each followed by a tool's output, the
    history kept as compacted: (compactions, prompt tokens sent, prompt tokens the
    engine computed)."""
    policy = SummarizeOldest(
        ExtractiveSummarizer(backend.counter), summary_tokens=120, compact_to=compact_to
    )
    governor = Governor(
        backend,
        agents=[AgentSpec(name="agent", ceiling_tokens=CEILING)],
        policies=Policies(ceiling=policy),
    )
    history: list[dict[str, str]] = [
        {"role": "system", "content": "You fix failing tests, one at a time."},
        {"role": "user", "content": "Make the suite pass."},
    ]
    sent = computed = 0
    with governor.lease("agent") as lease:
        for turn in range(TURNS):
            history, _ = governor.compact(lease, history, max_tokens=8)
            result = governor.complete(lease, history, max_tokens=8)
            sent += result.prompt_tokens
            computed += result.prompt_tokens - result.cached_tokens
            history.append({"role": "assistant", "content": f"Run the tests, pass {turn}."})
            history.append({"role": "user", "content": f"Tool result:\n{LOG}"})
        compactions = lease.num_compactions
    return compactions, sent, computed


def test_compacting_under_the_ceiling_lets_the_engine_serve_the_history_from_its_cache(
    backend: LocalBackend,
) -> None:
    brim = brim_compactions, brim_sent, brim_computed = _loop(backend, 1.0)
    under = under_compactions, _, under_computed = _loop(backend, 0.6)
    assert brim_compactions >= TURNS // 2, brim  # every call past the ceiling
    assert 0 < under_compactions < brim_compactions, (under, brim)
    # Much of what the brim's calls send is new to the engine; compacted under the
    # ceiling, most calls' history comes from the prefix cache.
    assert brim_computed > 0.6 * brim_sent, brim
    assert under_computed < 0.6 * brim_computed, (under, brim)
