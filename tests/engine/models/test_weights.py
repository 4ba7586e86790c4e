"""load_model: what it accepts, and the one error that names every bad tensor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.attention import ReferenceAttention
from engine.errors import ModelConfigError, ModelError, ModelLoadError
from engine.weights import hf_tensor_views, load_model

CKPT = "model.safetensors"


def load(folder: Path, **kwargs: object):
    return load_model(folder, attention=ReferenceAttention(), device="cpu", **kwargs)


def rewrite(folder: Path, edit) -> None:
    tensors = load_file(str(folder / CKPT))
    edit(tensors)
    save_file(tensors, str(folder / CKPT))


def test_loads_every_tensor_into_place(engine_checkpoint) -> None:
    folder = engine_checkpoint()
    model = load(folder)
    assert model.dtype == torch.float32 and model.device == torch.device("cpu")
    saved = load_file(str(folder / CKPT))
    views = hf_tensor_views(model)
    assert views.keys() == saved.keys()
    for name, view in views.items():
        assert torch.equal(view, saved[name]), name
    assert not any(p.requires_grad for p in model.parameters())
    assert not model.training


def test_casts_to_the_requested_dtype(engine_checkpoint) -> None:
    folder = engine_checkpoint()
    model = load(folder, dtype=torch.bfloat16)
    saved = load_file(str(folder / CKPT))
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    weight = hf_tensor_views(model)["model.layers.1.self_attn.k_proj.weight"]
    assert torch.equal(weight, saved["model.layers.1.self_attn.k_proj.weight"].bfloat16())


def test_ignores_harmless_extras(engine_checkpoint) -> None:
    folder = engine_checkpoint(tie_word_embeddings=True)

    def add_extras(tensors: dict[str, torch.Tensor]) -> None:
        tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()

    rewrite(folder, add_extras)
    model = load(folder)
    assert model.lm_head is None


def test_missing_unexpected_and_mismatched_are_named_together(engine_checkpoint) -> None:
    folder = engine_checkpoint()

    def damage(tensors: dict[str, torch.Tensor]) -> None:
        del tensors["model.layers.1.mlp.up_proj.weight"]
        del tensors["lm_head.weight"]
        tensors["model.layers.0.self_attn.extra.weight"] = torch.zeros(2)
        tensors["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(17, 32)

    rewrite(folder, damage)
    with pytest.raises(ModelLoadError) as info:
        load(folder)
    error = info.value
    assert error.missing == ("model.layers.1.mlp.up_proj.weight", "lm_head.weight")
    assert error.unexpected == ("model.layers.0.self_attn.extra.weight",)
    assert error.mismatched == (("model.layers.0.self_attn.k_proj.weight", (16, 32), (17, 32)),)
    message = str(error)
    assert str(folder) in message
    for part in (
        "2 missing tensor(s): model.layers.1.mlp.up_proj.weight, lm_head.weight",
        "1 unexpected tensor(s): model.layers.0.self_attn.extra.weight",
        "model.layers.0.self_attn.k_proj.weight (expected [16, 32], found [17, 32])",
        "does not match its config.json",
    ):
        assert part in message


def test_config_that_disagrees_with_the_weights(engine_checkpoint) -> None:
    folder = engine_checkpoint()
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 48}))
    with pytest.raises(ModelLoadError, match=r"6 tensor\(s\) with the wrong shape") as info:
        load(folder)
    assert info.value.mismatched[:3] == (
        ("model.layers.0.mlp.gate_proj.weight", (48, 32), (64, 32)),
        ("model.layers.0.mlp.up_proj.weight", (48, 32), (64, 32)),
        ("model.layers.0.mlp.down_proj.weight", (32, 48), (32, 64)),
    )
    assert len(info.value.mismatched) == 6 and not info.value.missing


def test_non_float_tensors_are_refused(engine_checkpoint) -> None:
    folder = engine_checkpoint()

    def quantize(tensors: dict[str, torch.Tensor]) -> None:
        tensors["model.norm.weight"] = tensors["model.norm.weight"].to(torch.int8)

    rewrite(folder, quantize)
    with pytest.raises(ModelLoadError, match=r"model.norm.weight \(I8\)"):
        load(folder)


def test_folder_without_safetensors(engine_checkpoint) -> None:
    folder = engine_checkpoint()
    (folder / CKPT).rename(folder / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match=r"no \*.safetensors file .*only PyTorch .bin"):
        load(folder)


def test_folder_without_config(engine_checkpoint) -> None:
    folder = engine_checkpoint()
    (folder / "config.json").unlink()
    with pytest.raises(ModelConfigError, match=r"no config\.json in this folder") as info:
        load(folder)
    assert isinstance(info.value, ModelError)


def test_malformed_config(engine_checkpoint) -> None:
    folder = engine_checkpoint()
    (folder / "config.json").write_text("{'model_type': 'llama'}")
    with pytest.raises(ModelConfigError, match=r"config\.json is not valid JSON"):
        load(folder)


def test_unsupported_model_type(engine_checkpoint) -> None:
    folder = engine_checkpoint()
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "gemma3"}))
    with pytest.raises(ModelConfigError, match="model_type 'gemma3' is not supported"):
        load(folder)


def test_corrupt_safetensors_file(engine_checkpoint) -> None:
    folder = engine_checkpoint()
    (folder / CKPT).write_bytes(b"not a safetensors file")
    with pytest.raises(ModelLoadError, match=r"model\.safetensors is not a readable safetensors"):
        load(folder)


def test_truncated_safetensors_file(engine_checkpoint) -> None:
    folder = engine_checkpoint()
    data = (folder / CKPT).read_bytes()
    (folder / CKPT).write_bytes(data[:-100])
    with pytest.raises(ModelLoadError, match=r"model\.safetensors is damaged"):
        load(folder)


def split_into_shards(folder: Path) -> dict[str, str]:
    """Rewrite the single file as two shards plus an index, as save_pretrained does."""
    tensors = load_file(str(folder / CKPT))
    (folder / CKPT).unlink()
    names = sorted(tensors)
    weight_map = {}
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2 :])):
        shard = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({name: tensors[name] for name in part}, str(folder / shard))
        weight_map.update(dict.fromkeys(part, shard))
    index = {"metadata": {}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return weight_map


def test_sharded_checkpoint_and_its_errors(engine_checkpoint) -> None:
    folder = engine_checkpoint()
    reference = load(folder)
    split_into_shards(folder)
    sharded = load(folder)
    assert all(
        torch.equal(a, b) for a, b in zip(reference.parameters(), sharded.parameters(), strict=True)
    )
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="not in the folder: model-00002-of-00002"):
        load(folder)
    (folder / "model.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(ModelLoadError, match="not a valid safetensors index"):
        load(folder)
