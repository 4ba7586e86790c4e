"""transformers' model of an engine's architecture, holding that engine's own weights.

Comparisons with transformers must run the same weights. Written to a folder and read
back (``engine.hf_export``), an 8B model costs 16 GB of disk and a minute of a lent
GPU's few; here transformers' model is built on the engine's device and its parameters
are then replaced by the engine's tensors (``load_state_dict(assign=True)``), so both
read the very same memory and nothing is copied. Full-precision engines only: a
quantized engine's weights are not what transformers' layers take.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.engine import Engine
from engine.errors import InvalidRequestError
from engine.quantization.linear import QuantizedRows
from engine.weights import hf_tensor_views

__all__ = ["transformers_model"]


def transformers_model(engine: Engine) -> Any:
    """A ``transformers`` causal LM in eval mode on the engine's device and dtype whose
    weights are the engine's tensors (raises ImportError without transformers)."""
    import transformers

    tensors: dict[str, torch.Tensor] = {}
    for name, view in hf_tensor_views(engine.model).items():
        if isinstance(view, QuantizedRows):
            raise InvalidRequestError(
                "the engine's weights are quantized; compare with transformers on a "
                "full-precision engine (quantize=None)"
            )
        tensors[name] = view.detach()
    hf_dict = dict(engine.model.config.to_hf_dict())
    config = transformers.AutoConfig.for_model(str(hf_dict.pop("model_type")), **hf_dict)
    with torch.device(engine.device):
        hf = transformers.AutoModelForCausalLM.from_config(config, dtype=engine.dtype)
    missing, unexpected = hf.load_state_dict(tensors, strict=False, assign=True)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    if unexpected or set(missing) - ({"lm_head.weight"} if tied else set()):
        raise RuntimeError(
            f"transformers' {config.model_type} does not take the engine's weights: "
            f"missing {sorted(missing)}, unexpected {sorted(unexpected)}"
        )
    if tied:
        hf.tie_weights()
    return hf.eval()
