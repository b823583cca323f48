"""Decoding throughput on one GPU with random SDAR-shaped models (bf16): block diffusion
(block 4, 4 denoising steps per block, static remasking, greedy) through `Decoder` (CUDA
graphs; optionally the per-token layer parts torch.compile'd; by default the Triton decode
attention, fused q|k|v and gate|up projections and the output layer at masked positions
only, the MLP + next-norm/projection boundary compiled as one graph, the prefill's parts
compiled ("all_parts_off" cases switch all of these off, "boundary_prefill_off" the last
two); "overlap" cases run forwards of >= N tokens as two half-batches on two CUDA streams;
"fp8_kv" cases keep the KV cache in float8 (changes numerics; their greedy tokens are
compared with the first default-dtype case of the same shape in the run: token_agreement);
"fp8_weights" cases run each layer's matmuls in float8 (also changes numerics; besides token
agreement they report the relative error of last-position prefill logits against the bf16
engine on 8 prompts, `logit_rel_err`, and how often the top token agrees there). Against the
straightforward loop (no CUDA graphs, separate KV-write forward per block) and the
autoregressive loop of the same engine. Stop tokens are off so every row writes all its
tokens: tokens/s = rows x new tokens / wall time of generate() (prefill included; graph
capture and compilation excluded by Decoder.warm_up on the same shapes).

    PYTHONPATH=workflow python bench/model_decode.py --out /tmp/decode.json
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from dataclasses import replace

import torch
from dicepipe.model.decode import Decoder, DecodeSettings
from dicepipe.model.settings import BlockSettings
from dicepipe.model.shapes import SDAR_MASK_ID, SHAPES, qwen3_config, random_qwen3


def _case(name, shape, batch, mode="block", new_tokens=1024, graphs=True, fused=True,
          temperature=0.0, strategy="static", compiled=False, attention="auto", proj=True,
          masked=True, prompt_len=None, boundary=True, prefill=True, overlap=None, kv=None,
          weights=None) -> dict:
    return {"name": name, "shape": shape, "batch": batch, "mode": mode, "new_tokens": new_tokens,
            "graphs": graphs, "fused": fused, "temperature": temperature, "strategy": strategy,
            "compiled": compiled, "attention": attention, "fuse_projections": proj,
            "masked_logits": masked, "prompt_len": prompt_len, "fuse_boundary": boundary,
            "compile_prefill": prefill, "overlap_min_tokens": overlap, "kv_cache": kv,
            "weights": weights}


def _all_parts_off(name, shape, batch, **kw) -> dict:
    """The first engine: SDPA over the key bucket, separate projections, full logits."""
    return _case(name, shape, batch, attention="sdpa", proj=False, masked=False, boundary=False,
                 prefill=False, overlap=None, **kw)


def _boundary_prefill_off(name, shape, batch, **kw) -> dict:
    """The engine of cases 0-9 as first measured: no boundary fusion, eager prefill, one
    stream."""
    return _case(name, shape, batch, boundary=False, prefill=False, overlap=None, **kw)


CASES = [
    # 0-9: Triton decode attention, fused projections, masked logits, against the first engine
    # (bench/README.md "Decoding"; docs/journal/2026-12-01-decoding.md)
    _case("diffusion_compiled", "4b", 128, compiled=True),
    _all_parts_off("diffusion_compiled_all_parts_off", "4b", 128, compiled=True),
    _case("diffusion_compiled", "1.7b", 64, compiled=True),
    _all_parts_off("diffusion_compiled_all_parts_off", "1.7b", 64, compiled=True),
    _case("diffusion_compiled", "1.7b", 1, compiled=True),
    _all_parts_off("diffusion_compiled_all_parts_off", "1.7b", 1, compiled=True),
    _case("autoregressive_compiled", "4b", 128, mode="ar", compiled=True),
    _case("diffusion_compiled_triton_only", "4b", 128, compiled=True, proj=False, masked=False),
    _case("diffusion_compiled_no_masked_logits", "4b", 128, compiled=True, masked=False),
    _case("diffusion_compiled_prompt256", "4b", 128, compiled=True, prompt_len=256),
    # 10-: the first engine's cases (now with the defaults above unless all_parts_off)
    _all_parts_off("straightforward_loop", "1.7b", 64, new_tokens=128, graphs=False, fused=False),
    _all_parts_off("straightforward_loop", "1.7b", 1, new_tokens=64, graphs=False, fused=False),
    _case("autoregressive_compiled", "1.7b", 64, mode="ar", compiled=True),
    _case("autoregressive_compiled", "1.7b", 1, mode="ar", compiled=True),
    _case("diffusion", "4b", 128),
    _case("diffusion", "1.7b", 64),
    _all_parts_off("autoregressive_compiled_all_parts_off", "4b", 128, mode="ar", compiled=True),
    _case("diffusion_sampled_t1", "1.7b", 64, temperature=1.0),
    _case("diffusion_dynamic", "1.7b", 64, strategy="dynamic"),
    _case("diffusion_unfused", "1.7b", 64, fused=False),
    _case("autoregressive", "4b", 128, mode="ar"),
    # 21-: the next engine (two-stream half batches, boundary fusion, compiled prefill)
    _boundary_prefill_off("diffusion_compiled_boundary_prefill_off", "4b", 128, compiled=True),
    _case("diffusion_compiled_one_stream", "4b", 128, compiled=True, overlap=None),
    _case("diffusion_compiled_one_stream", "1.7b", 64, compiled=True, overlap=None),
    _case("diffusion_compiled_overlap_all_forwards", "1.7b", 64, compiled=True, overlap=0),
    _case("diffusion_compiled_eager_prefill", "4b", 128, compiled=True, prefill=False),
    _case("diffusion_compiled_overlap_8_query_forward_only", "4b", 128, compiled=True, overlap=1024),
    _case("diffusion_compiled_overlap", "4b", 128, compiled=True, overlap=512),
    # 28-: optional float8 KV cache (changes numerics; agreement with case 0 reported)
    _case("diffusion_compiled_fp8_kv", "4b", 128, compiled=True, kv="float8_e4m3fn"),
    _case("diffusion_compiled_fp8_kv", "1.7b", 64, compiled=True, kv="float8_e4m3fn"),
    # 30-: optional float8 matmuls (changes numerics)
    _case("diffusion_compiled_fp8_weights", "4b", 128, compiled=True, weights="float8_e4m3fn"),
    _case("diffusion_compiled_fp8_weights_kv", "4b", 128, compiled=True, weights="float8_e4m3fn",
          kv="float8_e4m3fn"),
    _case("diffusion_compiled_fp8_weights", "1.7b", 64, compiled=True, weights="float8_e4m3fn"),
    _case("diffusion_compiled_fp8_weights", "1.7b", 1, compiled=True, weights="float8_e4m3fn"),
]


def prompts_for(batch: int, length: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(length - 31, length + 1, (batch,), generator=gen).tolist()
    return [torch.randint(0, 151643, (n,), generator=gen).tolist() for n in lengths]


def profile_generate(decoder, prompts, cfg, path: str) -> dict:
    """GPU time per kernel class over a short generate() (4 blocks after the prefill): where
    a forward's time goes, CUDA-graph replays included."""
    from torch.profiler import ProfilerActivity, profile

    short = replace(cfg, max_new_tokens=16)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        decoder.generate(prompts, short)
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    classes = {"matmul": ("gemm", "nvjet", "cutlass", "xmma", "sm90"), "attention": ("attend", "combine", "fmha", "attention"),
               "qkv_epilogue": ("qkv_epilogue",), "sampling": ("greedy", "sort", "scatter"), "inductor": ("triton_",)}
    totals = {"other": 0.0}
    rows = []
    for event in prof.key_averages():
        us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0.0)
        if not us or event.key.startswith("ProfilerStep"):
            continue
        rows.append((us, event.count, event.key))
        name = event.key.lower()
        label = next((k for k, keys in classes.items() if any(x in name for x in keys)), "other")
        totals[label] = totals.get(label, 0.0) + us / 1e3
    rows.sort(reverse=True)
    with open(path, "w") as fh:
        fh.write(f"wall {wall * 1e3:.1f} ms, forwards {decoder.engine.forwards}; totals (ms): {json.dumps(totals)}\n")
        for us, count, key in rows[:60]:
            fh.write(f"{us / 1e3:10.2f} ms {count:7d}  {key[:150]}\n")
    return {"profile_wall_ms": wall * 1e3, "profile_ms_by_class": totals}


def run_case(models: dict, case: dict, prompt_len: int, profile_path: str | None = None) -> dict:
    lm = models[case["shape"]]
    prompt_len = case["prompt_len"] or prompt_len
    causal = case["mode"] == "ar"
    settings = BlockSettings(block_size=1 if causal else 4, mask_token_id=None if causal else SDAR_MASK_ID,
                             pad_token_id=151643, stop_token_ids=(151645, 151643), causal=causal)
    graphs, batch = case["graphs"], case["batch"]
    decoder = Decoder(lm, settings, cuda_graphs=graphs, compile_layers=case["compiled"],
                      attention=case["attention"], fuse_projections=case["fuse_projections"],
                      masked_logits=case["masked_logits"], fuse_boundary=case["fuse_boundary"],
                      compile_prefill=case["compile_prefill"], overlap_min_tokens=case["overlap_min_tokens"],
                      kv_cache_dtype=getattr(torch, case["kv_cache"]) if case.get("kv_cache") else None,
                      weight_dtype=getattr(torch, case["weights"]) if case.get("weights") else None)
    cfg = DecodeSettings(max_new_tokens=case["new_tokens"], denoising_steps=4, strategy=case["strategy"],
                         temperature=case["temperature"], top_k=0, stop_at_end=False,
                         fuse_commit=case["fused"])
    prompts = prompts_for(batch, prompt_len, seed=batch)
    t0 = time.perf_counter()
    # kernels, allocator; the same prompts, so the compiled prefill sees one length only
    decoder.generate(prompts, replace(cfg, max_new_tokens=8))
    decoder.warm_up(prompts, cfg)  # captures (and compiles) every shape generate() will use
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    result = decoder.generate(prompts, cfg)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    tokens = sum(len(g.token_ids) for g in result.generations)
    out = {**case, "case": case["name"], "prompt_len": prompt_len, "wall_s": wall, "warmup_s": warm_s, "tokens": tokens,
           "tokens_per_s": tokens / wall, "forwards": result.forwards,
           "ms_per_forward": 1000 * wall / max(result.forwards, 1),
           "graphs_captured": len(decoder.engine.graphs) if decoder.engine else 0,
           "peak_gib": torch.cuda.max_memory_allocated() / 2**30}
    out["_tokens"] = [g.token_ids for g in result.generations]  # agreement between cases; not saved
    if case.get("weights") or case.get("kv_cache"):
        out.update(logit_error(lm, prompts[:8], decoder))
    if profile_path:
        try:
            out.update(profile_generate(decoder, prompts, cfg, profile_path))
        except Exception as exc:  # noqa: BLE001 (diagnostics only; keep the timing)
            out["profile_error"] = f"{type(exc).__name__}: {exc}"[:300]
    del decoder
    gc.collect()
    torch.cuda.empty_cache()
    return out


@torch.no_grad()
def logit_error(lm, prompts: list[list[int]], decoder: Decoder) -> dict:
    """Last-position logits of a prefill of `prompts` (cut to one length, no padding) by an
    engine with the decoder's weight and KV-cache dtypes against the bf16 engine."""
    from dicepipe.model.kv_engine import KVCacheEngine

    length = min(len(p) for p in prompts)
    tokens = torch.tensor([p[:length] for p in prompts], device="cuda")
    logits = []
    for weights, kv in ((None, None), (decoder.weight_dtype, decoder.kv_cache_dtype)):
        engine = KVCacheEngine(lm, 4, len(prompts), length + 128, attention="triton", weight_dtype=weights,
                               kv_dtype=kv)
        engine.begin(torch.zeros(len(prompts), dtype=torch.long))
        logits.append(engine.prefill(tokens, logits_last=1)[:, -1].float())
        del engine
    ref, got = logits
    return {"logit_rel_err": float((got - ref).norm() / ref.norm()),
            "logit_top1_agreement": float((got.argmax(-1) == ref.argmax(-1)).float().mean())}


def _agreement(earlier: list[dict], run: dict) -> None:
    """For a run with a non-default KV cache dtype: how far its greedy tokens agree with the
    first earlier default-dtype run of the same shape, batch and prompts."""
    if not (run.get("kv_cache") or run.get("weights")) or "_tokens" not in run:
        return
    ref = next((r for r in earlier if "_tokens" in r and not r.get("kv_cache") and not r.get("weights")
                and r["shape"] == run["shape"]
                and r["batch"] == run["batch"] and r["prompt_len"] == run["prompt_len"] and r["mode"] == run["mode"]), None)
    if ref is None:
        return
    same = total = 0
    first_diff = []
    for a, b in zip(ref["_tokens"], run["_tokens"]):
        pairs = list(zip(a, b))
        same += sum(x == y for x, y in pairs)
        total += len(pairs)
        first_diff.append(next((i for i, (x, y) in enumerate(pairs) if x != y), len(pairs)))
    run["agreement_vs"] = ref["case"]
    run["token_agreement"] = same / max(total, 1)
    run["rows_identical"] = sum(d == len(a) for d, a in zip(first_diff, ref["_tokens"])) / max(len(first_diff), 1)
    run["mean_first_divergence"] = sum(first_diff) / max(len(first_diff), 1)
    run["median_first_divergence"] = sorted(first_diff)[len(first_diff) // 2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--only", nargs="*", default=None, help="case indices to run, in this order")
    parser.add_argument("--profile", nargs="*", default=[], help="case indices to profile too (kernel times)")
    args = parser.parse_args()
    indices = range(len(CASES)) if args.only is None else [int(i) for i in args.only]  # in the order given
    results = {"prompt_len": args.prompt_len, "runs": []}
    models: dict = {}
    for index in indices:
        case = CASES[index]
        shape = case["shape"]
        if shape not in models:
            for key in list(models):  # one model on the GPU at a time
                del models[key]
            gc.collect()
            torch.cuda.empty_cache()
            models[shape] = random_qwen3(qwen3_config(SHAPES[shape]), dtype=torch.bfloat16, device="cuda")
        torch.cuda.reset_peak_memory_stats()
        try:
            profile_path = f"{args.out}.profile{index}.txt" if str(index) in args.profile else None
            run = run_case(models, case, args.prompt_len, profile_path)
        except Exception as exc:  # noqa: BLE001 (a failing case is reported, the rest still run)
            run = {"case": case["name"], "shape": shape, "batch": case["batch"], "error": f"{type(exc).__name__}: {exc}"[:500]}
            gc.collect()
            torch.cuda.empty_cache()
        _agreement(results["runs"], run)
        results["runs"].append(run)
        print(json.dumps({k: v for k, v in run.items() if k != "_tokens"}), flush=True)
        with open(args.out, "w") as fh:
            json.dump({**results, "runs": [{k: v for k, v in r.items() if k != "_tokens"} for r in results["runs"]]},
                      fh, indent=2)
    print(f"\n{'case':>36} {'shape':>5} {'batch':>5} {'tokens':>6} {'tok/s':>9} {'ms/fwd':>7} {'fwd':>5}")
    for run in results["runs"]:
        if "error" in run:
            print(f"{run['case']:>36} {run['shape']:>5} {run['batch']:>5} ERROR {run['error'][:70]}")
        else:
            print(f"{run['case']:>36} {run['shape']:>5} {run['batch']:>5} {run['tokens']:>6} "
                  f"{run['tokens_per_s']:>9.0f} {run['ms_per_forward']:>7.2f} {run['forwards']:>5}")


if __name__ == "__main__":
    main()
