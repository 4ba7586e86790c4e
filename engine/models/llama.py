"""The Llama-family decoder: Llama 2/3, Mistral, Qwen2 and Qwen3 in one module.

Shapes: T tokens in the step (every sequence's new tokens, flattened; see
``engine/attention/metadata.py``), H hidden size, Hq query heads, Hkv key/value
heads, D head dim, I intermediate size, V vocabulary. The architectures differ only
in switches that ``ModelConfig`` carries: q/k/v biases (Qwen2), an o_proj bias
(Llama ``attention_bias``), MLP biases, per-head q/k RMSNorm before rotary (Qwen3),
tied embeddings and the rotary scaling.

With ``quantization`` (int8 or int4, ``engine.quantization``) the four projections of
every layer hold codes and group-wise scales; embeddings, norms and the output head
stay in the model dtype.

q/k/v and gate/up are fused into one matmul each; ``engine.weights`` maps the Hugging
Face tensor names onto their row slices. Arithmetic follows transformers step by step
(RMSNorm in float32, residual adds and logits in the model dtype) so that outputs
match it, not only in float32.

Construction allocates the parameters on ``device`` without initializing them: fill
them with ``engine.weights.load_model`` or ``engine.presets.build_preset_model``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention.backend import AttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.device import default_dtype, resolve_device
from engine.errors import InvalidRequestError
from engine.kv_cache import KVCache
from engine.model_config import ModelConfig
from engine.models.packed_linear import PackedLinear, onednn_packing_works
from engine.models.rope import RotaryEmbedding, apply_rotary
from engine.models.screened_argmax import ScreenedArgmax
from engine.quantization.linear import make_linear
from engine.quantization.scheme import WeightQuantization

__all__ = ["LlamaForCausalLM", "RMSNorm"]


class RMSNorm(nn.Module):
    def __init__(self, size: int, *, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(size, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., size] -> [..., size]
        # transformers' arithmetic in five ops: F.rms_norm runs about ten on a CPU
        # (torch 2.13), and a cold 8-prompt generate took 1-5% longer with it, paired
        # runs. The product commutes element by element: x * r * w is w * (x * r).
        if x.dtype == self.weight.dtype == torch.float32:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class LlamaAttention(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        *,
        layer: int,
        dtype: torch.dtype,
        quantization: WeightQuantization | None = None,
    ) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        q_size = config.num_heads * config.head_dim
        kv_size = config.num_kv_heads * config.head_dim
        self.qkv_sizes = (q_size, kv_size, kv_size)
        self.qkv_proj = make_linear(
            config.hidden_size,
            sum(self.qkv_sizes),
            bias=config.attention_bias,
            dtype=dtype,
            quantization=quantization,
        )
        self.o_proj = make_linear(
            q_size,
            config.hidden_size,
            bias=config.attention_out_bias,
            dtype=dtype,
            quantization=quantization,
        )
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if config.qk_norm:
            self.q_norm = RMSNorm(config.head_dim, eps=config.rms_norm_eps, dtype=dtype)
            self.k_norm = RMSNorm(config.head_dim, eps=config.rms_norm_eps, dtype=dtype)

    def forward(
        self,
        x: torch.Tensor,  # [T, H]
        rope: tuple[torch.Tensor, torch.Tensor],  # cos, sin: [T, D] each
        kv_cache: KVCache,
        metadata: AttentionMetadata,
        attention: AttentionBackend,
    ) -> torch.Tensor:  # [T, H]
        num_tokens = x.shape[0]
        qkv = self.qkv_proj(x)  # [T, (Hq + 2 Hkv) D]
        q_size, kv_size, _ = self.qkv_sizes
        v = qkv[:, q_size + kv_size :].view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k, _ = qkv.split(self.qkv_sizes, dim=-1)
            q = self.q_norm(q.view(num_tokens, self.num_heads, self.head_dim))  # [T, Hq, D]
            k = self.k_norm(k.view(num_tokens, self.num_kv_heads, self.head_dim))
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        else:
            # q's and k's heads side by side in each row: rotated in one pass, as one
            # [T, Hq + Hkv, D] view (a rotation is per head, so the result is the same).
            heads = self.num_heads + self.num_kv_heads
            qk = apply_rotary(qkv[:, : q_size + kv_size].view(num_tokens, heads, -1), *rope)
            q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]  # [T, Hq, D], [T, Hkv, D]
        out = attention.forward(
            q,
            k,
            v,
            kv_cache.key_cache(self.layer),
            kv_cache.value_cache(self.layer),
            metadata,
            scale=self.scale,
        )  # [T, Hq, D]
        return self.o_proj(out.reshape(num_tokens, -1))


class LlamaMLP(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        *,
        dtype: torch.dtype,
        quantization: WeightQuantization | None = None,
    ) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = make_linear(
            config.hidden_size,
            2 * config.intermediate_size,
            bias=config.mlp_bias,
            dtype=dtype,
            quantization=quantization,
        )
        self.down_proj = make_linear(
            config.intermediate_size,
            config.hidden_size,
            bias=config.mlp_bias,
            dtype=dtype,
            quantization=quantization,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, H] -> [T, H]
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)  # 2 x [T, I]
        # In place on the projection's own output (no gradients here): two [T, I]
        # tensors fewer to allocate and write, the same values.
        return self.down_proj(F.silu(gate, inplace=True).mul_(up))


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        *,
        layer: int,
        dtype: torch.dtype,
        quantization: WeightQuantization | None = None,
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, dtype=dtype)
        self.self_attn = LlamaAttention(config, layer=layer, dtype=dtype, quantization=quantization)
        self.post_attention_layernorm = RMSNorm(
            config.hidden_size, eps=config.rms_norm_eps, dtype=dtype
        )
        self.mlp = LlamaMLP(config, dtype=dtype, quantization=quantization)

    def forward(
        self,
        x: torch.Tensor,  # [T, H]
        rope: tuple[torch.Tensor, torch.Tensor],  # cos, sin: [T, D] each
        kv_cache: KVCache,
        metadata: AttentionMetadata,
        attention: AttentionBackend,
    ) -> torch.Tensor:  # [T, H]
        h = self.input_layernorm(x)
        x = x + self.self_attn(h, rope, kv_cache, metadata, attention)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaForCausalLM(nn.Module):
    """A Llama-family decoder over a paged KV cache.

    ``forward`` runs one engine step (any mix of prefill chunks and decodes). The caller
    plans the step first with ``attention.prepare(metadata)``, once for all layers, as
    the ``AttentionBackend`` contract says; the model only calls ``attention.forward``.
    """

    attention: AttentionBackend
    _logits_matmul: PackedLinear
    _screened_argmax: ScreenedArgmax

    def __init__(
        self,
        config: ModelConfig,
        *,
        attention: AttentionBackend,
        device: str | torch.device = "auto",
        dtype: torch.dtype | None = None,
        quantization: WeightQuantization | None = None,
    ) -> None:
        super().__init__()
        resolved = resolve_device(device)
        dtype = default_dtype(resolved) if dtype is None else dtype
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise InvalidRequestError(
                f"dtype must be a floating-point torch.dtype such as torch.bfloat16, got {dtype!r}"
            )
        self.config = config
        self.quantization = quantization
        # Kept out of the module tree: a backend that is itself an nn.Module must not
        # have its tensors counted as weights or wiped by to_empty() below.
        object.__setattr__(self, "attention", attention)
        self.rotary = RotaryEmbedding(
            head_dim=config.head_dim, theta=config.rope_theta, scaling=config.rope_scaling
        )
        # Built on the meta device, then given real (uninitialized) storage: no time is
        # spent on random init that the loader would overwrite.
        with torch.device("meta"):
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, dtype=dtype)
            self.layers = nn.ModuleList(
                LlamaDecoderLayer(config, layer=i, dtype=dtype, quantization=quantization)
                for i in range(config.num_layers)
            )
            self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, dtype=dtype)
            self.lm_head: nn.Linear | None = None
            if not config.tie_word_embeddings:
                self.lm_head = nn.Linear(
                    config.hidden_size, config.vocab_size, bias=False, dtype=dtype
                )
        self.to_empty(device=resolved)
        if resolved.type == "cpu" and not onednn_packing_works():
            output = self.embed_tokens if self.lm_head is None else self.lm_head
            # Column-major storage of the output projection ([H, V] in memory, seen as
            # [V, H]): a plain CPU GEMM with few rows streams it about 3x faster (one
            # decode token: 4 ms instead of 12 ms for a 100k x 256 head), and the logits
            # are bit-identical. Where oneDNN packs the weight (PackedLinear) the layout
            # does not matter to the GEMM, and rows are what the greedy screen's exact
            # pass reads: hundreds of 1 KB rows instead of 256 strided reads each.
            rows, cols = output.weight.shape
            column_major = torch.empty(cols, rows, dtype=dtype, device=resolved).t()
            output.weight = nn.Parameter(column_major, requires_grad=False)
        self.requires_grad_(False)
        self.eval()
        object.__setattr__(self, "_logits_matmul", PackedLinear())  # no nn.Module state
        object.__setattr__(self, "_screened_argmax", ScreenedArgmax())

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def forward(
        self,
        input_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64
        kv_cache: KVCache,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:  # [T, H], after the final norm
        x = self.embed_tokens(input_ids)  # [T, H]
        rope = self.rotary(positions, x.dtype)  # cos, sin: [T, D] each, shared by all layers
        for layer in self.layers:
            x = layer(x, rope, kv_cache, metadata, self.attention)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [..., H] -> [..., V]
        """float32 logits; the matmul runs in the model dtype, as in transformers."""
        return self._logits_matmul(hidden, self._output_weight()).float()

    def greedy_tokens(self, hidden: torch.Tensor) -> torch.Tensor:  # [S, H] -> [S] int64
        """``compute_logits(hidden).argmax(-1)``, without the full logits where the
        CPU can screen the vocabulary (``engine.models.screened_argmax``)."""
        tokens = self._screened_argmax(hidden, self._output_weight())
        return self.compute_logits(hidden).argmax(dim=-1) if tokens is None else tokens

    def _output_weight(self) -> torch.Tensor:  # [V, H]
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
