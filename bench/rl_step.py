"""One RL step at a realistic size, timed part by part: 8 tasks x 8 rollouts x 1,024 new
tokens with 1.7B-shaped random weights (SDAR-1.7B's Qwen3 shape, model/shapes.py), split
into generation (bf16 copy of the policy, the Decoder, dynamic remasking at 0.9), scoring
and training (old log-probs + one PPO/KL update over all 64 traces in the trajectory layout).

A random model writes no kernels, so scoring uses a fixed set of real kernel files (the
augment `templates` author's CUDA files for the augment tasks), one per rollout, each with a
unique comment in its CUDA source so that every rollout builds, as distinct rollouts would;
they are scored through one HarnessSession while the next group decodes (the stage's
overlap), correctness only. Rewards alternate per rollout so every group is trained on.

Reference figures measured in the same run: the Decoder's own tokens/s on the same batch
(warm, no weight sync), and the harness session's rate on the same number of fresh kernels
alone (no decoding beside it).

    PYTHONPATH=workflow python3 bench/rl_step.py --out $OUT            # GPU, ~6-9 minutes
    PYTHONPATH=workflow python3 bench/rl_step.py --shape tiny --backend cpu --tasks 2 \\
        --group 2 --new-tokens 16 --out /tmp/rl_step                  # CPU smoke (~1 min)
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "workflow"))

from dicepipe.augment import generate_tasks
from dicepipe.augment.authors.templates import TemplateAuthor
from dicepipe.harness import HarnessSession, HarnessSettings, Job
from dicepipe.model.loading import LoadedModel
from dicepipe.model.settings import BlockSettings
from dicepipe.model.shapes import SDAR_MASK_ID, SHAPES, qwen3_config, random_qwen3
from dicepipe.train.parallel import init_distributed
from dicepipe.train.rl_rollout import RolloutModel, decode_settings, roll_out
from dicepipe.train.rl_tasks import Task
from dicepipe.train.rl_update import TraceScorer, build_policy, train_on_rollouts
from dicepipe.train.optim import make_adamw

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16}
log = logging.getLogger("rl_step")


class TextTokenizer:
    """Rollout text = the kernel file assigned to the rollout (fenced), ignoring the ids."""

    def __init__(self):
        self.files: list[str] = []
        self.next = 0

    def decode(self, ids, skip_special_tokens=True):
        text = "```python\n" + self.files[self.next % len(self.files)] + "\n```"
        self.next += 1
        return text


def kernel_files(params: dict, backend: str, count: int, nonce: str) -> list[tuple[str, str]]:
    """(reference, candidate) pairs from the templates author, each candidate's operator
    source made unique (a comment after its first #include) so it builds afresh."""
    settings = dict(params["augment"], max_tasks={})
    author = TemplateAuthor()
    pairs = []
    tasks = generate_tasks(settings, backend)
    for i in range(count):
        task = tasks[i % len(tasks)]
        code = author.write(task, 0).code.replace("#include <torch/extension.h>",
                                                 f"#include <torch/extension.h>\n// rollout {nonce}-{i}", 1)
        pairs.append((task.reference_code, code))
    return pairs


def settings_for(args) -> dict:
    params = yaml.safe_load(Path("params.yaml").read_text())
    s = {**params["rl"]["defaults"], **params["rl"]["stages"]["rl_e2e"], "stage": "bench"}
    s.update(tasks_per_step=args.tasks, group_size=args.group, max_new_tokens=args.new_tokens,
             rollout_groups_per_call=1, traces_per_update=args.tasks * args.group,
             micro_batch_traces=1, bf16=args.backend == "cuda", compile=args.backend == "cuda",
             activation_checkpointing=True)
    return params, s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--shape", choices=("1.7b", "tiny"), default="1.7b")
    parser.add_argument("--backend", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=1024)
    parser.add_argument("--prompt-tokens", type=int, default=768)
    parser.add_argument("--alone", type=int, default=0,
                        help="fresh kernels for the session's own rate (0: as many as the step's rollouts)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    params, s = settings_for(args)
    env = init_distributed("cuda" if args.backend == "cuda" else "cpu")
    shape = SHAPES["1.7b"] if args.shape == "1.7b" else TINY
    vocab = 151936 if args.shape == "1.7b" else 512
    mask_id = SDAR_MASK_ID if args.shape == "1.7b" else vocab - 1
    lm = random_qwen3(qwen3_config(shape, vocab_size=vocab), seed=0)
    block = BlockSettings(block_size=4, mask_token_id=mask_id, pad_token_id=0, stop_token_ids=(1,))
    tokenizer = TextTokenizer()
    loaded = LoadedModel(lm, tokenizer, block)
    gen = torch.Generator().manual_seed(0)
    groups = [(Task(f"t{i}", 1, "", ""), torch.randint(2, mask_id, (args.prompt_tokens + 37 * i,),
                                                        generator=gen).tolist()) for i in range(args.tasks)]
    rows = args.tasks * args.group
    nonce = uuid.uuid4().hex[:8]
    pairs = kernel_files(params, args.backend, rows + (args.alone or rows), nonce)
    tokenizer.files = [c for _, c in pairs[:rows]]
    refs = {c.strip(): r for r, c in pairs}
    harness = HarnessSettings.from_params(params["harness"])
    report = {"shape": args.shape, "tasks": args.tasks, "group": args.group, "new_tokens": args.new_tokens,
              "prompt_tokens": args.prompt_tokens}

    rollout = RolloutModel(lm, block, env, compile_layers=args.backend == "cuda")
    policy, bf16 = build_policy(lm, 4, s, env)
    scorer = TraceScorer(policy, s, block, env, bf16)
    optimizer = make_adamw(policy, s["learning_rate"], 0.0, fused=args.backend == "cuda")
    cfg = decode_settings(s)
    with HarnessSession(harness) as session:
        def reward(rollouts):
            jobs = [Job(f"{nonce}-{id(r)}", refs[r.code.strip()], r.code, args.backend) for r in rollouts]
            session.evaluate(jobs, progress=False, measure_speed=False)
            return [float(i % 2) for i in range(len(rollouts))]  # every group keeps a signal

        # the Decoder's own figure: the same batch, warm, nothing else running
        prompts = [ids for _, ids in groups for _ in range(args.group)]
        rollout.decoder.warm_up(prompts[: args.group], cfg)
        t0 = time.perf_counter()
        result = rollout.decoder.generate(prompts[: args.group], cfg)
        _sync(env)
        own_s = time.perf_counter() - t0
        own_tokens = sum(len(g.trace_ids) for g in result.generations)
        report["decoder_tokens_per_s"] = own_tokens / own_s

        # the step
        t_step = time.perf_counter()
        rollout.sync(policy)
        with ThreadPoolExecutor(max_workers=1) as pool:
            rollouts, times = roll_out(rollout, groups, group_size=args.group, groups_per_call=1, cfg=cfg,
                                       tokenizer=tokenizer, reward=reward, seed=0, scorer=pool)
        kept = [(r, 1.0 if i % 2 else -1.0) for i, r in enumerate(rollouts)]
        t0 = time.perf_counter()
        stats = train_on_rollouts(scorer, None, optimizer, kept, rollouts[0], s, env)
        _sync(env)
        train_s = time.perf_counter() - t0
        step_s = time.perf_counter() - t_step
        trained_tokens = sum(len(r.prompt_ids) + len(r.token_ids) for r in rollouts)
        report.update(step_s=step_s, generate_s=times.generate_s, score_s=times.score_s,
                      score_wait_s=times.score_wait_s, train_s=train_s, gen_tokens=times.tokens,
                      step_gen_tokens_per_s=times.tokens / times.generate_s,
                      scoring_jobs_per_s_in_step=rows / max(times.score_s, 1e-9),
                      train_tokens_per_s=trained_tokens / train_s, train_stats=stats)
        _write(out, report)  # kept if the rest of the run is cut short

        # the session's own rate on as many fresh kernels, nothing else running
        fresh = pairs[rows:]
        t0 = time.perf_counter()
        session.evaluate([Job(f"alone-{i}", r, c, args.backend) for i, (r, c) in enumerate(fresh)],
                         progress=False, measure_speed=False)
        report["session_jobs_per_s_alone"] = len(fresh) / (time.perf_counter() - t0)
    if args.backend == "cuda":
        report["peak_gpu_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    _write(out, report)
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0


def _write(out: Path, report: dict) -> None:
    (out / "rl_step.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")


def _sync(env) -> None:
    if env.device.type == "cuda":
        torch.cuda.synchronize()


if __name__ == "__main__":
    sys.exit(main())
