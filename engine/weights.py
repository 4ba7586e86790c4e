"""Loading a local Hugging Face model folder: config.json plus *.safetensors.

The whole checkpoint is checked against the model before a byte of weights is read:
tensor names and shapes come from the safetensors headers, the expected ones from a
model built on the meta device, and every missing, unexpected, mis-shaped or
non-float tensor is reported in one :class:`~engine.errors.ModelLoadError`. Then the
tensors are read one at a time straight onto the device and copied into their slots,
converting the dtype there, so no more than one tensor is ever held twice.

With ``quantization`` the decoder's projections are quantized as they load: their
checkpoint tensors are read in slices of ``_QUANTIZE_ROWS_BYTES`` worth of rows
(``safe_open(...).get_slice``), each slice quantized into its rows of codes and scales
and dropped, so loading holds the quantized model plus one slice, never the
full-precision model, nor even one whole full-precision projection.

``hf_tensor_views`` is the one place that knows how Hugging Face names map onto the
engine's fused parameters.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Protocol

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from engine.attention.backend import AttentionBackend
from engine.device import default_dtype, resolve_device
from engine.errors import ModelLoadError
from engine.model_config import ModelConfig
from engine.models.llama import LlamaDecoderLayer, LlamaForCausalLM
from engine.quantization.linear import QuantizedLinear, QuantizedRows
from engine.quantization.scheme import WeightQuantization

__all__ = ["WeightTarget", "hf_tensor_views", "load_model", "save_model", "weights_nbytes"]

# A parameter view to copy into, or the rows of a quantized layer to quantize into.
WeightTarget = torch.Tensor | QuantizedRows

INDEX_FILE = "model.safetensors.index.json"
_FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})
# Full-precision bytes read per slice of a quantized projection: the transient (the
# slice, its float32 copy and the rounding temporaries, about 4x this) stays well under
# one checkpoint tensor of an 8B model (a 14336 x 4096 bf16 projection is 117 MB).
_QUANTIZE_ROWS_BYTES = 4 << 20


def load_model(
    path: str | Path,
    *,
    attention: AttentionBackend,
    device: str | torch.device = "auto",
    dtype: torch.dtype | None = None,
    quantization: WeightQuantization | None = None,
) -> LlamaForCausalLM:
    """Build the model that ``path/config.json`` describes and fill it from the folder.

    ``dtype`` defaults to :func:`engine.device.default_dtype` of the device (float32 on
    CPU), whatever dtype the checkpoint was saved in. ``quantization`` stores the
    decoder's projections as int8 or int4 codes, quantized as they are read.
    """
    folder = Path(path)
    config = ModelConfig.from_pretrained(folder)
    resolved = resolve_device(device)
    dtype = default_dtype(resolved) if dtype is None else dtype
    headers = _read_headers(folder, _checkpoint_files(folder))
    skeleton = LlamaForCausalLM(
        config, attention=attention, device="meta", dtype=dtype, quantization=quantization
    )
    _check_tensors(folder, config, hf_tensor_views(skeleton), headers)

    model = LlamaForCausalLM(
        config, attention=attention, device=resolved, dtype=dtype, quantization=quantization
    )
    views = hf_tensor_views(model)
    by_file: dict[Path, list[str]] = {}
    for name in views:
        by_file.setdefault(headers[name][0], []).append(name)
    with torch.no_grad():
        for file, names in by_file.items():
            try:
                # Read straight onto the device; copy_ then converts the dtype there.
                with safe_open(str(file), framework="pt", device=str(resolved)) as f:
                    for name in names:
                        target = views[name]
                        if isinstance(target, QuantizedRows):
                            _quantize_in_slices(f.get_slice(name), target)
                        else:
                            target.copy_(f.get_tensor(name))
            except (SafetensorError, OSError) as exc:
                raise ModelLoadError(
                    str(folder),
                    problem=f"{file.name} is damaged ({exc}); restore it from the original model",
                ) from exc
    return model


class _RowSlices(Protocol):
    """What ``safe_open(...).get_slice(name)`` returns (safetensors leaves it untyped)."""

    def __getitem__(self, rows: slice, /) -> torch.Tensor: ...


def _quantize_in_slices(source: _RowSlices, target: QuantizedRows) -> None:
    """Read ``source`` (a safetensors slice) a few rows at a time into ``target``."""
    num_rows, num_cols = target.shape
    step = max(1, _QUANTIZE_ROWS_BYTES // (4 * num_cols))
    for begin in range(0, num_rows, step):
        target.copy_rows(begin, source[begin : min(begin + step, num_rows)])


def _target(linear: torch.nn.Module, kind: str) -> WeightTarget | None:
    if isinstance(linear, QuantizedLinear) and kind == "weight":
        return linear.rows()
    return getattr(linear, kind)


def hf_tensor_views(model: LlamaForCausalLM) -> dict[str, WeightTarget]:
    """Each Hugging Face tensor name -> the view of the model parameter it fills.

    Fused projections are split into row views: ``qkv_proj`` rows are q, then k, then
    v; ``gate_up_proj`` rows are gate, then up. ``lm_head.weight`` is absent when the
    embeddings are tied. A quantized projection's weight is a ``QuantizedRows`` (its
    ``copy_`` quantizes); its bias stays a plain view.
    """
    views: dict[str, WeightTarget] = {"model.embed_tokens.weight": model.embed_tokens.weight}
    for i, layer in enumerate(model.layers):
        assert isinstance(layer, LlamaDecoderLayer)  # nn.ModuleList yields plain Modules
        prefix = f"model.layers.{i}."
        attn, mlp = layer.self_attn, layer.mlp
        for kind in ("weight", "bias"):
            qkv = _target(attn.qkv_proj, kind)
            if qkv is not None:
                q, k, v = qkv.split(list(attn.qkv_sizes), dim=0)
                views[f"{prefix}self_attn.q_proj.{kind}"] = q
                views[f"{prefix}self_attn.k_proj.{kind}"] = k
                views[f"{prefix}self_attn.v_proj.{kind}"] = v
            if (o_proj := _target(attn.o_proj, kind)) is not None:
                views[f"{prefix}self_attn.o_proj.{kind}"] = o_proj
            gate_up = _target(mlp.gate_up_proj, kind)
            if gate_up is not None:
                size = mlp.intermediate_size
                gate, up = gate_up.split([size, size], dim=0)
                views[f"{prefix}mlp.gate_proj.{kind}"] = gate
                views[f"{prefix}mlp.up_proj.{kind}"] = up
            if (down := _target(mlp.down_proj, kind)) is not None:
                views[f"{prefix}mlp.down_proj.{kind}"] = down
        if attn.q_norm is not None and attn.k_norm is not None:
            views[f"{prefix}self_attn.q_norm.weight"] = attn.q_norm.weight
            views[f"{prefix}self_attn.k_norm.weight"] = attn.k_norm.weight
        views[f"{prefix}input_layernorm.weight"] = layer.input_layernorm.weight
        views[f"{prefix}post_attention_layernorm.weight"] = layer.post_attention_layernorm.weight
    views["model.norm.weight"] = model.norm.weight
    if model.lm_head is not None:
        views["lm_head.weight"] = model.lm_head.weight
    return views


def _checkpoint_files(folder: Path) -> list[Path]:
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted(set(weight_map.values()))
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
            raise ModelLoadError(
                str(folder),
                problem=f"{INDEX_FILE} is not a valid safetensors index (a JSON object with "
                "a 'weight_map' of tensor name -> file); restore it from the original model",
            ) from None
        absent = [name for name in names if not (folder / name).is_file()]
        if absent:
            raise ModelLoadError(
                str(folder),
                problem=f"{INDEX_FILE} lists shard file(s) that are not in the folder: "
                f"{', '.join(absent)}; download or copy the missing shards",
            )
        return [folder / name for name in names]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        found_bin = any(folder.glob("*.bin")) or any(folder.glob("*.pt"))
        raise ModelLoadError(
            str(folder),
            problem="no *.safetensors file in the folder"
            + (" (only PyTorch .bin/.pt weights, which are not loaded)" if found_bin else "")
            + "; save the model with transformers' save_pretrained(), which writes "
            "safetensors by default, or convert the weights to safetensors",
        )
    return files


def _read_headers(folder: Path, files: list[Path]) -> dict[str, tuple[Path, tuple[int, ...], str]]:
    """Tensor name -> (file, shape, safetensors dtype such as "BF16"), from the headers.

    Parsed directly (an 8-byte little-endian length, then that much JSON: the format
    every safetensors version writes), so no tensor data is touched.
    """
    headers: dict[str, tuple[Path, tuple[int, ...], str]] = {}
    for file in files:
        try:
            with file.open("rb") as f:
                (length,) = struct.unpack("<Q", f.read(8))
                if length > file.stat().st_size - 8:
                    raise ValueError(f"header length {length} exceeds the file")
                entries = json.loads(f.read(length))
            entries.pop("__metadata__", None)
            for name, info in entries.items():
                headers[name] = (file, tuple(info["shape"]), info["dtype"])
        except (OSError, ValueError, struct.error, KeyError, TypeError, AttributeError) as exc:
            raise ModelLoadError(
                str(folder),
                problem=f"{file.name} is not a readable safetensors file ({exc!r}); "
                "restore it from the original model",
            ) from exc
    return headers


def _is_ignorable(name: str, config: ModelConfig) -> bool:
    """Tensors some checkpoints carry that the model rebuilds or does not need."""
    if name.endswith("rotary_emb.inv_freq"):  # recomputed from the config
        return True
    # A tied checkpoint may still store a copy of the embeddings as the head.
    return config.tie_word_embeddings and name == "lm_head.weight"


def _check_tensors(
    folder: Path,
    config: ModelConfig,
    views: dict[str, WeightTarget],
    headers: dict[str, tuple[Path, tuple[int, ...], str]],
) -> None:
    missing = tuple(name for name in views if name not in headers)
    unexpected = tuple(
        sorted(name for name in headers if name not in views and not _is_ignorable(name, config))
    )
    mismatched = tuple(
        (name, tuple(view.shape), headers[name][1])
        for name, view in views.items()
        if name in headers and headers[name][1] != tuple(view.shape)
    )
    bad_dtypes = tuple(
        (name, headers[name][2])
        for name in views
        if name in headers and headers[name][2] not in _FLOAT_DTYPES
    )
    if missing or unexpected or mismatched or bad_dtypes:
        raise ModelLoadError(
            str(folder),
            missing=missing,
            unexpected=unexpected,
            mismatched=mismatched,
            bad_dtypes=bad_dtypes,
        )


def save_model(model: LlamaForCausalLM, path: str | os.PathLike[str]) -> Path:
    """Write ``config.json`` and ``model.safetensors`` in the Hugging Face layout, so
    transformers (or ``load_model``) reads back this same model, e.g. a preset."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(model.config.to_hf_dict(), indent=2))
    tensors = {
        name: (view.dequantize() if isinstance(view, QuantizedRows) else view.detach())
        .contiguous()
        .cpu()
        for name, view in hf_tensor_views(model).items()
    }
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def weights_nbytes(model: torch.nn.Module) -> int:
    """Bytes the model's weights take: its parameters and its persistent buffers (a
    quantized layer keeps its codes and scales as buffers), each storage once (tied
    embeddings share one). Non-persistent buffers, such as rotary tables, are caches
    rebuilt at load, not weights."""
    seen: set[int] = set()
    total = 0
    for tensor in model.state_dict(keep_vars=True).values():
        pointer = tensor.untyped_storage().data_ptr()
        if pointer in seen:
            continue
        seen.add(pointer)
        total += tensor.untyped_storage().nbytes()
    return total
