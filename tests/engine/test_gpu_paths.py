"""GPU code paths: selection logic checked on the CPU, the paths themselves on a GPU.

Tests marked ``gpu`` run only where torch sees a CUDA or ROCm device (tests/conftest.py).
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from engine.attention import AttentionMetadata, ReferenceAttention
from engine.attention.gather import GatherAttention
from engine.sampling import Sampler, SamplingParams, _apply_top_k

CUDA0 = torch.device("cuda", 0)


def _chunked_batch() -> tuple[AttentionMetadata, dict[str, torch.Tensor]]:
    # A prefill chunk after 9 cached tokens, a decode, and a whole prefill.
    metadata = AttentionMetadata.build(
        block_size=4,
        query_lens=[5, 1, 6],
        seq_lens=[14, 10, 6],
        block_tables=[[3, 0, 7, 1], [2, 5, 9], [4, 6]],
        device=torch.device("cpu"),
    )
    gen = torch.Generator().manual_seed(0)
    shapes = {"q": (12, 4, 16), "k": (12, 2, 16), "v": (12, 2, 16)}
    inputs = {name: torch.randn(shape, generator=gen) for name, shape in shapes.items()}
    inputs["key_cache"] = torch.randn(10, 4, 2, 16, generator=gen)
    inputs["value_cache"] = torch.randn(10, 4, 2, 16, generator=gen)
    return metadata, inputs


def _run(backend: object, metadata: AttentionMetadata, inputs: dict[str, torch.Tensor]):
    keys, values = inputs["key_cache"].clone(), inputs["value_cache"].clone()
    backend.prepare(metadata)  # type: ignore[attr-defined]
    return backend.forward(  # type: ignore[attr-defined]
        inputs["q"], inputs["k"], inputs["v"], keys, values, metadata, scale=0.25
    )


def test_top_k_takes_the_largest_k_without_a_device_sync() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [4.0, 1.0, 3.0, 2.0]])
    with mock.patch.object(torch.Tensor, "max", side_effect=AssertionError("synced")):
        out = _apply_top_k(logits, [2, 3])
    inf = float("-inf")
    assert torch.equal(out, torch.tensor([[inf, 3.0, inf, 2.0], [4.0, inf, 3.0, 2.0]]))


# -- on a GPU -----------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gather_chunked_prefill_on_the_gpu_equals_the_reference(dtype: torch.dtype) -> None:
    metadata, inputs = _chunked_batch()
    want = _run(ReferenceAttention(), metadata, inputs)
    device = torch.device("cuda", torch.cuda.current_device())
    gpu_metadata = AttentionMetadata.build(
        block_size=metadata.block_size,
        query_lens=metadata.query_lens_cpu,
        seq_lens=metadata.seq_lens_cpu,
        block_tables=metadata.block_tables_cpu,
        device=device,
    )
    gpu_inputs = {name: t.to(device, dtype) for name, t in inputs.items()}
    out = _run(GatherAttention(), gpu_metadata, gpu_inputs)
    tol = {"atol": 2e-3, "rtol": 2e-3} if dtype == torch.float32 else {"atol": 3e-2, "rtol": 3e-2}
    torch.testing.assert_close(out.float().cpu(), want, **tol)


@pytest.mark.gpu
def test_sampler_on_the_gpu_with_device_generators() -> None:
    from engine.sampling import request_generator

    device = torch.device("cuda", torch.cuda.current_device())
    logits = torch.randn(4, 1000, device=device)
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.8, top_k=50, seed=1),
        SamplingParams(temperature=0.8, top_p=0.9, seed=2),
        SamplingParams(temperature=1.0, top_k=5, top_p=0.5),
    ]

    def draw() -> torch.Tensor:
        generators = [request_generator(p, device=device) for p in params]
        return Sampler(seed=0).sample(logits, params, generators)

    first = draw()
    assert first.device == device and first.dtype == torch.int64
    assert torch.equal(first, draw())
    assert int(first[0]) == int(logits[0].argmax())


@pytest.mark.gpu
def test_engine_on_the_gpu_generates_sizes_from_free_memory_and_swaps() -> None:
    from engine import Engine

    engine = Engine.from_pretrained("tiny-random", device="cuda", kv_cache_fraction=0.01)
    assert engine.kv_cache.kv.device.type == "cuda"
    assert engine.kv_cache.dtype == engine.dtype
    sampling = SamplingParams(max_tokens=6, temperature=0.7, top_p=0.9, seed=3, ignore_eos=True)
    prompt = list(range(1, 40))
    first = engine.generate([prompt, prompt[:7]], sampling)
    again = engine.generate([prompt, prompt[:7]], sampling)
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    assert all(len(c.token_ids) == 6 for c in first)
    # Offload to pinned host memory and back: the greedy continuation is unchanged.
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    want = engine.generate(prompt, greedy)[0].token_ids
    request = engine.add_request(prompt, greedy)
    engine.step()
    engine.offload(request)
    engine.restore(request)
    while engine.has_unfinished():
        engine.step()
    assert engine.pop_completion(request).token_ids == want
