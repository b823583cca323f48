"""The per-token parts of a Qwen3 decoder layer for the KV-cache engine: everything but
attention, split into the part before it (norm, projections, q/k norms, RoPE) and after it
(output projection, residuals, MLP).

Two flavours: the stock submodules one by one, and the same arithmetic with the q|k|v and
gate|up projections each done as one matmul over concatenated weights. Short decode forwards
are skinny matmuls (a few hundred rows), where three or two narrow products use the GPU far
worse than one wide one. The concatenated weights are copies held by the engine (the
model's parameters, which training and FSDP own, stay untouched) and are re-copied at each
new batch, so a model updated between generations (RL) is never decoded with stale weights.
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


class FusedWeights:
    """Per layer: q|k|v weight (and bias, if the model has one) and gate|up weight."""

    def __init__(self, layers):
        self.layers = list(layers)
        self.qkv = [torch.cat(self._qkv(layer, "weight")) for layer in self.layers]
        self.qkv_bias = [_cat_or_none(self._qkv(layer, "bias")) for layer in self.layers]
        self.gate_up = [torch.cat(self._gate_up(layer)) for layer in self.layers]
        if any(layer.mlp.gate_proj.bias is not None for layer in self.layers):
            raise ValueError("fused gate/up projections assume bias-free MLPs (Qwen3)")
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
    query, key, value = F.linear(x, w_qkv, b_qkv).split(sizes, dim=-1)
    shape = (*x.shape[:2], -1, head_dim)
    query = attn.q_norm(query.view(shape)).transpose(1, 2)
    key = attn.k_norm(key.reshape(shape)).transpose(1, 2)
    value = value.reshape(shape).transpose(1, 2)
    return _rope_and_cast(query, key, value, cos, sin, dtype)


def qkv_projection(layer, w_qkv, b_qkv, hidden):
    """Norm and fused q|k|v projection only (the rest is decode_kernels.qkv_epilogue)."""
    return F.linear(layer.input_layernorm(hidden), w_qkv, b_qkv)


def post_attention_fused(layer, w_gate_up, hidden, attn_out):
    """As post_attention, with one gate|up matmul."""
    batch, heads, q, dim = attn_out.shape
    hidden = hidden + layer.self_attn.o_proj(attn_out.transpose(1, 2).reshape(batch, q, heads * dim))
    mlp = layer.mlp
    gate, up = F.linear(layer.post_attention_layernorm(hidden), w_gate_up).chunk(2, dim=-1)
    return hidden + mlp.down_proj(mlp.act_fn(gate) * up)


def post_then_qkv(prev, w_gate_up, hidden, attn_out, nxt, w_qkv, b_qkv):
    """post_attention_fused of one layer, then qkv_projection of the next: compiled as one
    graph, the residual add and the next layer's norm become one kernel."""
    hidden = post_attention_fused(prev, w_gate_up, hidden, attn_out)
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
