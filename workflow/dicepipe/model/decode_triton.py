"""The Triton kernels behind decode_kernels (imported from there only when Triton is
present, so that the package imports on CPU-only installs); see decode_kernels for what
each computes. Helpers are module-level @triton.jit functions: Triton (and its CPU
interpreter, TRITON_INTERPRET=1) resolves a kernel's callees through the module globals."""

from __future__ import annotations

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
        k = tl.load(k_base + cols[:, None] * s_kn + d[None, :], mask=in_range[:, None], other=0.0).to(q.dtype)
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
        v = tl.load(v_base + cols[:, None] * s_vn + d[None, :], mask=in_range[:, None], other=0.0).to(q.dtype)
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
def _norm_rope(base, W, cos, sin, eps, N: tl.constexpr, N_P2: tl.constexpr, HEAD_DIM: tl.constexpr):
    """N heads of HEAD_DIM values at `base` (dtype of the projection): per-head RMS norm
    with weight W as Qwen3RMSNorm does it (normalise in fp32, cast, scale by the weight in
    the model dtype), then RoPE by the (HEAD_DIM,) fp32 cos/sin. Returns (N_P2, HEAD_DIM)
    fp32, rows from N on zero (masked)."""
    dt = base.dtype.element_ty
    h = tl.arange(0, N_P2)
    d = tl.arange(0, HEAD_DIM)
    rot = (d + HEAD_DIM // 2) % HEAD_DIM  # rotate_half: partner element of each lane
    sign = tl.where(d < HEAD_DIM // 2, -1.0, 1.0)
    ok = (h < N)[:, None]
    x = tl.load(base + h[:, None] * HEAD_DIM + d[None, :], mask=ok, other=0.0).to(tl.float32)
    xr = tl.load(base + h[:, None] * HEAD_DIM + rot[None, :], mask=ok, other=0.0).to(tl.float32)
    r = tl.rsqrt(tl.sum(x * x, 1) / HEAD_DIM + eps)[:, None]
    n = ((x * r).to(dt).to(tl.float32) * tl.load(W + d).to(tl.float32)[None, :]).to(dt).to(tl.float32)
    nr = ((xr * r).to(dt).to(tl.float32) * tl.load(W + rot).to(tl.float32)[None, :]).to(dt).to(tl.float32)
    return n * cos[None, :] + sign[None, :] * nr * sin[None, :]


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
    cos = tl.load(Cos + pos * s_cos + d).to(tl.float32)
    sin = tl.load(Sin + pos * s_cos + d).to(tl.float32)
    base = QKV + b * s_xb + t * s_xt
    dt = QKV.dtype.element_ty

    hq = tl.arange(0, HQ_P2)
    q = _norm_rope(base, QW, cos, sin, eps, HQ, HQ_P2, HEAD_DIM)
    tl.store(QOut + b * s_qb + t * s_qt + hq[:, None] * s_qh + d[None, :], q.to(dt), mask=(hq < HQ)[:, None])

    hk = tl.arange(0, HKV_P2)
    k_ok = (hk < HKV)[:, None]
    kbase = base + HQ * HEAD_DIM
    k = _norm_rope(kbase, KW, cos, sin, eps, HKV, HKV_P2, HEAD_DIM)
    # rounded to the model dtype first (as the stock layer), then to the cache's (fp8 option)
    k = k.to(dt).to(tl.float32).to(KC.dtype.element_ty)
    tl.store(KC + b * s_kb + hk[:, None] * s_kh + col * s_kn + d[None, :], k, mask=k_ok)
    v = tl.load(kbase + (HKV + hk[:, None]) * HEAD_DIM + d[None, :], mask=k_ok, other=0.0)
    v = v.to(tl.float32).to(VC.dtype.element_ty)
    tl.store(VC + b * s_vb + hk[:, None] * s_vh + col * s_vn + d[None, :], v, mask=k_ok)
