"""Triton kernels for the decode forwards (CUDA only; the CPU path stays on SDPA/torch).

`decode_attention`: attention of a short query (the 1-8 current canvas positions) over the
KV cache, split-KV ("flash-decoding") style. One program owns one (row, KV head) and a
share of that row's keys, with the query heads of the GQA group and the query positions
folded into the rows of one tile, so each key/value is read once per KV head. The row's
visible range comes from tensors (left padding `pad`, query start `start`), so a captured
CUDA graph stays valid while the canvas grows, and keys outside [min(pad, start), start+q)
are never read. The mask inside the range is masks.block_causal_mask's rule.

`qkv_epilogue`: from the fused q|k|v projection, the per-head RMS norms of queries and keys,
RoPE, and the keys'/values' write into the cache at their canvas columns, in one launch
(the stock path takes five or more small kernels per layer).

`greedy_pick`: argmax token and its softmax probability per row of a logits matrix in one
pass over the (bf16) logits, instead of materialising fp32 logits and probabilities.
"""

from __future__ import annotations

import functools

import torch

# Programs per SM below which a row's keys are split across several programs (batch 1..16).
_TARGET_PROGRAMS_PER_SM = 2
_MAX_SPLITS = 64


@functools.cache
def available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


def _kernels():
    from . import decode_triton as k  # needs Triton; imported on first use only

    return k.attend, k.combine, k.greedy, k.qkv_epilogue


@functools.cache
def _sm_count(device_index: int) -> int:
    if not torch.cuda.is_available():  # Triton's interpreter on the CPU (kernel debugging)
        return 4
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def default_config(batch: int, kv_heads: int, key_len: int, device: torch.device) -> dict:
    """Launch parameters; `key_len` is the static key-length bucket (the CUDA graph's key)."""
    block_n = 64
    programs = batch * kv_heads
    index = device.index if device.index is not None or device.type != "cuda" else torch.cuda.current_device()
    want = -(-_TARGET_PROGRAMS_PER_SM * _sm_count(index) // programs)
    splits = max(1, min(_MAX_SPLITS, want, -(-key_len // (4 * block_n))))
    return {"block_n": block_n, "splits": splits, "num_warps": 4, "num_stages": 3}


def decode_attention(query, keys, values, pad, start, canvas_block: int, scale: float,
                     key_len: int, config: dict | None = None):
    """query (B, Hq, q, D) (any strides, unit stride in D); keys/values (B, Hkv, L, D) with
    L >= start + q, in the query's dtype or float8 (converted after loading); pad (B,) long; start 0-dim long tensor. Returns (B, Hq, q, D), a view of
    a contiguous (B, q, Hq, D) tensor (what the output projection wants)."""
    attend, combine, _, _ = _kernels()
    batch, q_heads, q_len, dim = query.shape
    kv_heads = keys.shape[1]
    group = q_heads // kv_heads
    cfg = config or default_config(batch, kv_heads, key_len, query.device)
    block_m = max(16, 1 << (group * q_len - 1).bit_length())
    splits = cfg["splits"]
    out = torch.empty((batch, q_len, q_heads, dim), dtype=query.dtype, device=query.device)
    if splits > 1:
        part_acc = torch.empty((batch * kv_heads * splits * block_m, dim), dtype=torch.float32,
                               device=query.device)
        part_ml = torch.empty((batch * kv_heads * splits * 2, block_m), dtype=torch.float32,
                              device=query.device)
    else:
        part_acc = part_ml = out  # unused
    assert query.stride(3) == 1 and keys.stride(3) == 1 and values.stride(3) == 1
    log2e = 1.4426950408889634
    attend[(batch * kv_heads, splits)](
        query, keys, values, out, pad, start, part_acc, part_ml,
        query.stride(0), query.stride(1), query.stride(2),
        keys.stride(0), keys.stride(1), keys.stride(2),
        values.stride(0), values.stride(1), values.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        kv_heads, scale * log2e,
        Q_LEN=q_len, GROUP=group, CANVAS_BLOCK=canvas_block, HEAD_DIM=dim, BLOCK_M=block_m,
        BLOCK_N=cfg["block_n"], SPLITS=splits, IEEE=query.dtype == torch.float32,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    if splits > 1:
        combine[(batch * kv_heads,)](
            part_acc, part_ml, out, out.stride(0), out.stride(1), out.stride(2), kv_heads,
            Q_LEN=q_len, GROUP=group, HEAD_DIM=dim, BLOCK_M=block_m, SPLITS=splits, num_warps=4)
    return out.transpose(1, 2)


def greedy_pick(logits: torch.Tensor):
    """logits (N, V) -> (tokens (N,) int64, confidence (N,) fp32): argmax (lowest index on
    ties) and its softmax probability, computed in fp32 from one read of the logits."""
    _, _, greedy, _ = _kernels()
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    rows, vocab = logits.shape
    tokens = torch.empty(rows, dtype=torch.long, device=logits.device)
    confidence = torch.empty(rows, dtype=torch.float32, device=logits.device)
    if rows:
        greedy[(rows,)](logits, tokens, confidence, logits.stride(0), vocab, BLOCK_V=1024, num_warps=4)
    return tokens, confidence


def qkv_epilogue(qkv, pad, start, cos, sin, q_norm, k_norm, key_cache, value_cache,
                 q_heads: int, kv_heads: int, head_dim: int):
    """qkv (B, q, (Hq + 2 Hkv) * D), unit stride in the last dim; cos/sin (L, D) tables by
    position; q_norm/k_norm the layers' Qwen3RMSNorm modules; start 0-dim long tensor.
    Writes keys/values at columns start..start+q of the caches (B, Hkv, L, D) (in the
    caches' dtype: the model's, or float8_e4m3fn, unscaled) and returns the queries
    (B, Hq, q, D) in qkv's dtype, a view of a contiguous (B, q, Hq, D) tensor."""
    _, _, _, kernel = _kernels()
    batch, q_len, width = qkv.shape
    assert width == (q_heads + 2 * kv_heads) * head_dim and qkv.stride(2) == 1
    assert q_norm.variance_epsilon == k_norm.variance_epsilon
    query = torch.empty((batch, q_len, q_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    kernel[(batch * q_len,)](
        qkv, pad, start, cos, sin, q_norm.weight, k_norm.weight, query, key_cache, value_cache,
        qkv.stride(0), qkv.stride(1), cos.stride(0),
        query.stride(0), query.stride(1), query.stride(2),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2), q_norm.variance_epsilon,
        Q_LEN=q_len, HQ=q_heads, HKV=kv_heads, HEAD_DIM=head_dim,
        HQ_P2=1 << (q_heads - 1).bit_length(), HKV_P2=1 << (kv_heads - 1).bit_length(), num_warps=4)
    return query.transpose(1, 2)
