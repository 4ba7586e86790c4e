"""A step's inputs reach the device in one buffer, and nothing reads the device early.

On the CPU the structure is checked: the token ids, positions, attention metadata and
the rows to sample are views of one buffer (on a GPU: one pinned buffer, one
non-blocking copy). On a GPU, ``torch.cuda.set_sync_debug_mode("error")`` turns any
synchronizing call in the step, up to the sampled tokens, into an error.
"""

from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.attention.metadata import stage_int64


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def test_stage_int64_gives_views_of_one_buffer() -> None:
    ids, empty, tables = stage_int64([[5, 6, 7], [], [1, 2, 3, 4]], torch.device("cpu"))
    assert ids.tolist() == [5, 6, 7] and empty.numel() == 0 and tables.tolist() == [1, 2, 3, 4]
    assert _storage(ids) == _storage(tables) and ids.dtype == tables.dtype == torch.int64


def test_a_step_stages_its_inputs_and_metadata_in_one_buffer() -> None:
    engine = Engine(EngineConfig(num_blocks=64))
    seen = []

    def capture(_module, args):
        input_ids, positions, _cache, metadata = args
        seen.append((input_ids, positions, metadata))

    hook = engine.model.register_forward_pre_hook(capture)
    try:
        engine.add_request(list(range(1, 40)), SamplingParams(max_tokens=2, temperature=0))
        engine.add_request(list(range(50, 57)), SamplingParams(max_tokens=2, top_p=0.9, seed=1))
        while engine.has_unfinished():
            engine.step()
    finally:
        hook.remove()
    assert len(seen) == 2  # the prefill step, then the decode step
    for input_ids, positions, m in seen:
        tensors = [input_ids, positions, m.query_start_loc, m.seq_lens, m.block_tables]
        assert len({_storage(t) for t in [*tensors, m.slot_mapping]}) == 1


@pytest.mark.gpu
def test_a_step_reads_nothing_from_the_gpu_before_the_sampled_tokens() -> None:
    engine = Engine(EngineConfig(device="cuda", num_blocks=256))
    params = [
        SamplingParams(max_tokens=4, temperature=0),
        SamplingParams(max_tokens=4, top_k=5),
        SamplingParams(max_tokens=4, top_p=0.8, seed=3),
        SamplingParams(max_tokens=4, temperature=0.7, top_p=0.5, top_k=50),
    ]
    for i, p in enumerate(params):
        engine.add_request(list(range(10 + i, 60 + 7 * i)), p)
    engine.step()  # the prefills, and anything lazy on its first call
    runner = engine.runner
    run, sample = runner.run, runner.sample
    steps: list[torch.Tensor] = []

    def run_checked(*args, **kwargs):
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")  # from the step's inputs ...
        return run(*args, **kwargs)

    def sample_checked(*args, **kwargs):
        try:
            tokens = sample(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode(0)  # ... to the sampled tokens, still unread
        steps.append(tokens)
        return tokens

    runner.run, runner.sample = run_checked, sample_checked  # type: ignore[method-assign]
    try:
        for _ in range(2):
            engine.step()  # decodes of every kind of row
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert [tuple(t.shape) for t in steps] == [(4,), (4,)]


@pytest.mark.gpu
def test_top_p_on_a_gpu_cuts_where_the_cpu_does() -> None:
    from engine.sampling import _apply_top_p

    generator = torch.Generator().manual_seed(0)
    # Row 0 peaked (its candidates hold p), row 1 flat (they do not: the full sort decides).
    logits = torch.stack([torch.randn(5000, generator=generator) * 8, torch.zeros(5000)])
    top_p = [0.9, 0.99]
    on_cpu = _apply_top_p(logits, top_p)
    on_gpu = _apply_top_p(logits.cuda(), top_p).cpu()
    assert torch.equal(on_gpu.isinf(), on_cpu.isinf())
