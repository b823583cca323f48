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


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def attend(Q, K, V, Out, Pad, Start, PartAcc, PartML,
               s_qb, s_qh, s_qt, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, s_ob, s_ot, s_oh,
               kv_heads, qk_scale,
               Q_LEN: tl.constexpr, GROUP: tl.constexpr, CANVAS_BLOCK: tl.constexpr,
               HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               SPLITS: tl.constexpr, IEEE: tl.constexpr):
        bh = tl.program_id(0)
        split = tl.program_id(1)
        b = bh // kv_heads
        h = bh % kv_heads
        start = tl.load(Start)
        pad = tl.load(Pad + b)
        end = start + Q_LEN
        first = (tl.minimum(pad, start) // BLOCK_N) * BLOCK_N
        n_tiles = tl.cdiv(end - first, BLOCK_N)
        per_split = tl.cdiv(n_tiles, SPLITS)
        t_lo = split * per_split
        t_hi = tl.minimum(n_tiles, t_lo + per_split)

        rows = tl.arange(0, BLOCK_M)
        g = rows // Q_LEN  # query head within the group
        t = rows % Q_LEN  # query position
        row_ok = rows < GROUP * Q_LEN
        q_col = start + t
        q_block = q_col // CANVAS_BLOCK
        d = tl.arange(0, HEAD_DIM)
        head = h * GROUP + g
        q = tl.load(Q + b * s_qb + head[:, None] * s_qh + t[:, None] * s_qt + d[None, :],
                    mask=row_ok[:, None], other=0.0)
        k_base = K + b * s_kb + h * s_kh
        v_base = V + b * s_vb + h * s_vh
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        for tile in range(t_lo, t_hi):
            cols = first + tile * BLOCK_N + tl.arange(0, BLOCK_N)
            in_range = cols < end
            k = tl.load(k_base + cols[:, None] * s_kn + d[None, :], mask=in_range[:, None], other=0.0)
            if IEEE:
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = s * qk_scale
            visible = (cols[None, :] >= pad) & ((cols // CANVAS_BLOCK)[None, :] <= q_block[:, None])
            visible = (visible & in_range[None, :]) | (cols[None, :] == q_col[:, None])
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_use)
            p = tl.exp2(s - m_use[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_base + cols[:, None] * s_vn + d[None, :], mask=in_range[:, None], other=0.0)
            if IEEE:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        if SPLITS == 1:
            out = acc / l_i[:, None]
            tl.store(Out + b * s_ob + t[:, None] * s_ot + head[:, None] * s_oh + d[None, :],
                     out.to(Out.dtype.element_ty), mask=row_ok[:, None])
        else:
            part = bh * SPLITS + split
            tl.store(PartAcc + (part * BLOCK_M + rows)[:, None] * HEAD_DIM + d[None, :], acc)
            tl.store(PartML + (2 * part) * BLOCK_M + rows, m_i)
            tl.store(PartML + (2 * part + 1) * BLOCK_M + rows, l_i)

    @triton.jit
    def combine(PartAcc, PartML, Out, s_ob, s_ot, s_oh, kv_heads,
                Q_LEN: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                BLOCK_M: tl.constexpr, SPLITS: tl.constexpr):
        bh = tl.program_id(0)
        b = bh // kv_heads
        h = bh % kv_heads
        rows = tl.arange(0, BLOCK_M)
        d = tl.arange(0, HEAD_DIM)
        m_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
        for i in range(SPLITS):
            m_max = tl.maximum(m_max, tl.load(PartML + (2 * (bh * SPLITS + i)) * BLOCK_M + rows))
        m_use = tl.where(m_max == float("-inf"), 0.0, m_max)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        denom = tl.zeros([BLOCK_M], tl.float32)
        for i in range(SPLITS):
            part = bh * SPLITS + i
            w = tl.exp2(tl.load(PartML + (2 * part) * BLOCK_M + rows) - m_use)
            denom += w * tl.load(PartML + (2 * part + 1) * BLOCK_M + rows)
            acc += w[:, None] * tl.load(PartAcc + (part * BLOCK_M + rows)[:, None] * HEAD_DIM + d[None, :])
        g = rows // Q_LEN
        t = rows % Q_LEN
        out = acc / denom[:, None]
        tl.store(Out + b * s_ob + t[:, None] * s_ot + (h * GROUP + g)[:, None] * s_oh + d[None, :],
                 out.to(Out.dtype.element_ty), mask=(rows < GROUP * Q_LEN)[:, None])

    @triton.jit
    def greedy(Logits, Tokens, Confidence, s_row, vocab, BLOCK_V: tl.constexpr):
        row = tl.program_id(0)
        base = Logits + row * s_row
        offs = tl.arange(0, BLOCK_V)
        m = tl.full([BLOCK_V], float("-inf"), tl.float32)
        arg = tl.zeros([BLOCK_V], tl.int32)
        total = tl.zeros([BLOCK_V], tl.float32)
        for v0 in range(0, vocab, BLOCK_V):
            idx = v0 + offs
            x = tl.load(base + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32)
            better = x > m  # strict: the lowest index wins ties within a lane
            m_new = tl.maximum(m, x)
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            total = total * tl.exp(m - m_use) + tl.exp(x - m_use)
            arg = tl.where(better, idx, arg)
            m = m_new
        best = tl.max(m, 0)
        # lowest index among the lanes holding the maximum
        token = tl.min(tl.where(m == best, arg, 2147483647), 0)
        denom = tl.sum(total * tl.exp(m - best), 0)
        tl.store(Tokens + row, token.to(tl.int64))
        tl.store(Confidence + row, 1.0 / denom)

    @triton.jit
    def qkv_epilogue(QKV, Pad, Start, Cos, Sin, QW, KW, QOut, KC, VC,
                     s_xb, s_xt, s_cos, s_qb, s_qt, s_qh, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, eps,
                     Q_LEN: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, HEAD_DIM: tl.constexpr,
                     HQ_P2: tl.constexpr, HKV_P2: tl.constexpr):
        pid = tl.program_id(0)
        b = pid // Q_LEN
        t = pid % Q_LEN
        col = tl.load(Start) + t
        pos = tl.maximum(col - tl.load(Pad + b), 0)
        d = tl.arange(0, HEAD_DIM)
        rot = (d + HEAD_DIM // 2) % HEAD_DIM
        sign = tl.where(d < HEAD_DIM // 2, -1.0, 1.0)
        cos = tl.load(Cos + pos * s_cos + d).to(tl.float32)
        sin = tl.load(Sin + pos * s_cos + d).to(tl.float32)
        base = QKV + b * s_xb + t * s_xt
        dt = QOut.dtype.element_ty

        hq = tl.arange(0, HQ_P2)
        q_ok = (hq < HQ)[:, None]
        x = tl.load(base + hq[:, None] * HEAD_DIM + d[None, :], mask=q_ok, other=0.0).to(tl.float32)
        xr = tl.load(base + hq[:, None] * HEAD_DIM + rot[None, :], mask=q_ok, other=0.0).to(tl.float32)
        r = tl.rsqrt(tl.sum(x * x, 1) / HEAD_DIM + eps)[:, None]
        # as Qwen3RMSNorm: normalise in fp32, cast, then scale by the weight in the model dtype
        n = ((x * r).to(dt).to(tl.float32) * tl.load(QW + d).to(tl.float32)[None, :]).to(dt).to(tl.float32)
        nr = ((xr * r).to(dt).to(tl.float32) * tl.load(QW + rot).to(tl.float32)[None, :]).to(dt).to(tl.float32)
        out = n * cos[None, :] + sign[None, :] * nr * sin[None, :]
        tl.store(QOut + b * s_qb + t * s_qt + hq[:, None] * s_qh + d[None, :], out.to(dt), mask=q_ok)

        hk = tl.arange(0, HKV_P2)
        k_ok = (hk < HKV)[:, None]
        kbase = base + HQ * HEAD_DIM
        x = tl.load(kbase + hk[:, None] * HEAD_DIM + d[None, :], mask=k_ok, other=0.0).to(tl.float32)
        xr = tl.load(kbase + hk[:, None] * HEAD_DIM + rot[None, :], mask=k_ok, other=0.0).to(tl.float32)
        r = tl.rsqrt(tl.sum(x * x, 1) / HEAD_DIM + eps)[:, None]
        n = ((x * r).to(dt).to(tl.float32) * tl.load(KW + d).to(tl.float32)[None, :]).to(dt).to(tl.float32)
        nr = ((xr * r).to(dt).to(tl.float32) * tl.load(KW + rot).to(tl.float32)[None, :]).to(dt).to(tl.float32)
        out = n * cos[None, :] + sign[None, :] * nr * sin[None, :]
        tl.store(KC + b * s_kb + hk[:, None] * s_kh + col * s_kn + d[None, :], out.to(dt), mask=k_ok)

        v = tl.load(kbase + (HKV + hk[:, None]) * HEAD_DIM + d[None, :], mask=k_ok, other=0.0)
        tl.store(VC + b * s_vb + hk[:, None] * s_vh + col * s_vn + d[None, :], v.to(dt), mask=k_ok)

    return attend, combine, greedy, qkv_epilogue


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
    L >= start + q; pad (B,) long; start 0-dim long tensor. Returns (B, Hq, q, D), a view of
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
    Writes keys/values at columns start..start+q of the caches (B, Hkv, L, D) and returns
    the queries (B, Hq, q, D), a view of a contiguous (B, q, Hq, D) tensor."""
    _, _, _, kernel = _kernels()
    batch, q_len, width = qkv.shape
    assert width == (q_heads + 2 * kv_heads) * head_dim and qkv.stride(2) == 1
    assert q_norm.variance_epsilon == k_norm.variance_epsilon
    query = torch.empty((batch, q_len, q_heads, head_dim), dtype=key_cache.dtype, device=qkv.device)
    kernel[(batch * q_len,)](
        qkv, pad, start, cos, sin, q_norm.weight, k_norm.weight, query, key_cache, value_cache,
        qkv.stride(0), qkv.stride(1), cos.stride(0),
        query.stride(0), query.stride(1), query.stride(2),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2), q_norm.variance_epsilon,
        Q_LEN=q_len, HQ=q_heads, HKV=kv_heads, HEAD_DIM=head_dim,
        HQ_P2=1 << (q_heads - 1).bit_length(), HKV_P2=1 << (kv_heads - 1).bit_length(), num_warps=4)
    return query.transpose(1, 2)
