"""The pieces of ``tests/gpu_run.sh`` (the whole script runs in ``tests/test_gpu_run.py``):
transformers on the engine's own weights, the model run's figures, and the figures file
a step killed by its timeout leaves behind."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch

from engine import Engine
from engine.benchmarks import device_run, model_run
from engine.benchmarks.same_weights import transformers_model
from engine.errors import InvalidRequestError
from engine.hf_export import export_preset


def test_transformers_model_reads_the_engine_s_own_tensors() -> None:
    transformers = pytest.importorskip("transformers")
    engine = Engine.from_pretrained("tiny-random", device="cpu")
    hf = transformers_model(engine)
    embed = hf.get_input_embeddings().weight
    ours = engine.model.state_dict()
    assert any(t.data_ptr() == embed.data_ptr() for t in ours.values())  # shared, not copied
    assert hf.lm_head.weight.data_ptr() == embed.data_ptr()  # tied as the preset is
    ids = torch.tensor([[1, 2, 3, 4, 5, 600, 7000]])
    with tempfile.TemporaryDirectory() as folder:  # the folder route gives the same model
        export_preset(folder, name="tiny-random", model=engine.model)
        written = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=engine.dtype)
    with torch.inference_mode():
        assert torch.equal(hf(ids).logits, written.eval()(ids).logits)


def test_transformers_model_refuses_quantized_weights() -> None:
    pytest.importorskip("transformers")
    engine = Engine.from_pretrained("tiny-random", device="cpu", quantize="int4")
    with pytest.raises(InvalidRequestError, match="quantize=None"):
        transformers_model(engine)


# The model run's figures, in order, each named with its weights' format (also what
# tests/test_gpu_run.py expects of the script); a GPU adds decode_graph_speedup.
MODEL_FIGURES = (
    "load_s",
    "weights_gib",
    "kv_gib",
    "prefill_tok_s_batch8",
    "decode_tok_s_batch8",
    "decode_ms_per_step",
    "decode_weights_gbps",
    "decode_roofline_fraction",
)


def test_model_run_measures_a_batch_of_eight() -> None:
    figures = {m.metric: m for m in model_run.run(model="tiny-random", device="cpu", new_tokens=4)}
    tag = "float32"
    assert list(figures) == [f"{name}[{tag}]" for name in MODEL_FIGURES]
    step_s = figures[f"decode_ms_per_step[{tag}]"].value / 1e3
    # Throughput is tokens over all decode steps' time; a busy host makes some steps slow,
    # so it is not held to the median step (a side-by-side run read 2x apart).
    assert figures[f"decode_tok_s_batch8[{tag}]"].value > 0
    gib = figures[f"weights_gib[{tag}]"].value
    assert figures[f"decode_weights_gbps[{tag}]"].value == pytest.approx(
        gib * (1 << 30) / step_s / 1e9, rel=1e-6
    )
    assert figures[f"weights_gib[{tag}]"].target is None  # the 5.5 GiB target is int4 8B's


def test_a_step_killed_mid_run_leaves_its_figures_and_the_summary_says_so(
    tmp_path: Path,
) -> None:
    figure = {
        "bench": "model",
        "metric": "load_s[bf16]",
        "value": 12.5,
        "unit": "s",
        "target": None,
        "direction": "lower",
        "met": None,
        "note": "written before the step ran out of time",
    }
    device_run._update(tmp_path, lambda doc: doc["figures"].append(figure))
    assert device_run.main(["step", "model", "timed out", "45.0", "--out", str(tmp_path)]) == 0
    assert device_run.main(["summary", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / device_run.FIGURES).read_text())
    assert doc["figures"] == [figure]
    assert doc["steps"] == [{"name": "model", "status": "timed out", "seconds": 45.0}]
    summary = (tmp_path / "summary.md").read_text()
    assert "| model | timed out | 45.0 |" in summary
    assert "| model.load_s[bf16] | 12.5 s |" in summary
    assert not list(tmp_path.glob(".figures.json.*"))  # written atomically, nothing left over
