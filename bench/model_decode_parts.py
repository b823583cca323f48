"""Where a decode forward's time goes, part by part, at the shapes of bench/model_decode.py
(random weights are not needed: every part is timed on random tensors of the right shape).

- attention over the KV cache: SDPA's masked kernel over the 128-granular key bucket (the
  decoder's path before the Triton kernel) against the split-KV Triton kernel (a few launch
  configurations), for the short queries of the fused (8) and plain (4) forwards; GB/s
  counts the keys/values each row really needs (its padding excluded).
- the layer's matmuls at the forward's token counts: separate q/k/v and gate/up projections
  against the fused ones, and the output layer at all block positions against the masked
  ones.

Times are CUDA-graph replays (median of 5 timings of 20 replays), so launch overhead is
excluded as it is in the decoder.

    PYTHONPATH=workflow python bench/model_decode_parts.py --out /tmp/parts.json
"""

# ruff: noqa: B023  (each timed closure is called within its own loop iteration)
from __future__ import annotations

import argparse
import json
import math

import torch
import torch.nn.functional as F
from dicepipe.model import decode_kernels
from dicepipe.model.layer_parts import fp8_linear, quantize_rows
from dicepipe.model.masks import block_causal_mask
from dicepipe.model.shapes import SDAR_VOCAB, SHAPES


def graph_time_ms(fn, reps: int = 20) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / reps)
    return sorted(times)[2]


# (block_n, splits, num_warps, num_stages); each is one Triton build (~1 s), so few.
SWEEP = [(64, 1, 4, 2), (64, 1, 4, 3), (64, 1, 4, 4), (128, 1, 4, 3), (128, 1, 8, 3), (32, 1, 4, 4),
         (64, 2, 4, 3)]
CONFIGS = [{"block_n": n, "splits": s, "num_warps": w, "num_stages": st} for n, s, w, st in SWEEP]


# float8 caches: half the bytes per key, so also longer tiles (the same bytes per load)
SWEEP_FP8 = [(64, 1, 4, 3), (128, 1, 4, 3), (128, 1, 8, 3), (128, 1, 4, 4), (256, 1, 8, 3)]


def attention_rows(shape: str, batch: int, context: int, block: int = 4, sweep: bool = True,
                   kv_dtype: torch.dtype = torch.bfloat16) -> list[dict]:
    cfg = SHAPES[shape]
    hq, hkv, dim = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    max_len = context + 2 * block + 128
    gen = torch.Generator(device="cuda").manual_seed(0)
    keys = torch.randn(batch, hkv, max_len, dim, generator=gen, device="cuda", dtype=torch.bfloat16)
    values = torch.randn_like(keys)
    fp8 = kv_dtype != torch.bfloat16
    pad = (torch.randint(0, 32, (batch,), generator=gen, device="cuda") // block) * block
    out = []
    for q in (2 * block, block):
        start = context + 2 * block - q
        start_t = torch.tensor(start, device="cuda")
        key_len = math.ceil((start + q) / 128) * 128
        query = torch.randn(batch, q, hq, dim, generator=gen, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        visible = (start + q - pad).sum().item()
        gbytes = visible * hkv * dim * 2 * torch.empty((), dtype=kv_dtype).element_size() / 1e9
        mask = block_causal_mask(pad, start_t, q, key_len, block)
        group = hq // hkv
        folded = mask[:, :, None].expand(batch, 1, group, q, key_len).reshape(batch, 1, group * q, key_len)
        additive = torch.zeros(folded.shape, dtype=torch.bfloat16, device="cuda").masked_fill_(~folded, float("-inf"))
        fq = query.reshape(batch, hkv, group * q, dim)

        def sdpa():
            F.scaled_dot_product_attention(fq, keys[:, :, :key_len], values[:, :, :key_len], attn_mask=additive)

        row = {"shape": shape, "batch": batch, "context": context, "q": q, "gbytes": gbytes,
               "kv_dtype": str(kv_dtype).removeprefix("torch.")}
        if not fp8:
            ms = graph_time_ms(sdpa)
            row["sdpa_ms"], row["sdpa_gbs"] = ms, gbytes / ms * 1e3
        k_in, v_in = (keys.to(kv_dtype), values.to(kv_dtype)) if fp8 else (keys, values)
        ref = decode_kernels.decode_attention(query, keys, values, pad, start_t, block, 0.088, key_len)
        row["default"] = decode_kernels.default_config(batch, hkv, key_len, query.device)
        best = None
        sweep_configs = [{"block_n": n, "splits": s, "num_warps": w, "num_stages": st} for n, s, w, st in SWEEP_FP8] \
            if fp8 else (CONFIGS if sweep else CONFIGS[3:4])
        for config in sweep_configs + [row["default"]]:
            try:
                got = decode_kernels.decode_attention(query, k_in, v_in, pad, start_t, block, 0.088, key_len, config)
                err = float((got.float() - ref.float()).abs().max())
                ms = graph_time_ms(lambda: decode_kernels.decode_attention(
                    query, k_in, v_in, pad, start_t, block, 0.088, key_len, config))
            except Exception as exc:  # noqa: BLE001 (a config that does not build is reported)
                row.setdefault("errors", []).append(f"{config}: {type(exc).__name__}: {exc}"[:200])
                continue
            entry = {**config, "ms": ms, "gbs": gbytes / ms * 1e3, "max_diff_vs_default": err}
            row.setdefault("triton", []).append(entry)
            if best is None or ms < best["ms"]:
                best = entry
        row["best"] = best
        out.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "triton"}), flush=True)
    return out


def matmul_rows(shape: str, tokens_list=(512, 1024)) -> list[dict]:
    cfg = SHAPES[shape]
    h, inter, dim = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    nq, nkv = cfg["num_attention_heads"] * dim, cfg["num_key_value_heads"] * dim

    def w(n, k):
        return torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02

    wq, wk, wv, wo = w(nq, h), w(nkv, h), w(nkv, h), w(h, nq)
    wg, wu, wd = w(inter, h), w(inter, h), w(h, inter)
    wqkv, wgu = torch.cat([wq, wk, wv]), torch.cat([wg, wu])
    head = w(SDAR_VOCAB, h)
    rows = []
    for m in tokens_list:
        x, xi, xo = (torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for k in (h, inter, nq))
        layer_flop = 2 * m * h * (nq + 2 * nkv + nq + 3 * inter)
        sep = graph_time_ms(lambda: (F.linear(x, wq), F.linear(x, wk), F.linear(x, wv), F.linear(xo, wo),
                                     F.linear(x, wg), F.linear(x, wu), F.linear(xi, wd)))
        fused = graph_time_ms(lambda: (F.linear(x, wqkv), F.linear(xo, wo), F.linear(x, wgu), F.linear(xi, wd)))
        row = {"shape": shape, "tokens": m, "layer_separate_ms": sep, "layer_fused_ms": fused,
               "separate_tflops": layer_flop / sep / 1e9, "fused_tflops": layer_flop / fused / 1e9}
        # float8 (layer_parts.fp8_linear): eager (activation quantization as separate
        # kernels) and compiled (quantization fused into a kernel before each matmul, as in
        # the engine, where it also fuses with the norm or activation before it)
        q8 = [quantize_rows(t) for t in (wqkv, wo, wgu, wd)]

        def fp8_layer():
            return (fp8_linear(x, q8[0]), fp8_linear(xo, q8[1]), fp8_linear(x, q8[2]), fp8_linear(xi, q8[3]))

        compiled = torch.compile(fp8_layer)
        for name, fn in (("fp8_eager", fp8_layer), ("fp8_compiled", compiled)):
            try:
                ms = graph_time_ms(fn)
                row[f"layer_{name}_ms"], row[f"{name}_tflops"] = ms, layer_flop / ms / 1e9
            except Exception as exc:  # noqa: BLE001 (reported, the bf16 rows stand)
                row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:200]
        for part, fn, flop in (("qkv", lambda: F.linear(x, wqkv), 2 * m * h * (nq + 2 * nkv)),
                               ("o", lambda: F.linear(xo, wo), 2 * m * h * nq),
                               ("gate_up", lambda: F.linear(x, wgu), 4 * m * h * inter),
                               ("down", lambda: F.linear(xi, wd), 2 * m * h * inter)):
            ms = graph_time_ms(fn)
            row[f"{part}_ms"], row[f"{part}_tflops"] = ms, flop / ms / 1e9
        for n in (m // 2, m // 4, m // 8) if m >= 512 else ():
            xs = x[:n]
            row[f"lm_head_{n}_ms"] = graph_time_ms(lambda: F.linear(xs, head))
        row["lm_head_all_ms"] = graph_time_ms(lambda: F.linear(x, head))
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--attention", nargs="*", default=["4b:128", "1.7b:64", "1.7b:1"],
                        help="shape:batch pairs; the first gets the configuration sweep")
    parser.add_argument("--matmul", nargs="*", default=["4b", "1.7b"])
    parser.add_argument("--fp8-kv", action="store_true", help="also sweep a float8 cache for the first pair")
    args = parser.parse_args()
    results = {"attention": [], "matmul": []}
    for i, item in enumerate(args.attention):
        shape, batch = item.split(":")
        results["attention"] += attention_rows(shape, int(batch), args.context, sweep=i == 0)
        if i == 0 and args.fp8_kv:
            results["attention"] += attention_rows(shape, int(batch), args.context, kv_dtype=torch.float8_e4m3fn)
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=2)
    for shape in args.matmul:
        results["matmul"] += matmul_rows(shape, (256, 512, 1024) if shape == "4b" else (256, 512))
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
