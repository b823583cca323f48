"""The attention function the training forward plugs into transformers' Qwen3 layers.

Registered with transformers' AttentionInterface under ATTENTION_NAME, so the stock
decoder layers (and FSDP's hooks on them) stay untouched. It takes either a FlexAttention
BlockMask (GPU) or a boolean mask, True = attend (SDPA; CPU and reference runs).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

ATTENTION_NAME = "dicepipe_block_diffusion"
FOLD_MAX_QUERIES = 256


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _flex(query, key, value, block_mask, scale):
    from torch.nn.attention.flex_attention import flex_attention

    # Inside a compiled region dynamo traces flex_attention itself; outside it, the
    # un-compiled version would materialise the whole score matrix.
    fn = flex_attention if torch.compiler.is_compiling() else _compiled_flex()
    return fn(query, key, value, block_mask=block_mask, scale=scale,
              enable_gqa=query.shape[1] != key.shape[1])


def sdpa_gqa(query, key, value, mask, scale, fold: bool | None = None):
    """SDPA with grouped heads folded into the query length (no copy of keys/values).
    query (B, Hq, q, D), key/value (B, Hkv, k, D), mask (B, 1, q, k) bool or None.
    `fold` None folds short queries only."""
    batch, q_heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    group = q_heads // kv_heads
    if fold is None:
        fold = q_len <= FOLD_MAX_QUERIES
    if group > 1 and not fold:
        # Long queries (training): repeating keys costs less than repeating the mask, and
        # keeps SDPA's masked (memory-efficient) kernel eligible, which enable_gqa may not.
        key = key.repeat_interleave(group, dim=1)
        value = value.repeat_interleave(group, dim=1)
    if not fold:
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)
    if group > 1:
        query = query.reshape(batch, kv_heads, group * q_len, dim)
        if mask is not None:
            mask = mask[:, :, None].expand(-1, -1, group, -1, -1).reshape(batch, 1, group * q_len, -1)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)
    return out.reshape(batch, q_heads, q_len, dim)


def block_diffusion_attention(module, query, key, value, attention_mask, scaling=None,
                              dropout=0.0, **kwargs):
    """transformers attention-function signature; returns ((B, q, H, D), None)."""
    from torch.nn.attention.flex_attention import BlockMask

    # Under autocast with fp32 parameters the q/k norms return fp32 while v comes out of a
    # bf16 matmul: attend in v's dtype.
    query, key = query.to(value.dtype), key.to(value.dtype)
    if isinstance(attention_mask, BlockMask):
        out = _flex(query, key, value, attention_mask, scaling)
    elif attention_mask is None:  # transformers leaves plain causal masks to SDPA's flag
        out = F.scaled_dot_product_attention(
            query, key, value, scale=scaling, enable_gqa=query.shape[1] != key.shape[1],
            is_causal=getattr(module, "is_causal", True) and query.shape[2] > 1)
    else:
        out = sdpa_gqa(query, key, value, attention_mask, scaling)
    return out.transpose(1, 2).contiguous(), None


def install(model) -> None:
    """Route `model`'s attention through block_diffusion_attention."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, block_diffusion_attention)
    # Plain transformers forwards of the same model (evaluation, generate) get SDPA's masks.
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    model.config._attn_implementation = ATTENTION_NAME
