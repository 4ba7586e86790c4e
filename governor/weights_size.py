"""How much memory a dense decoder's weights take, in full precision or int8/int4.

Counted from a Hugging Face config.json (``kvgov plan --config PATH --quantize int4``),
as the bundled engine stores them: the four projections of every layer (q/k/v, o,
gate/up, down) quantized with one 16-bit scale per ``group_size`` weights; embeddings,
the output head (unless tied) and the norms in 16 bits. Biases are left out (a few
hundred kilobytes). Exact for Llama-family dense decoders (Llama, Mistral, Qwen2,
Qwen3); a hybrid's linear-attention layers are counted as if they had full attention.
Pure arithmetic: torch is not needed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from governor.errors import ConfigError
from governor.sizing import _read_config, _require_key

__all__ = ["QUANTIZE_BITS", "weights_bytes_from_hf_config"]

QUANTIZE_BITS = {None: 16, "int8": 8, "int4": 4}
_SCALE_BYTES = 2


def weights_bytes_from_hf_config(
    config: Mapping[str, Any] | str | os.PathLike[str],
    *,
    quantize: str | None = None,
    group_size: int = 128,
) -> int:
    """The weights' bytes; ``quantize`` is None (16-bit), "int8" or "int4"."""
    if quantize not in QUANTIZE_BITS:
        raise ConfigError(
            f"quantize must be int8, int4 or omitted (16-bit weights), got {quantize!r}",
            setting="quantize",
        )
    top = config if isinstance(config, Mapping) else _read_config(config)
    text = top.get("text_config")
    d: Mapping[str, Any] = text if isinstance(text, Mapping) else top
    hidden = _require_key(d, "hidden_size")
    layers = _require_key(d, "num_hidden_layers")
    heads = _require_key(d, "num_attention_heads")
    kv_heads = d.get("num_key_value_heads") or heads
    head_dim = d.get("head_dim") or hidden // heads
    vocab = _require_key(d, "vocab_size")
    intermediate = _require_key(d, "intermediate_size")
    projections = layers * (
        hidden * head_dim * (heads + 2 * kv_heads)  # q, k, v
        + heads * head_dim * hidden  # o
        + 3 * hidden * intermediate  # gate, up, down
    )
    tied = bool(d.get("tie_word_embeddings", top.get("tie_word_embeddings", False)))
    full_precision = vocab * hidden * (1 if tied else 2) + (2 * layers + 1) * hidden
    bits = QUANTIZE_BITS[quantize]
    scales = 0 if quantize is None else projections // group_size * _SCALE_BYTES
    return projections * bits // 8 + scales + 2 * full_precision
