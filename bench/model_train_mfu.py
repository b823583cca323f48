"""One block-diffusion SFT step for the SDAR-1.7B shape (random weights, 2.03 B parameters)
at n = 4096 tokens per row (a 2x4096 = 8192-token [x_t | x_0] layout) on one GPU.

Variants, all through the same train step as `dicepipe sft` (train/sft.py: train_step):
  ours        decoder layers torch.compile'd, FlexAttention BlockMask, bf16 autocast,
              chunked output-layer loss on masked positions only, fused AdamW
  eager_flex  same but layers not compiled (stock transformers layers + compiled flex)
  dense_sdpa  layers not compiled, dense boolean mask through SDPA

FLOPs are counted exactly for what the step needs: every matmul of the decoder layers over
the doubled row (x3 for forward + backward), attention over the allowed (query, key) pairs
of the mask only, and the output layer over the masked positions actually computed. A
second figure counts the output layer over the whole noisy half (the issue's convention).

    PYTHONPATH=workflow python bench/model_train_mfu.py --out /tmp/train.json
"""

from __future__ import annotations

import argparse
import gc
import json
import time

import torch
from dicepipe.model.flops import sft_step_flops as step_flops
from dicepipe.model.layout import build_rows, make_train_batch
from dicepipe.model.masks import dense_block_diffusion_mask
from dicepipe.model.objective import BlockDiffusionLM
from dicepipe.model.shapes import SDAR_MASK_ID, SHAPES, count_parameters, qwen3_config, random_qwen3
from dicepipe.model.tokenizer import IGNORE_INDEX, SFTExample
from dicepipe.train.optim import make_adamw
from dicepipe.train.parallel import DistEnv, parallelize
from dicepipe.train.sft import train_step

VARIANTS = {"ours": (True, True), "eager_flex": (False, True), "dense_sdpa": (False, False)}


def make_batch(rows: int, n: int, prompt_len: int, vocab: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    examples = []
    for _ in range(rows):
        ids = torch.randint(0, 151643, (n,), generator=gen).tolist()
        labels = [IGNORE_INDEX] * prompt_len + ids[prompt_len:]
        examples.append([SFTExample(tuple(ids), tuple(labels))])
    packed = build_rows(examples, n, pad_token_id=151643)
    return make_train_batch(packed, SDAR_MASK_ID, 1e-3, gen)


def matmul_peak_tflops() -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    return 2 * 8192**3 * 20 / (time.perf_counter() - t0) / 1e12


def run_variant(name: str, config, batch, steps: int, warmup: int) -> dict:
    compile_layers, use_flex = VARIANTS[name]
    env = DistEnv(0, 1, 0, torch.device("cuda"))
    lm = random_qwen3(config, dtype=torch.float32, device="cuda")
    model = BlockDiffusionLM(lm, 4, compute_dtype=torch.bfloat16)
    model.train()
    parallelize(model, env, compile_layers=compile_layers, activation_checkpointing=False, bf16=True)
    optimizer = make_adamw(model, 1e-5, 0.0, fused=True)
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(warmup):
        train_step(model, optimizer, [batch], env=env, use_flex=use_flex, bf16=True, max_grad_norm=1.0)
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        stats = train_step(model, optimizer, [batch], env=env, use_flex=use_flex, bf16=True, max_grad_norm=1.0)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() / 2**30
    params = count_parameters(lm)
    del model, lm, optimizer
    gc.collect()
    torch.cuda.empty_cache()
    times.sort()
    return {"variant": name, "step_s_median": times[len(times) // 2], "step_s_min": times[0],
            "warmup_s": warm_s, "peak_gib": peak, "loss": stats["loss"], "parameters": params}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--shape", default="1.7b", choices=sorted(SHAPES))
    parser.add_argument("--n", type=int, default=4096, help="tokens per row before doubling")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--peak-tflops", type=float, default=780.0, help="bf16 matmul peak for MFU")
    args = parser.parse_args()
    config = qwen3_config(SHAPES[args.shape])
    measured_peak = matmul_peak_tflops()
    results = {"shape": args.shape, "n": args.n, "matmul_peak_tflops_measured": measured_peak,
               "mfu_reference_tflops": args.peak_tflops, "runs": []}
    for rows in args.batch:
        batch = make_batch(rows, args.n, 512, config.vocab_size, seed=rows).to("cuda")
        allowed = int(dense_block_diffusion_mask(batch.doc_ids, 4).sum())
        flops = step_flops(config, batch, allowed)
        for name in args.variants:
            try:
                run = run_variant(name, config, batch, args.steps, args.warmup)
            except Exception as exc:  # noqa: BLE001 (a failing variant must not hide the rest)
                run = {"variant": name, "error": f"{type(exc).__name__}: {exc}"[:500]}
                gc.collect()
                torch.cuda.empty_cache()
            run.update(batch=rows, layout_tokens=batch.input_ids.numel(), flops=flops,
                       masked_positions=int(batch.targets.numel()))
            if "step_s_median" in run:
                t = run["step_s_median"]
                run["tflops"] = flops["total"] / t / 1e12
                run["mfu"] = run["tflops"] / args.peak_tflops
                run["mfu_issue_convention"] = flops["total_issue_convention"] / t / 1e12 / args.peak_tflops
                run["tokens_per_s"] = rows * args.n / t
                run["layout_tokens_per_s"] = batch.input_ids.numel() / t
            results["runs"].append(run)
            print(json.dumps(run), flush=True)
            with open(args.out, "w") as fh:
                json.dump(results, fh, indent=2)
    print(f"\nmatmul peak measured {measured_peak:.0f} TFLOP/s; MFU against {args.peak_tflops:.0f}")
    print(f"{'batch':>5} {'variant':>11} {'step s':>7} {'MFU':>6} {'MFU*':>6} {'tok/s':>8} {'GiB':>6}")
    for run in results["runs"]:
        if "mfu" in run:
            print(f"{run['batch']:>5} {run['variant']:>11} {run['step_s_median']:>7.3f} {run['mfu']:>6.1%} "
                  f"{run['mfu_issue_convention']:>6.1%} {run['tokens_per_s']:>8.0f} {run['peak_gib']:>6.1f}")
        else:
            print(f"{run['batch']:>5} {run['variant']:>11} ERROR {run['error'][:80]}")


if __name__ == "__main__":
    main()
