"""The per-token parts of a Qwen3 decoder layer for the KV-cache engine: everything but
attention, split into the part before it (norm, projections, q/k norms, RoPE) and after it
(output projection, residuals, MLP).

Two flavours: the stock submodules one by one, and the same arithmetic with the q|k|v and
gate|up projections each done as one matmul over concatenated weights. Short decode forwards
are skinny matmuls (a few hundred rows), where three or two narrow products use the GPU far
worse than one wide one. The concatenated weights are copies held by the engine (the
model's parameters, which training and FSDP own, stay untouched) and are re-copied at each
new batch, so a model updated between generations (RL) is never decoded with stale weights.

Optionally (`weight_dtype=torch.float8_e4m3fn`) the four matmuls of a layer run in float8:
weights quantized per output channel, activations per token at run time (scale = row
amax / 448), product by torch._scaled_mm with bf16 output. On the H200 a layer's matmuls
(quantization included) take 17-26% less time at 512-1,024 tokens and slightly more below
that; it changes the numerics (relative error of a product ~3%), so it is an opt-in for
rollouts, never used for training.
"""

from __future__ import annotations

import functools
import types

import torch
import torch.nn.functional as F


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _cat_or_none(tensors):
    return None if any(t is None for t in tensors) else torch.cat(tensors)


FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn


def quantize_rows(x: torch.Tensor):
    """(..., K) -> (float8 values, float32 scales (..., 1)): one scale per row, amax / 448,
    so every row spans float8's range (an all-zero row gets a tiny scale, and zeros)."""
    scale = x.detach().abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def fp8_linear(x: torch.Tensor, weight: tuple, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear with `weight` = (float8 (N, K), float32 scales (N, 1)) from quantize_rows:
    x is quantized per token, the product accumulates in fp32 and comes out in bf16."""
    w8, w_scale = weight
    lead = x.shape[:-1]
    x8, x_scale = quantize_rows(x.reshape(-1, x.shape[-1]))
    out = torch._scaled_mm(x8, w8.t(), scale_a=x_scale, scale_b=w_scale.t(), out_dtype=torch.bfloat16)
    out = out.to(x.dtype).reshape(*lead, w8.shape[0])
    return out if bias is None else out + bias


def linear(x: torch.Tensor, weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear for a plain weight, fp8_linear for a (float8, scales) pair."""
    return fp8_linear(x, weight, bias) if isinstance(weight, tuple) else F.linear(x, weight, bias)


class FusedWeights:
    """Per layer: q|k|v weight (and bias, if the model has one) and gate|up weight; with
    `weight_dtype` float8 also the output and down projections, each as (values, scales)
    pairs (quantize_rows), and `o`/`down` None otherwise (the model's own modules run)."""

    def __init__(self, layers, weight_dtype: torch.dtype | None = None):
        self.layers = list(layers)
        if weight_dtype not in (None, FP8):
            raise ValueError(f"weight_dtype {weight_dtype}: expected None or {FP8}")
        self.fp8 = weight_dtype == FP8
        if any(layer.mlp.gate_proj.bias is not None for layer in self.layers):
            raise ValueError("fused gate/up projections assume bias-free MLPs (Qwen3)")
        if self.fp8 and any(layer.self_attn.o_proj.bias is not None for layer in self.layers):
            raise ValueError("float8 weights assume a bias-free output projection (Qwen3)")
        self.qkv_bias = [_cat_or_none(self._qkv(layer, "bias")) for layer in self.layers]
        if self.fp8:
            self.qkv, self.gate_up, self.o, self.down = ([None] * len(self.layers) for _ in range(4))
            self.refresh()
        else:
            self.qkv = [torch.cat(self._qkv(layer, "weight")) for layer in self.layers]
            self.gate_up = [torch.cat(self._gate_up(layer)) for layer in self.layers]
            self.o = self.down = [None] * len(self.layers)
        attn = self.layers[0].self_attn
        self.sizes = (attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features)

    @staticmethod
    def _qkv(layer, name):
        attn = layer.self_attn
        return [getattr(attn.q_proj, name), getattr(attn.k_proj, name), getattr(attn.v_proj, name)]

    @staticmethod
    def _gate_up(layer):
        return [layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight]

    @torch.no_grad()
    def refresh(self) -> None:
        if self.fp8:  # in place after the first time: captured CUDA graphs hold the addresses
            for i, layer in enumerate(self.layers):
                for slots, weight in ((self.qkv, torch.cat(self._qkv(layer, "weight"))),
                                      (self.gate_up, torch.cat(self._gate_up(layer))),
                                      (self.o, layer.self_attn.o_proj.weight),
                                      (self.down, layer.mlp.down_proj.weight)):
                    pair = quantize_rows(weight)
                    if slots[i] is None:
                        slots[i] = pair
                    else:
                        slots[i][0].copy_(pair[0])
                        slots[i][1].copy_(pair[1])
                if self.qkv_bias[i] is not None:
                    torch.cat(self._qkv(layer, "bias"), out=self.qkv_bias[i])
            return
        for i, layer in enumerate(self.layers):
            torch.cat(self._qkv(layer, "weight"), out=self.qkv[i])
            if self.qkv_bias[i] is not None:
                torch.cat(self._qkv(layer, "bias"), out=self.qkv_bias[i])
            torch.cat(self._gate_up(layer), out=self.gate_up[i])


def _rope_and_cast(query, key, value, cos, sin, dtype):
    query = query * cos + _rotate_half(query) * sin
    key = key * cos + _rotate_half(key) * sin
    return query.to(dtype), key.to(dtype), value.to(dtype)


def pre_attention(layer, hidden, cos, sin, head_dim: int, dtype: torch.dtype):
    """Stock submodules: norm, projections, q/k norms, RoPE -> (B, H, q, D) each."""
    attn = layer.self_attn
    x = layer.input_layernorm(hidden)
    shape = (*x.shape[:2], -1, head_dim)
    query = attn.q_norm(attn.q_proj(x).view(shape)).transpose(1, 2)
    key = attn.k_norm(attn.k_proj(x).view(shape)).transpose(1, 2)
    value = attn.v_proj(x).view(shape).transpose(1, 2)
    return _rope_and_cast(query, key, value, cos, sin, dtype)


def post_attention(layer, hidden, attn_out):
    """Stock submodules: output projection, residuals, MLP."""
    batch, heads, q, dim = attn_out.shape
    hidden = hidden + layer.self_attn.o_proj(attn_out.transpose(1, 2).reshape(batch, q, heads * dim))
    return hidden + layer.mlp(layer.post_attention_layernorm(hidden))


def pre_attention_fused(layer, w_qkv, b_qkv, sizes, hidden, cos, sin, head_dim: int, dtype: torch.dtype):
    """As pre_attention, with one q|k|v matmul."""
    attn = layer.self_attn
    x = layer.input_layernorm(hidden)
    query, key, value = linear(x, w_qkv, b_qkv).split(sizes, dim=-1)
    shape = (*x.shape[:2], -1, head_dim)
    query = attn.q_norm(query.view(shape)).transpose(1, 2)
    key = attn.k_norm(key.reshape(shape)).transpose(1, 2)
    value = value.reshape(shape).transpose(1, 2)
    return _rope_and_cast(query, key, value, cos, sin, dtype)


def qkv_projection(layer, w_qkv, b_qkv, hidden):
    """Norm and fused q|k|v projection only (the rest is decode_kernels.qkv_epilogue)."""
    return linear(layer.input_layernorm(hidden), w_qkv, b_qkv)


def post_attention_fused(layer, w_gate_up, hidden, attn_out, w_o=None, w_down=None):
    """As post_attention, with one gate|up matmul; w_o / w_down: float8 pairs for the
    output and down projections (None: the layer's own modules)."""
    batch, heads, q, dim = attn_out.shape
    mlp = layer.mlp
    attn_out = attn_out.transpose(1, 2).reshape(batch, q, heads * dim)
    hidden = hidden + (layer.self_attn.o_proj(attn_out) if w_o is None else linear(attn_out, w_o))
    gate, up = linear(layer.post_attention_layernorm(hidden), w_gate_up).chunk(2, dim=-1)
    act = mlp.act_fn(gate) * up
    return hidden + (mlp.down_proj(act) if w_down is None else linear(act, w_down))


def post_then_qkv(prev, w_gate_up, hidden, attn_out, nxt, w_qkv, b_qkv, w_o=None, w_down=None):
    """post_attention_fused of one layer, then qkv_projection of the next: compiled as one
    graph, the residual add and the next layer's norm become one kernel."""
    hidden = post_attention_fused(prev, w_gate_up, hidden, attn_out, w_o, w_down)
    return hidden, qkv_projection(nxt, w_qkv, b_qkv, hidden)


def _own_code(fn):
    """`fn` under a code object of its own: dynamo keeps compiled code, and the shapes it has
    seen (automatic dynamic shapes), per code object, so the prefill's compilations neither
    meet the decode forwards' guards nor turn dynamic because of their shapes."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}_prefill")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


@functools.cache
def compiled_parts(fused: bool, dynamic: bool | None = False):
    """(pre, post, qkv_projection, post_then_qkv) compiled once per process (plain functions,
    so engines share the compiled code; the guards are on shapes and dtypes). `dynamic`
    None (the prefill, whose length follows the prompts): static shapes for the first
    length (dynamic-shape kernels ran ~3x slower there), one dynamic compilation once a
    second length comes; these are separate copies of the functions."""
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):  # shapes: batch buckets x query lengths
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), 64))
    pre, post = (pre_attention_fused, post_attention_fused) if fused else (pre_attention, post_attention)
    fns = (pre, post, qkv_projection, post_then_qkv)
    if dynamic is None:
        fns = tuple(_own_code(fn) for fn in fns)
    return tuple(torch.compile(fn, dynamic=dynamic) for fn in fns)
