"""The RL update alone (bench/README.md "BiC-RL step and the build cut", row U): old
log-probabilities + one PPO/KL update over a step's traces, through the stage's own
`train_on_rollouts` (train/rl_update.py), on synthetic traces, unpacked (`pack_tokens` 0: one
trace per row and micro-batch, the release's shape) and packed (`pack_tokens` N: rows of N
trajectory-layout tokens, one per micro-batch) in the same run, with the same policy module.

Traces as the Decoder writes them at the RL defaults: prompts of 768-1,027 random tokens,
generations of new_tokens/2 to new_tokens tokens (`--full-length`: all new_tokens), through
the end of their last block; block 4, 4 denoising steps, dynamic remasking. `--steps-per-block
4` (default) commits one token per step in every block, as the random-weight model of
bench/rl_step.py does at threshold 0.9 (the layout's worst case: 4 noisy copies per block);
`mixed` draws 1-4 steps per block (a confident model commits several tokens at once).

Settings: params.yaml rl defaults + rl_e2e (bf16, compiled layers, activation checkpointing,
kl_reference pre_update), one optimiser update over all traces (traces_per_update = traces),
fused AdamW. Each mode runs `--warmup` passes (compiling its shapes) then `--repeats` timed
passes (median). FLOPs are exact (model/flops.py, the convention of bench/model_train_mfu.py):
decoder matmuls over the real layout positions (noisy copies included, padding excluded),
attention over the mask's allowed pairs, the output layer at the scored tokens; old
log-probabilities 1x forward, the update 3x (forward + backward). MFU = those FLOPs / time /
peak; HFU adds what is computed twice (the layers' forward again under activation
checkpointing, the output layer's logits in token_logprobs' backward). Trace tokens/s counts
prompts + generations (bench/rl_step.py's "training" rate); layout tokens/s counts the real
layout positions. The SFT figure: bench/model_train_mfu.py's own `run_variant("ours")` at the
same shape (2 x 4096-token rows), in the same process after the RL modes (`--no-sft` skips it;
CPU skips it).

One H200 (torch 2.11.0+cu130), 64 traces of 3,548-6,096 layout tokens, MFU against 989 TFLOP/s
(x 989/780 for model_train_mfu.py's default peak), the default command: unpacked 16.1 s a
pass (6,652 trace tokens/s, 24.4%), packed at 16,384 12.3 s (8,728 tokens/s, 32.0%; HFU
40.0%), SFT 43.9% in the same run; with `--activation-checkpointing off` packed 9.55 s
(11,221 tokens/s, 41.1%; the update's forward + backward alone runs at SFT's rate per FLOP).

    PYTHONPATH=workflow python3 bench/rl_train_mfu.py --out $OUT/rl_train.json          # one H200, < 4 min
    PYTHONPATH=workflow python3 bench/rl_train_mfu.py --shape tiny --device cpu \\
        --out /tmp/rl_train.json                                                          # CPU smoke, < 1 min
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import yaml

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "workflow"))

from dicepipe.model.settings import BlockSettings
from dicepipe.model.shapes import SDAR_MASK_ID, SHAPES, qwen3_config, random_qwen3
from dicepipe.model.trace import Trace, trace_length
from dicepipe.train import rl_update
from dicepipe.train.optim import make_adamw
from dicepipe.train.parallel import init_distributed
from dicepipe.train.rl_update import TraceScorer, build_policy, train_on_rollouts, update_flops

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16}  # as bench/rl_step.py
H200_DENSE_BF16_TFLOPS = 989.0
BLOCK = 4


def synthetic_rollouts(count: int, new_tokens: int, prompt_range: tuple[int, int], steps_per_block: str,
                       full_length: bool, mask_id: int, denoising_steps: int = 4, seed: int = 0) -> list:
    gen = torch.Generator().manual_seed(seed)
    out, lo_gen = [], new_tokens if full_length else max(1, new_tokens // 2)
    for _ in range(count):
        prompt_len = int(torch.randint(prompt_range[0], prompt_range[1] + 1, (1,), generator=gen))
        n_gen = int(torch.randint(lo_gen, new_tokens + 1, (1,), generator=gen))
        end = -(-(prompt_len + n_gen) // BLOCK) * BLOCK  # through the end of the last block
        steps, base = [], 0
        for b in range(prompt_len // BLOCK, end // BLOCK):
            positions = (b + 1) * BLOCK - max(b * BLOCK, prompt_len)
            most = min(denoising_steps, positions)
            k = most if steps_per_block == "4" else int(torch.randint(1, most + 1, (1,), generator=gen))
            local = torch.randperm(positions, generator=gen).tolist()
            steps += [base + (i if i < k else int(torch.randint(0, k, (1,), generator=gen))) for i in local]
            base += k
        out.append(SimpleNamespace(prompt_ids=torch.randint(2, mask_id, (prompt_len,), generator=gen).tolist(),
                                   token_ids=torch.randint(2, mask_id, (end - prompt_len,), generator=gen).tolist(),
                                   steps=steps))
    return out


def settings_for(args, device: str) -> dict:
    params = yaml.safe_load((BENCH.parent / "params.yaml").read_text())
    s = {**params["rl"]["defaults"], **params["rl"]["stages"]["rl_e2e"], "stage": "bench"}
    on_gpu = device == "cuda"
    s.update(max_new_tokens=args.new_tokens, traces_per_update=args.traces, bf16=on_gpu, compile=on_gpu,
             kl_reference="pre_update")
    if not on_gpu:
        s.update(activation_checkpointing=False)
    return s


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run_mode(name: str, pack_tokens: int, policy, optimizer, rollouts, s: dict, block, env, bf16: bool,
             config, args, peak_flops: float) -> dict:
    s = {**s, "pack_tokens": pack_tokens}
    scorer = TraceScorer(policy, s, block, env, bf16)
    device = env.device.type
    shapes, phases = [], {"prepare_s": 0.0, "old_logprobs_s": 0.0}
    prepare, logprobs = scorer.prepare, rl_update._logprobs

    timing = [False]  # phases: a sync around each part (only in the extra `--phases` pass)

    def timed(fn, key):
        def call(*a):
            if not timing[0]:
                return fn(*a)
            _sync(device)
            t0 = time.perf_counter()
            value = fn(*a)
            _sync(device)
            phases[key] += time.perf_counter() - t0
            return value
        return call

    def recording_prepare(rows):
        prepared = timed(prepare, "prepare_s")(rows)
        shapes.append((tuple(prepared.batch.input_ids.shape), len(rows)))
        return prepared

    scorer.prepare = recording_prepare
    rl_update._logprobs = timed(logprobs, "old_logprobs_s")  # the module's own, for this mode
    kept = [(r, 1.0 if i % 2 else -1.0) for i, r in enumerate(rollouts)]
    warm = []
    for _ in range(args.warmup):
        _sync(device)
        t0 = time.perf_counter()
        train_on_rollouts(scorer, None, optimizer, kept, rollouts[0], s, env)
        _sync(device)
        warm.append(time.perf_counter() - t0)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    shapes.clear()
    times = []
    for _ in range(args.repeats):
        _sync(device)
        t0 = time.perf_counter()
        stats = train_on_rollouts(scorer, None, optimizer, kept, rollouts[0], s, env)
        _sync(device)
        times.append(time.perf_counter() - t0)
    per_pass = shapes[: len(shapes) // args.repeats]
    if args.phases:
        timing[0] = True
        _sync(device)
        t0 = time.perf_counter()
        train_on_rollouts(scorer, None, optimizer, kept, rollouts[0], s, env)
        _sync(device)
        phases["pass_s"] = time.perf_counter() - t0
    rl_update._logprobs = logprobs
    t = statistics.median(times)
    flops = update_flops(rollouts, s, block, config)
    trace_tokens = sum(len(r.prompt_ids) + len(r.token_ids) for r in rollouts)
    layout_tokens = flops["forward"]["tokens"]
    padded = sum(shape[0] * shape[1] for shape, _ in per_pass)
    result = {"mode": name, "pack_tokens": pack_tokens, "micro_batch_traces": s["micro_batch_traces"],
              "activation_checkpointing": bool(s["activation_checkpointing"]), "pass_s_median": t,
              "pass_s": times, "warmup_s": warm, "trace_tokens": trace_tokens, "layout_tokens": layout_tokens,
              "padded_layout_tokens": padded, "padding_fraction": 1 - layout_tokens / padded,
              "micro_batches": len(per_pass), "rows": sum(shape[0] for shape, _ in per_pass),
              "distinct_shapes": sorted({shape for shape, _ in per_pass}),
              "traces_per_row": layout_tokens and len(rollouts) / sum(shape[0] for shape, _ in per_pass),
              "trace_tokens_per_s": trace_tokens / t, "layout_tokens_per_s": layout_tokens / t,
              "flops": {k: v for k, v in flops.items() if k != "forward"}, "forward_counts": flops["forward"],
              "tflops": flops["total"] / t / 1e12, "mfu": flops["total"] / t / peak_flops,
              "hfu": flops["total_with_recompute"] / t / peak_flops,
              "loss": stats["loss"], "updates": stats["updates"],
              # `--phases`: one more pass, synchronised around each part (so nothing overlaps)
              "phases": phases if args.phases else None}
    if device == "cuda":
        result["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return result


def run_sft(config, peak_flops: float, rows: int = 2, n: int = 4096) -> dict:
    """bench/model_train_mfu.py's own "ours" variant at the same shape."""
    sys.path.insert(0, str(BENCH))
    import model_train_mfu as sft
    from dicepipe.model.masks import dense_block_diffusion_mask

    batch = sft.make_batch(rows, n, 512, config.vocab_size, seed=rows).to("cuda")
    allowed = int(dense_block_diffusion_mask(batch.doc_ids, BLOCK).sum())
    flops = sft.step_flops(config, batch, allowed)
    run = sft.run_variant("ours", config, batch, steps=3, warmup=2)
    t = run["step_s_median"]
    return {"batch": rows, "n": n, "step_s_median": t, "warmup_s": run["warmup_s"], "peak_gib": run["peak_gib"],
            "tokens_per_s": rows * n / t, "layout_tokens_per_s": batch.input_ids.numel() / t,
            "tflops": flops["total"] / t / 1e12, "mfu": flops["total"] / t / peak_flops}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--shape", default="1.7b", choices=sorted(SHAPES) + ["tiny"])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--traces", type=int, default=None, help="default 64 (cuda), 8 (cpu)")
    parser.add_argument("--new-tokens", type=int, default=None, help="default 1024 (cuda), 64 (cpu)")
    parser.add_argument("--prompt-tokens", type=int, nargs=2, default=(768, 1027), metavar=("MIN", "MAX"))
    parser.add_argument("--full-length", action="store_true", help="every generation new_tokens long")
    parser.add_argument("--steps-per-block", choices=("4", "mixed"), default="4")
    parser.add_argument("--pack-tokens", type=int, nargs="+", default=None,
                        help="packed mode's row budgets, a run each (default: params.yaml rl pack_tokens; cpu 4096)")
    parser.add_argument("--activation-checkpointing", choices=("on", "off"), default=None,
                        help="default: params.yaml (on; off on cpu)")
    parser.add_argument("--modes", nargs="+", default=["unpacked", "packed"], choices=("unpacked", "packed"))
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--no-sft", action="store_true")
    parser.add_argument("--phases", action="store_true",
                        help="one more pass per mode timing layout building and old log-probs apart")
    parser.add_argument("--peak-tflops", type=float, default=H200_DENSE_BF16_TFLOPS,
                        help="dense bf16 peak for MFU (the H200's 989; model_train_mfu.py's default is 780)")
    args = parser.parse_args()
    cuda = args.device == "cuda"
    args.traces = args.traces or (64 if cuda else 8)
    args.new_tokens = args.new_tokens or (1024 if cuda else 64)
    peak = args.peak_tflops * 1e12
    t_start = time.perf_counter()

    env = init_distributed(args.device)
    shape = TINY if args.shape == "tiny" else SHAPES[args.shape]
    vocab = 512 if args.shape == "tiny" else 151936
    mask_id = vocab - 1 if args.shape == "tiny" else SDAR_MASK_ID
    config = qwen3_config(shape, vocab_size=vocab)
    s = settings_for(args, args.device)
    packs = args.pack_tokens or [s["pack_tokens"] if cuda else 4096]
    if args.activation_checkpointing:
        s["activation_checkpointing"] = args.activation_checkpointing == "on"
    block = BlockSettings(block_size=BLOCK, mask_token_id=mask_id, pad_token_id=0, stop_token_ids=(1,))
    rollouts = synthetic_rollouts(args.traces, args.new_tokens, tuple(args.prompt_tokens), args.steps_per_block,
                                  args.full_length, mask_id, s["denoising_steps"])
    lm = random_qwen3(config, seed=0, device=args.device)
    policy, bf16 = build_policy(lm, BLOCK, s, env)
    optimizer = make_adamw(policy, s["learning_rate"], 0.0, fused=cuda)
    lengths = [trace_length(Trace(tuple(r.prompt_ids), tuple(r.token_ids), tuple(r.steps)), BLOCK) for r in rollouts]
    report = {"shape": args.shape, "device": args.device, "traces": args.traces, "new_tokens": args.new_tokens,
              "prompt_tokens": list(args.prompt_tokens), "steps_per_block": args.steps_per_block,
              "full_length": args.full_length, "peak_tflops": args.peak_tflops,
              "layout_length_min_mean_max": [min(lengths), sum(lengths) / len(lengths), max(lengths)],
              "torch": torch.__version__, "modes": []}
    if cuda:
        report["gpu"] = torch.cuda.get_device_name()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    runs = [(name, budget) for name in args.modes for budget in ([0] if name == "unpacked" else packs)]
    for name, budget in runs:
        result = run_mode(name, budget, policy, optimizer, rollouts, s, block, env, bf16, config, args, peak)
        report["modes"].append(result)
        print(json.dumps(result), flush=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
    del policy, optimizer, lm
    gc.collect()
    if cuda and not args.no_sft and args.shape != "tiny":
        torch.cuda.empty_cache()
        try:
            report["sft"] = run_sft(config, peak)
        except Exception as exc:  # noqa: BLE001 (the RL figures stand without it)
            report["sft"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    else:
        report["sft"] = {"skipped": "needs CUDA and a real shape" if not args.no_sft else "--no-sft"}
    report["wall_s"] = time.perf_counter() - t_start
    out.write_text(json.dumps(report, indent=2) + "\n")

    print(f"\n{args.shape} on {args.device}, {args.traces} traces, layout {lengths and min(lengths)}-"
          f"{max(lengths)} tokens; MFU against {args.peak_tflops:.0f} TFLOP/s")
    print(f"activation checkpointing {'on' if s['activation_checkpointing'] else 'off'}")
    print(f"{'mode':>9} {'pack':>6} {'pass s':>7} {'warm s':>7} {'trace tok/s':>11} {'layout tok/s':>12} "
          f"{'MFU':>6} {'HFU':>6} {'pad':>5} {'rows':>5} {'shapes':>6} {'GiB':>5}")
    for m in report["modes"]:
        print(f"{m['mode']:>9} {m['pack_tokens']:>6} {m['pass_s_median']:>7.2f} {sum(m['warmup_s']):>7.1f} "
              f"{m['trace_tokens_per_s']:>11.0f} {m['layout_tokens_per_s']:>12.0f} {m['mfu']:>6.1%} "
              f"{m['hfu']:>6.1%} {m['padding_fraction']:>5.1%} {m['rows']:>5} {len(m['distinct_shapes']):>6} "
              f"{m.get('peak_gib', 0):>5.1f}")
        if m["phases"]:
            p = m["phases"]
            print(f"{'':>9} phases (synchronised pass of {p['pass_s']:.2f} s): building layouts and masks "
                  f"{p['prepare_s']:.2f} s, old log-probs {p['old_logprobs_s']:.2f} s, update "
                  f"{p['pass_s'] - p['prepare_s'] - p['old_logprobs_s']:.2f} s")
    sft = report["sft"]
    if "mfu" in sft:
        print(f"      SFT (model_train_mfu ours, {sft['batch']}x{sft['n']}): {sft['step_s_median']:.3f} s/step, "
              f"{sft['tokens_per_s']:.0f} tokens/s, MFU {sft['mfu']:.1%}")
        for m in report["modes"]:
            print(f"      {m['mode']}: {m['mfu'] / sft['mfu']:.2f}x SFT's MFU")
    else:
        print(f"      SFT: {sft}")
    print(f"wall {report['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
