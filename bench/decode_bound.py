"""How fast the headline decode workload of bench/model_decode.py could possibly run on one
GPU: its exact work (matmul FLOPs, KV-cache bytes read by attention) divided by the GPU's
peak rates, and by the rates our own parts reach in bench/model_decode_parts.py.

Workload (the issue's setting): batch B, prompts left-padded to P = 512 columns, N = 1024
new tokens, block 4, 4 static denoising steps per block, the finished block's KV write
fused with the next block's first step. So one prefill of B x P positions, then per block
one forward of 8 positions (4 for the first block) and three of 4; each forward reads every
row's visible keys/values once per layer (what the Triton kernel reads; mean left padding
of the prompts, 15.5, is excluded); the output layer runs at the still-masked positions
(4, 3, 2, 1 per row per block) and the last layer's output projection and MLP only there.
The small kernels between the matmuls (two RMS norms with the residual adds, the q/k
norm + RoPE + cache write, silu*mul) are counted by the bytes they must move, at the
HBM rate; sampling, launch gaps and copies are left out, so every bound is optimistic.

    PYTHONPATH=workflow python bench/decode_bound.py --shape 4b --batch 128 --measured 8386
    PYTHONPATH=workflow python bench/decode_bound.py --parts parts.json  # rates of a model_decode_parts run
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dicepipe.model.shapes import SDAR_VOCAB, SHAPES

# Rates. PEAK: the bf16 matmul peak measured in the same runs (772-794 TFLOP/s) and the
# HBM3e specification, 4.8 TB/s. MEASURED_4B: what our parts reach at 4B, batch 128 on
# the H200 (bench/README.md "Decoding", bench/model_decode_parts.py): a layer's
# fused matmuls at 512 / 1,024 tokens, decode attention at context 1,024 for 4 / 8 queries
# (GB/s of keys/values read), the output layer at 128-512 tokens; prefill attention
# (cuDNN, block-causal mask) from the profile: ~79 ms for 19 TFLOP of unmasked work.
PEAK = {"matmul_tflops": 780.0, "attention_gbs": 4800.0, "lm_head_tflops": 780.0, "prefill_attention_tflops": 780.0,
        "small_gbs": 4800.0}
MEASURED_4B = {"matmul_tflops": {512: 694.7, 1024: 669.6}, "attention_gbs": {4: 4073.0, 8: 3768.0},
               "lm_head_tflops": 560.0, "prefill_attention_tflops": 243.0, "small_gbs": 4800.0}


def workload(shape: str, batch: int, prompt: int = 512, new: int = 1024, block: int = 4,
             pad: float = 15.5) -> tuple[list[dict], int]:
    """Per forward: positions per row, matmul / output-layer / attention FLOPs, and the
    bytes of keys and values the decode attention reads; and the tokens generated."""
    cfg = SHAPES[shape]
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    dim, hq, hkv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    qkv = h * (hq + 2 * hkv) * dim
    rest = hq * dim * h + 3 * h * inter  # output projection and MLP
    kv_bytes_per_key = 2 * hkv * dim * 2 * layers  # keys and values, bf16, all layers
    plan = [(prompt, prompt, 0)]  # (positions per row, context end, logits positions per row)
    for j in range(new // block + 1):  # the prompt's last partial block, then N / 4 new ones
        end = prompt + (j + 1) * block
        plan += [(block if (step or j == 0) else 2 * block, end, block - step) for step in range(block)]
    forwards = []
    for q, end, logits in plan:
        keys = end - pad
        forwards.append({
            "q": q,
            # every position through every layer, less the last layer's output projection
            # and MLP where no logits are wanted
            "matmul_flop": 2 * batch * (q * layers * (qkv + rest) - (q - logits) * rest),
            "lm_head_flop": 2 * h * SDAR_VOCAB * batch * logits,
            "attention_flop": 4 * layers * batch * hq * q * keys * dim,
            "attention_bytes": kv_bytes_per_key * batch * keys,
            # per layer: 2 norms (read residual and update, write both), the q|k|v epilogue
            # (read the projection, write q, k, v), silu*mul (read gate|up, write the product)
            "small_bytes": 2 * batch * q * layers * (2 * 3 * h + 2 * (hq + 2 * hkv) * dim + 3 * inter)})
    return forwards, batch * new


def _pick(rate, key):
    return rate if isinstance(rate, float) else rate[min(rate, key=lambda k: abs(k - key))]


def bound(forwards: list[dict], rates: dict, batch: int) -> dict:
    prefill, decode = forwards[0], forwards[1:]
    matmul = sum(f["matmul_flop"] / (_pick(rates["matmul_tflops"], batch * f["q"]) * 1e12) for f in forwards)
    head = sum(f["lm_head_flop"] for f in forwards) / (rates["lm_head_tflops"] * 1e12)
    attention = prefill["attention_flop"] / (rates["prefill_attention_tflops"] * 1e12)
    attention += sum(f["attention_bytes"] / (_pick(rates["attention_gbs"], f["q"]) * 1e9) for f in decode)
    small = sum(f["small_bytes"] for f in forwards) / (rates["small_gbs"] * 1e9)
    return {"matmul_s": matmul + head, "attention_s": attention, "small_s": small,
            "serial_s": matmul + head + attention + small, "overlapped_s": max(matmul + head, attention) + small}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="4b")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--measured", type=float, default=None, help="measured tokens/s, for the ratio")
    parser.add_argument("--parts", default=None, help="a model_decode_parts.py JSON (4B, batch 128)")
    args = parser.parse_args()
    measured = dict(MEASURED_4B) if args.shape == "4b" or args.parts else None
    if args.parts:
        parts = json.loads(Path(args.parts).read_text())
        mm = {r["tokens"]: r["fused_tflops"] for r in parts["matmul"] if r["shape"] == args.shape}
        att = {r["q"]: r["best"]["gbs"] for r in parts["attention"]
               if r["shape"] == args.shape and r.get("kv_dtype", "bfloat16") == "bfloat16" and r.get("best")}
        measured.update(matmul_tflops={m: mm[m] for m in (512, 1024) if m in mm},
                        attention_gbs={4: att[4], 8: att[8]})
    forwards, tokens = workload(args.shape, args.batch)
    print(f"{args.shape}, batch {args.batch}: {len(forwards)} forwards, {tokens} tokens; "
          f"matmul {sum(f['matmul_flop'] for f in forwards) / 1e15:.2f} PFLOP, "
          f"output layer {sum(f['lm_head_flop'] for f in forwards) / 1e15:.2f} PFLOP, "
          f"decode attention reads {sum(f['attention_bytes'] for f in forwards[1:]) / 1e12:.1f} TB")
    rows = [("peak rates (780 TFLOP/s, 4.8 TB/s)", PEAK)]
    if measured is not None:  # the built-in part rates are the 4B ones
        rows.append(("our parts' measured rates", measured))
    print(f"{'rates':>36} {'matmul s':>9} {'attn s':>7} {'small s':>8} {'serial s':>9} {'tok/s':>7} "
          f"{'overlap tok/s':>14}")
    for name, rates in rows:
        b = bound(forwards, rates, args.batch)
        print(f"{name:>36} {b['matmul_s']:>9.2f} {b['attention_s']:>7.2f} {b['small_s']:>8.2f} {b['serial_s']:>9.2f} "
              f"{tokens / b['serial_s']:>7.0f} {tokens / b['overlapped_s']:>14.0f}")
    for name, rates in rows if args.measured else ():
        ceiling = tokens / bound(forwards, rates, args.batch)["serial_s"]
        print(f"measured {args.measured:.0f} tokens/s = {args.measured / ceiling:.0%} of the serial bound at {name}")


if __name__ == "__main__":
    main()
