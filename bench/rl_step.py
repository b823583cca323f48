"""One RL step at a realistic size, timed part by part: by default 16 tasks x 16 rollouts x
2,048 new tokens with 1.7B-shaped random weights (SDAR-1.7B's Qwen3 shape, model/shapes.py),
split into generation (bf16 copy of the policy, the Decoder, dynamic remasking at 0.9, chunks of
`--groups-per-call` groups), scoring and training (old log-probs + one PPO/KL update over all
traces in the trajectory layout, the stage's own settings from params.yaml rl_e2e).

A random model writes no kernels, so scoring uses real kernel files (the augment `templates`
author's CUDA files for the augment tasks): `--kernels` distinct files (each made unique by a
comment in its CUDA source so it builds afresh), spread over the rollouts in turn, so the
step's scoring sees `--kernels` cold builds and copies for the rest, as a group whose rollouts
converge does. Scoring goes through the stage's own path: `KernelReward`-style `submit` of each
decoded chunk into one HarnessSession (`--scoring stream`, the default), or one blocking call
per chunk in a scoring thread (`--scoring per-call`, the stage before it streamed), correctness
only. Rewards alternate per rollout so every group is trained on.

Reference figures measured in the same run: the Decoder's own tokens/s on one chunk's batch
(warm, no weight sync, nothing beside it), and the harness session's rate on `--kernels` fresh
kernels alone (no decoding beside it; `--alone 0` skips it).

    PYTHONPATH=workflow python3 bench/rl_step.py --out $OUT --alone 0  # GPU, ~6 minutes (H200: a 295 s step)
    PYTHONPATH=workflow python3 bench/rl_step.py --out $OUT --harness-alone  # the harness alone, cold
    PYTHONPATH=workflow python3 bench/rl_step.py --shape tiny --backend cpu --tasks 2 \\
        --group 2 --new-tokens 16 --kernels 2 --out /tmp/rl_step      # CPU smoke (~1 min)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "workflow"))

from dicepipe.augment import generate_tasks
from dicepipe.augment.authors.templates import TemplateAuthor
from kernelharness import HarnessSession, HarnessSettings, Job
from dicepipe.model.settings import BlockSettings
from dicepipe.model.shapes import SDAR_MASK_ID, SHAPES, qwen3_config, random_qwen3
from dicepipe.train.parallel import init_distributed
from dicepipe.train.rl_rollout import RolloutModel, decode_settings, roll_out
from dicepipe.train.rl_tasks import Task
from dicepipe.train.rl_reward import when_all
from dicepipe.train.rl_update import EarlyLogprobs, TraceScorer, build_policy, train_on_rollouts
from dicepipe.train.optim import make_adamw

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16}
log = logging.getLogger("rl_step")
H200_PEAK_FLOPS = 780e12  # the bf16 matmul peak bench/model_train_mfu.py reports MFU against


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
             rollout_groups_per_call=args.groups_per_call, traces_per_update=args.tasks * args.group,
             bf16=args.backend == "cuda", compile=args.backend == "cuda")
    if args.backend == "cpu":
        s.update(activation_checkpointing=False)
    return params, s


class StepReward:
    """The stage's reward path with the bench's rewards: each chunk's kernels go to the
    session (`submit`: the stream; `__call__`: one blocking call, the old per-chunk way),
    rewards alternate 0/1 so every group is kept."""

    def __init__(self, session, refs: dict, backend: str, nonce: str):
        self.session, self.refs, self.backend, self.nonce = session, refs, backend, nonce
        self.calls = 0

    def _jobs(self, rollouts):
        self.calls += 1
        return [Job(f"{self.nonce}-{self.calls}-{i}", self.refs[r.code.strip()], r.code, self.backend)
                for i, r in enumerate(rollouts)]

    @staticmethod
    def _values(n):
        return [float(i % 2) for i in range(n)]

    def submit(self, rollouts) -> Future:
        futures = self.session.submit(self._jobs(rollouts), measure_speed=False)
        return when_all(dict(enumerate(futures)), lambda _i, _row: None,
                        lambda: self._values(len(rollouts)))


class PerCallReward(StepReward):
    def __call__(self, rollouts):
        self.session.evaluate(self._jobs(rollouts), progress=False, measure_speed=False)
        return self._values(len(rollouts))

    submit = None  # roll_out then scores chunk after chunk in its scoring thread


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--shape", choices=("1.7b", "tiny"), default="1.7b")
    parser.add_argument("--backend", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--group", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=2048)
    parser.add_argument("--prompt-tokens", type=int, default=768)
    parser.add_argument("--groups-per-call", type=int, default=8,
                        help="groups per Decoder call (params.yaml rl rollout_groups_per_call)")
    parser.add_argument("--kernels", type=int, default=64,
                        help="distinct kernel files over the step's rollouts (each a cold build)")
    parser.add_argument("--scoring", choices=("stream", "per-call"), default="stream")
    parser.add_argument("--alone", type=int, default=-1,
                        help="fresh kernels for the session's own rate (-1: --kernels; 0: skip)")
    parser.add_argument("--harness-alone", action="store_true",
                        help="no model and no step: the harness session alone, cold, on the "
                             "step's scoring work (tasks x group jobs over --kernels files)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    params, s = settings_for(args)
    if args.harness_alone:
        return harness_alone(args, params, out)
    env = init_distributed("cuda" if args.backend == "cuda" else "cpu")
    shape = SHAPES["1.7b"] if args.shape == "1.7b" else TINY
    vocab = 151936 if args.shape == "1.7b" else 512
    mask_id = SDAR_MASK_ID if args.shape == "1.7b" else vocab - 1
    lm = random_qwen3(qwen3_config(shape, vocab_size=vocab), seed=0)
    block = BlockSettings(block_size=4, mask_token_id=mask_id, pad_token_id=0, stop_token_ids=(1,))
    tokenizer = TextTokenizer()
    gen = torch.Generator().manual_seed(0)
    groups = [(Task(f"t{i}", 1, "", ""), torch.randint(2, mask_id, (args.prompt_tokens + 37 * i,),
                                                        generator=gen).tolist()) for i in range(args.tasks)]
    alone = args.kernels if args.alone < 0 else args.alone
    nonce = uuid.uuid4().hex[:8]
    pairs = kernel_files(params, args.backend, args.kernels + alone, nonce)
    tokenizer.files = [c for _, c in pairs[: args.kernels]]
    refs = {c.strip(): r for r, c in pairs}
    harness = HarnessSettings.from_params(params["harness"])
    chunk_rows = args.group * args.groups_per_call
    report = {"shape": args.shape, "tasks": args.tasks, "group": args.group, "new_tokens": args.new_tokens,
              "prompt_tokens": args.prompt_tokens, "groups_per_call": args.groups_per_call,
              "chunk_rows": chunk_rows, "kernels": args.kernels, "scoring": args.scoring,
              "cpu_count": os.cpu_count(), "build_workers": harness.num_build_workers(),
              "settings": {k: s[k] for k in ("micro_batch_traces", "pack_tokens", "activation_checkpointing", "compile",
                                             "traces_per_update") if k in s}}

    rollout = RolloutModel(lm, block, env, compile_layers=args.backend == "cuda")
    policy, bf16 = build_policy(lm, 4, s, env)
    scorer = TraceScorer(policy, s, block, env, bf16)
    optimizer = make_adamw(policy, s["learning_rate"], 0.0, fused=args.backend == "cuda")
    cfg = decode_settings(s)
    with HarnessSession(harness) as session:
        reward = (StepReward if args.scoring == "stream" else PerCallReward)(session, refs, args.backend, nonce)

        # the Decoder's own figure: one chunk's batch, warm, nothing else running
        prompts = [ids for _, ids in groups for _ in range(args.group)][:chunk_rows]
        rollout.decoder.warm_up(prompts, cfg)
        t0 = time.perf_counter()
        result = rollout.decoder.generate(prompts, cfg)
        _sync(env)
        own_s = time.perf_counter() - t0
        own_tokens = sum(len(g.trace_ids) for g in result.generations)
        report.update(decoder_alone_tokens_per_s=own_tokens / own_s, decoder_alone_rows=len(prompts))

        # the step
        t_step = time.perf_counter()
        rollout.sync(policy)
        early = EarlyLogprobs(scorer, None, s)  # as the stage: every group is kept here
        with ThreadPoolExecutor(max_workers=1) as pool:
            rollouts, times = roll_out(rollout, groups, group_size=args.group,
                                       groups_per_call=args.groups_per_call, cfg=cfg,
                                       tokenizer=tokenizer, reward=reward, seed=0, scorer=pool,
                                       on_scored=early.add)
        kept = [(r, 1.0 if i % 2 else -1.0) for i, r in enumerate(rollouts)]
        t0 = time.perf_counter()
        stats = train_on_rollouts(scorer, None, optimizer, kept, rollouts[0], s, env, early=early)
        _sync(env)
        train_s = time.perf_counter() - t0 + times.overlap_s
        step_s = time.perf_counter() - t_step
        trained_tokens = sum(len(r.prompt_ids) + len(r.token_ids) for r in rollouts)
        report.update(step_s=step_s, generate_s=times.generate_s, score_s=times.score_s,
                      score_wait_s=times.score_wait_s, overlap_s=times.overlap_s, train_s=train_s, gen_tokens=times.tokens,
                      step_gen_tokens_per_s=times.tokens / times.generate_s,
                      scoring_kernels_per_s_in_step=args.kernels / max(times.score_s, 1e-9),
                      train_trace_tokens_per_s=trained_tokens / train_s, train_stats=stats)
        report.update(train_flops(rollouts, s, block, lm.config, train_s, env))
        _write(out, report)  # kept if the rest of the run is cut short

        # the session's own rate on as many fresh kernels, nothing else running
        fresh = pairs[args.kernels:]
        if fresh:
            t0 = time.perf_counter()
            session.evaluate([Job(f"alone-{i}", r, c, args.backend) for i, (r, c) in enumerate(fresh)],
                             progress=False, measure_speed=False)
            report["session_kernels_per_s_alone"] = len(fresh) / (time.perf_counter() - t0)
    if args.backend == "cuda":
        report["peak_gpu_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    _write(out, report)
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0


def harness_alone(args, params: dict, out: Path) -> int:
    """What the step's scoring is held against: the same work (tasks x group jobs, the
    step's --kernels distinct files in turn, so copies as in the step) in one call of a
    fresh session with nothing beside it, from a cold build cache if the machine's is."""
    nonce = uuid.uuid4().hex[:8]
    pairs = kernel_files(params, args.backend, args.kernels, nonce)
    rows = args.tasks * args.group
    harness = HarnessSettings.from_params(params["harness"])
    with HarnessSession(harness) as session:  # workers start with the first call: timed
        t0 = time.perf_counter()
        table = session.evaluate([Job(f"alone-{i}", *pairs[i % len(pairs)], args.backend)
                                  for i in range(rows)], progress=False, measure_speed=False)
        wall = time.perf_counter() - t0
    compiled = sum(bool(v) for v in table.column("compiled").to_pylist())
    correct = sum(bool(v) for v in table.column("correct").to_pylist())
    report = {"mode": "harness-alone", "jobs": rows, "kernels": args.kernels,
              "cpu_count": os.cpu_count(), "build_workers": harness.num_build_workers(),
              "score_s": wall, "compiled": compiled,
              "correct": correct, "kernels_per_s": args.kernels / wall,
              "builds_per_min": 60 * args.kernels / wall}
    (out / "harness_alone.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0


def train_flops(rollouts, s, block, config, train_s, env) -> dict:
    """Exact FLOPs of the step's update (model/flops.py, as SFT's are counted) and the MFU
    against the H200's dense bf16 peak; {} where the counter is not available."""
    try:
        from dicepipe.train.rl_update import update_flops
    except ImportError:
        return {}
    flops = update_flops(rollouts, s, block, config)
    report = {"train_flops": flops}
    if env.device.type == "cuda":
        report["train_mfu"] = flops["total"] / train_s / H200_PEAK_FLOPS
    return report


def _write(out: Path, report: dict) -> None:
    (out / "rl_step.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")


def _sync(env) -> None:
    if env.device.type == "cuda":
        torch.cuda.synchronize()


if __name__ == "__main__":
    sys.exit(main())
