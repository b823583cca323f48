"""A whole KernelBench level 1-3 evaluation on one GPU, in its two halves.

`folder`: the folder baseline with a known answer. For every problem of the parquet it
writes a ModelNew that is a copy of Model (KernelBench file naming), scores the folder
exactly as `dicepipe evaluate` scores a baseline (reference self-checks, then every kernel
against the eager reference timed beside it, in one harness session) and prints the wall
time and the counts. Expected: every problem loads and runs; each is correct under the plain
verdict with a speedup near 1; none is robust (no kernel of its own: flag_no_kernel).

`generate`: generation time of an 8B-shaped model with random weights (config.json of
SDAR-8B-Chat, its tokenizer and chat template) on one level's prompts, through the same
code path as the stage (model.generate.generate_texts: batches sorted by prompt length,
block diffusion, 4 denoising steps per block of 4, greedy, up to 4096 new tokens), then
extrapolated to the 250 tasks. Random weights rarely write an end-of-turn token, so rows
run to the token limit: the release's worst case, an upper bound for a trained model.

    PYTHONPATH=workflow python bench/evaluate_kernelbench.py folder \\
        --parquet .carry/kernelbench_levels_1-3.parquet --levels 1 --out $OUT/folder
    PYTHONPATH=workflow python bench/evaluate_kernelbench.py generate \\
        --parquet .carry/kernelbench_levels_1-3.parquet --model-dir .carry/sdar-8b-chat \\
        --level 1 --limit 64 --out $OUT/generate
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def _params() -> dict:
    from dicepipe.config import load_params

    return load_params(ROOT / "params.yaml")


def _tasks(parquet: Path, levels=(1, 2, 3)) -> list[dict]:
    from dicepipe.data.benchmark import load_benchmark

    spec = {"kind": "parquet", "path": str(parquet), "levels": list(levels), "version": "423217d"}
    return load_benchmark(spec).to_pylist()


def run_folder(args) -> dict:
    from dicepipe.evaluation.kernel_files import read_folder, write_reference_copies
    from dicepipe.evaluation.metrics import summarize
    from dicepipe.evaluation.report import task_columns, task_rows, write_csv
    from dicepipe.evaluation.scoring import score
    from kernelharness import HarnessSession, HarnessSettings
    from dicepipe.judgement import named_protocol

    params = _params()
    out = Path(args.out)
    tasks = _tasks(Path(args.parquet), args.levels)
    if args.limit:  # the first problems of each level (a smoke run)
        tasks = [t for level in args.levels for t in [t for t in tasks if t["level"] == level][: args.limit]]
    folder = out / "copies"
    write_reference_copies(tasks, folder)
    candidates = read_folder(folder, tasks, out)
    settings = HarnessSettings.from_params(params["harness"], repeats=args.repeats,
                                           decision_thresholds=params["evaluate"]["fast_p"])
    protocols = [named_protocol(n, params["protocols"]) for n in params["evaluate"]["protocols"]]
    start = time.perf_counter()
    with HarnessSession(settings) as session:
        records = score(session, tasks, candidates, args.backend, Path(args.resume_dir))
    wall_s = time.perf_counter() - start
    summary = summarize(records, "copies", protocols, params["evaluate"]["fast_p"], [1])
    write_csv(summary, out / "summary.csv")
    write_csv(task_rows(records, "copies", protocols), out / "tasks.csv", task_columns(protocols))
    return _folder_report(records, summary, wall_s)


def _folder_report(records, summary, wall_s: float) -> dict:
    from dicepipe.judgement import named_protocol, verdict

    kb = named_protocol("kernelbench")
    ran = [r for r in records if r["result"] and r["result"].get("compiled")]
    plain = [r for r in records if r["reference_ok"] and verdict(r["result"], protocol=kb, robust=False)]
    robust = [r for r in records if r["reference_ok"] and verdict(r["result"], protocol=kb, robust=True)]
    speedups = sorted(r["result"]["speedup_median"] for r in plain if r["result"].get("speedup_median"))
    far = [(r["task_id"], round(r["result"]["speedup_median"], 3)) for r in plain
           if r["result"].get("speedup_median") and abs(r["result"]["speedup_median"] - 1) > 0.05]
    failures = [(r["task_id"], (r["result"] or {}).get("error_phase"),
                 ((r["result"] or {}).get("error") or r["reference_error"] or "")[-300:])
                for r in records if r not in plain]

    def q(p):
        return round(speedups[min(len(speedups) - 1, int(p * len(speedups)))], 4) if speedups else None

    return {"tasks": len(records), "loaded_and_ran": len(ran), "correct_plain": len(plain),
            "correct_robust": len(robust),
            "reference_failed": sum(not r["reference_ok"] for r in records),
            "launch_bound": sum(bool(r["result"] and r["result"].get("launch_bound")) for r in records),
            "speedup_p5_median_p95": [q(0.05), q(0.5), q(0.95)],
            "speedup_geomean": (round(math.exp(statistics.fmean(math.log(s) for s in speedups)), 4)
                                if speedups else None),
            "off_by_more_than_5pct": far, "not_correct": failures, "wall_s": round(wall_s, 1),
            "summary_all": summary[-1]}


def run_generate(args) -> dict:
    import torch
    from dicepipe.config import stage_settings
    from dicepipe.data.prompts import end_to_end_prompt
    from dicepipe.model.generate import GenerationSettings, Generator, generate_texts
    from dicepipe.model.decode import Decoder, DecodeSettings
    from dicepipe.model.loading import qwen3_config_from_checkpoint
    from dicepipe.model.settings import BlockSettings
    from dicepipe.model.shapes import random_qwen3
    from dicepipe.model.tokenizer import chat_format, encode_prompts, stop_token_ids
    from transformers import AutoTokenizer

    params = _params()
    model_dir = Path(args.model_dir)
    config_dict = json.loads((model_dir / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False)
    start = time.perf_counter()
    cuda = args.device == "cuda"
    model = random_qwen3(qwen3_config_from_checkpoint(config_dict),
                         dtype=torch.bfloat16 if cuda else torch.float32, device=args.device)
    init_s = time.perf_counter() - start
    block = BlockSettings(block_size=int(config_dict["block_size"]),
                          mask_token_id=int(config_dict["mask_token_id"]),
                          pad_token_id=int(tokenizer.pad_token_id),
                          stop_token_ids=stop_token_ids(tokenizer, chat_format(tokenizer)))
    gen = Generator("block", model, tokenizer, block, Decoder(model, block, compile_layers=cuda))
    values = stage_settings(params, "evaluate", scale="8b")
    values.update({k: v for k, v in (("batch_size", args.batch_size),
                                     ("max_new_tokens", args.max_new_tokens)) if v})
    settings = GenerationSettings.from_params(values, "evaluate (8b)")
    tasks = [t for t in _tasks(Path(args.parquet)) if t["level"] == args.level][: args.limit]
    prompts = [end_to_end_prompt(t["reference_code"], "cuda") for t in tasks]
    ids = encode_prompts(tokenizer, None, prompts)
    cfg = DecodeSettings(max_new_tokens=settings.max_new_tokens, denoising_steps=settings.denoising_steps,
                         strategy=settings.strategy, top_k=1)
    start = time.perf_counter()
    gen.decoder.warm_up(sorted(ids, key=len)[-settings.batch_size:], cfg)  # compile + graph capture
    warm_s = time.perf_counter() - start
    start = time.perf_counter()
    outputs = generate_texts(gen, prompts, settings, progress=False)
    if cuda:
        torch.cuda.synchronize()
    gen_s = time.perf_counter() - start
    rows = [o for samples in outputs for o in samples]
    tokens = sum(o["new_tokens"] for o in rows)
    batches = math.ceil(len(rows) / settings.batch_size)
    all_tasks = len(_tasks(Path(args.parquet)))
    per_batch_s = gen_s / batches
    return {"model": "SDAR-8B shape, random bf16 weights", "level": args.level, "rows": len(rows),
            "batch_size": settings.batch_size, "batches": batches,
            "prompt_tokens_min_mean_max": [min(map(len, ids)), round(statistics.fmean(map(len, ids))),
                                           max(map(len, ids))],
            "max_new_tokens": settings.max_new_tokens, "new_tokens": tokens,
            "rows_stopped_early": sum(o["stopped"] for o in rows), "init_s": round(init_s, 1),
            "warm_up_s": round(warm_s, 1), "generate_s": round(gen_s, 1),
            "tokens_per_s": round(tokens / gen_s), "peak_memory_gb": round(torch.cuda.max_memory_allocated() / 1e9, 1) if cuda else None,
            "extrapolated_250_tasks_s": round(math.ceil(all_tasks / settings.batch_size) * per_batch_s
                                              + warm_s, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="part", required=True)
    folder = sub.add_parser("folder")
    folder.add_argument("--parquet", required=True)
    folder.add_argument("--out", required=True)
    folder.add_argument("--repeats", type=int, default=1,
                        help="harness repeats (copies sit at 1.0x, so every repeat runs)")
    folder.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3])
    folder.add_argument("--resume-dir", default=".cache/dicepipe/resume/bench_evaluate_kernelbench",
                        help="finished rows (outside $OUT: a later call resumes)")
    folder.add_argument("--backend", default="cuda", choices=("cuda", "cpu"))
    folder.add_argument("--limit", type=int, default=0, help="first N problems per level (0: all)")
    generate = sub.add_parser("generate")
    generate.add_argument("--parquet", required=True)
    generate.add_argument("--model-dir", required=True, help="config.json + tokenizer files")
    generate.add_argument("--out", required=True)
    generate.add_argument("--level", type=int, default=1)
    generate.add_argument("--limit", type=int, default=64)
    generate.add_argument("--batch-size", type=int, default=0, help="0: evaluate.defaults.batch_size")
    generate.add_argument("--max-new-tokens", type=int, default=0, help="0: evaluate.defaults")
    generate.add_argument("--device", default="cuda")
    args = parser.parse_args()
    report = run_folder(args) if args.part == "folder" else run_generate(args)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(yaml.safe_dump({k: v for k, v in report.items() if k not in ("not_correct", "summary_all")},
                         sort_keys=True))
    if report.get("not_correct"):
        print("not correct under the plain verdict:")
        for task_id, phase, error in report["not_correct"]:
            print(f"  {task_id} [{phase}] {error.strip().splitlines()[-1] if error.strip() else ''}")


if __name__ == "__main__":
    main()
