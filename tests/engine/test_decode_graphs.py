"""Decode steps through ``DecodeGraphs``: the same tokens as the eager engine.

On a GPU the graphs are captured and replayed (``gpu`` tests). On this CPU the same
static buffers, padding rows, scratch block and per-graph attention plans run eagerly
(``decode_graphs="eager"``) under Triton's interpreter, in a child process as the
kernel tests do (``triton_interpreter``): everything a graph replays except the
capture itself.
"""

from __future__ import annotations

import pytest
import torch

from engine.decode_graphs import capture_sizes, context_classes
from tests import background
from tests.engine.triton_interpreter import (
    NO_TRITON,
    Where,
    interpreter_child,
    kernel_device,
)

WHERE = kernel_device()
DEVICE = "cuda" if WHERE is Where.GPU else "cpu"
runs_kernels = pytest.mark.skipif(
    WHERE in (Where.CHILD, Where.NOWHERE),
    reason=NO_TRITON if WHERE is Where.NOWHERE else "run under the interpreter below",
)
pytestmark = pytest.mark.kernels


def test_capture_sizes_cover_every_batch_up_to_the_most() -> None:
    assert capture_sizes(1) == (1,)
    assert capture_sizes(4) == (1, 2, 4)
    assert capture_sizes(20) == (1, 2, 4, 8, 16, 20)
    assert capture_sizes(64) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)


def test_context_classes_grow_fourfold_to_the_longest() -> None:
    assert context_classes(512) == (512,)
    assert context_classes(4096) == (1024, 4096)
    assert context_classes(131_072) == (1024, 4096, 16_384, 65_536, 131_072)


def background_child() -> background.Child | None:
    return interpreter_child(__file__, timeout_s=600)


@pytest.mark.background
@pytest.mark.skipif(WHERE is not Where.CHILD, reason="runs the cases below in a child")
def test_decode_graphs_under_the_interpreter() -> None:
    done, _ = background.finished(__name__, background_child)
    report = done.stdout[-6000:] + done.stderr[-2000:]
    assert done.returncode == 0, report
    assert "4 passed" in done.stdout and "failed" not in done.stdout, report


def _generate(
    mode: str, prompts: list[list[int]], **config: object
) -> tuple[list[tuple[int, ...]], torch.Tensor]:
    """Greedy tokens, and the K/V every block but the last holds afterwards (the graphs'
    scratch block is the last, which no request owns: padding rows write nothing else)."""
    from engine import Engine, EngineConfig, SamplingParams

    engine = Engine(
        EngineConfig(
            attention="triton",
            device=DEVICE,
            decode_graphs=mode,
            **config,  # type: ignore[arg-type]
        )
    )
    greedy = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    tokens = [c.token_ids for c in engine.generate(prompts, greedy)]
    if mode != "off":  # the scratch block is the pool's last, out of the manager's reach
        assert engine.runner.graphs is not None
        assert engine.runner.graphs.scratch_block == engine.kv_cache.num_blocks - 1
        assert engine.block_manager.pool.num_blocks == engine.kv_cache.num_blocks - 1
    return tokens, engine.kv_cache.kv[:, :, :-1].cpu()


# Three prompts that end mid-block and across blocks: a batch of 3 padded to the graph
# of 4 at every decode step.
PROMPTS = [list(range(100, 119)), list(range(7, 60, 2)), list(range(300, 340))]
SMALL = {"num_blocks": 24, "max_num_seqs": 4, "max_model_len": 160}


@runs_kernels
def test_the_graphs_static_path_decodes_what_the_eager_engine_does() -> None:
    tokens, kv = _generate("eager", PROMPTS, **SMALL)
    eager_tokens, eager_kv = _generate("off", PROMPTS, **SMALL)
    assert tokens == eager_tokens
    assert torch.equal(kv, eager_kv)  # padding rows wrote only the scratch block


@runs_kernels
def test_steps_with_a_prefill_run_eagerly_between_graph_decodes() -> None:
    # Six prompts, four sequences at most: the last two are prefilled in steps beside
    # others' decodes (eager), and every decode-only step goes through a graph.
    prompts = [*PROMPTS, list(range(500, 530)), list(range(40, 44)), list(range(900, 917))]
    tokens, kv = _generate("eager", prompts, **SMALL)
    eager_tokens, eager_kv = _generate("off", prompts, **SMALL)
    assert tokens == eager_tokens
    assert torch.equal(kv, eager_kv)


@pytest.mark.gpu
def test_captured_graphs_decode_the_same_greedy_tokens_as_eager_steps() -> None:
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 100_000, (n,), generator=g).tolist() for n in (17, 300, 1000)]
    # float32: a graph's split count is its context class's, an eager step's its batch's;
    # in bfloat16 the different sums could flip a near tie of random weights' logits.
    config = {"max_num_seqs": 8, "max_model_len": 4096, "num_blocks": 1024, "dtype": "float32"}
    assert _generate("auto", prompts, **config)[0] == _generate("off", prompts, **config)[0]
