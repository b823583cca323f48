"""The RL loop (BiC-RL = TraceRL with execution rewards), one implementation for both stages.
Readable top to bottom: `run_rl` sets up and loops; `rl_step` is one step:

  choose tasks (rl_tasks.task_schedule) -> roll out groups from a decoding copy of the
  policy (rl_rollout), scoring each decoded chunk while the next decodes -> group-normalise
  rewards, drop groups without variance (rl_reward) -> old (and reference) log-probabilities
  of every kept trace in the trajectory layout (model/trace.py) -> PPO-clipped updates with
  the k3 KL (rl_loss), optimiser state kept across steps -> log.

Every `eval_every_steps` (and before the first step) the policy decodes the held-out
validation prompts greedily; the stage's output is the checkpoint with the best mean
validation reward (the latest among equals), and the metrics name its step.

A killed run resumes from its last checkpoint as the uninterrupted run would go on: the step
and validation logs keep the rows before it (train/metrics.py), the selection state (best
step, validation history, the best model's folder) is the one saved with that checkpoint,
and the summary counts the whole run, the resumes noted.
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from ..model.loading import LoadedModel, save_model
from . import checkpoint
from .data import stable_seed
from .interrupt import StopOnSigterm
from .metrics import RunProgress, StepLog, publish_logs, write_summary
from .optim import make_adamw
from .parallel import DistEnv, all_reduce_sum, barrier
from .rl_reward import Reward, group_advantages
from .rl_rollout import RolloutModel, decode_settings, device_copy, roll_out
from .rl_tasks import EncodedTasks, task_schedule
from .rl_update import EarlyLogprobs, TraceScorer, build_policy, train_on_rollouts

log = logging.getLogger(__name__)

STEP_COLUMNS = ("step", "tasks", "rollouts", "mean_reward", "groups", "groups_kept", "updates",
                "loss", "kl", "clip_fraction", "grad_norm", "learning_rate", "gen_tokens",
                "gen_tokens_per_s", "time_generate_s", "time_score_s", "time_score_wait_s",
                "time_train_s", "compiled", "compiled_wrong")
# compiled: share of rollouts whose kernel built; compiled_wrong: share that built and were
# judged wrong (the near misses the harness judges, beside unparsable text and no code).
VAL_COLUMNS = ("step", "val_reward", "val_tasks", "val_compiled")
VAL_SAMPLES = "val_samples.json"  # the greedy validation decodes before training and at the selected step
LOG_NAMES = ("steps.tsv", "val.tsv")  # written in the work folder, copied to metrics at the end


@dataclass(frozen=True)
class RLPaths:
    out_dir: Path  # the selected (best) checkpoint
    metrics_dir: Path  # steps.tsv, val.tsv (copied from work_dir at the end), summary.json
    work_dir: Path  # resumable checkpoints, the best models so far and the step logs


@dataclass(frozen=True)
class RunOptions:
    stop_after_steps: int | None = None  # checkpoint and leave early (resume tests)
    keep_checkpoints: bool = False




@dataclass
class RLRun:
    """What one stage's loop holds between steps."""

    loaded: LoadedModel
    tasks: EncodedTasks
    val: EncodedTasks
    reward: Reward
    settings: dict
    env: DistEnv
    scorer: TraceScorer
    ref_scorer: TraceScorer | None
    optimizer: torch.optim.Optimizer
    rollout: RolloutModel
    pool: ThreadPoolExecutor
    schedule: list[list[int]]


def choose_groups(run: RLRun, step: int) -> list[tuple]:
    """This rank's (task, prompt ids) groups of `step` (group g goes to rank g % world)."""
    chosen = run.schedule[step]
    return [(run.tasks.tasks[i], run.tasks.prompt_ids[i]) for g, i in enumerate(chosen)
            if g % run.env.world_size == run.env.rank]


def rl_step(run: RLRun, step: int) -> dict:
    s, env = run.settings, run.env
    if s["optimizer_reset"]:  # the release's fresh AdamW every step
        run.optimizer.state.clear()
    groups = choose_groups(run, step)
    run.rollout.sync(run.scorer.policy)
    # While later chunks still score, the old log-probabilities of the kept groups of those
    # already scored (they need the traces and this step's policy, no other reward); one
    # process only (FSDP ranks must run their forwards in step).
    early = None if env.distributed else EarlyLogprobs(run.scorer, run.ref_scorer, s)

    def on_scored(chunk):
        _adv, kept_chunk = group_advantages([r.reward for r in chunk], s["group_size"])
        early.add([r for i, r in enumerate(chunk) if kept_chunk[i // s["group_size"]]])

    rollouts, times = roll_out(run.rollout, groups, group_size=s["group_size"],
                               groups_per_call=s["rollout_groups_per_call"], cfg=decode_settings(s),
                               tokenizer=run.loaded.tokenizer, reward=run.reward,
                               seed=stable_seed(s["seed"], step, env.rank), scorer=run.pool,
                               on_scored=None if early is None else on_scored)
    advantages, kept_groups = group_advantages([r.reward for r in rollouts], s["group_size"])
    kept = [(r, a) for r, a in zip(rollouts, advantages) if kept_groups[r.group]]
    t0 = time.perf_counter()
    stats = train_on_rollouts(run.scorer, run.ref_scorer, run.optimizer, kept, rollouts[0], s, env,
                              early=early)
    train_s = time.perf_counter() - t0 + times.overlap_s
    built = [bool(r.info.get("compiled")) for r in rollouts]
    correct = [bool(r.info.get("correct")) for r in rollouts]
    counts = all_reduce_sum(torch.tensor([len(groups), sum(kept_groups), len(rollouts),
                                          sum(r.reward for r in rollouts), times.tokens, sum(built),
                                          sum(b and not c for b, c in zip(built, correct))],
                                         dtype=torch.float64, device=env.device), env)
    return {"step": step + 1, "tasks": int(counts[0]), "rollouts": int(counts[2]),
            "mean_reward": float(counts[3]) / max(float(counts[2]), 1.0), "groups": int(counts[0]),
            "groups_kept": int(counts[1]), **stats, "learning_rate": s["learning_rate"],
            "gen_tokens": int(counts[4]), "gen_tokens_per_s": times.tokens / max(times.generate_s, 1e-9),
            "time_generate_s": times.generate_s, "time_score_s": times.score_s,
            "time_score_wait_s": times.score_wait_s, "time_train_s": train_s,
            "compiled": float(counts[5]) / max(float(counts[2]), 1.0),
            "compiled_wrong": float(counts[6]) / max(float(counts[2]), 1.0)}


@dataclass
class Validation:
    reward: float | None  # mean reward (None without validation tasks)
    compiled: float | None  # share of decodes whose kernel built
    samples: list[dict]  # this rank's decodes: task, reward, compiled, correct, text


def validate(run: RLRun) -> Validation:
    """Greedy decodes of the validation prompts, scored (reward None without any)."""
    s, env = run.settings, run.env
    mine = [(t, ids) for i, (t, ids) in enumerate(zip(run.val.tasks, run.val.prompt_ids))
            if i % env.world_size == env.rank]
    if not run.val.tasks:
        return Validation(None, None, [])
    run.rollout.sync(run.scorer.policy)
    rollouts, _ = roll_out(run.rollout, mine, group_size=1, groups_per_call=s["val_tasks_per_call"],
                           cfg=decode_settings(s, greedy=True), tokenizer=run.loaded.tokenizer,
                           reward=run.reward, seed=s["seed"], scorer=run.pool)
    built = sum(bool(r.info.get("compiled")) for r in rollouts)
    total = all_reduce_sum(torch.tensor([sum(r.reward for r in rollouts), len(rollouts), built],
                                        dtype=torch.float64, device=env.device), env)
    samples = [{"task": r.task.task_id, "reward": r.reward, "compiled": bool(r.info.get("compiled")),
                "correct": bool(r.info.get("correct")), "text": r.text} for r in rollouts]
    return Validation(float(total[0]) / max(float(total[1]), 1.0),
                      float(total[2]) / max(float(total[1]), 1.0), samples)


def run_rl(loaded: LoadedModel, tasks: EncodedTasks, val: EncodedTasks, reward: Reward, settings: dict,
           paths: RLPaths, env: DistEnv, options: RunOptions = RunOptions()) -> dict | None:
    """Train; write the best checkpoint to paths.out_dir; return the summary (None if stopped)."""
    if not tasks.tasks:
        from ..errors import StageInputError

        raise StageInputError(f"no RL task has a prompt within max_prompt_tokens "
                              f"{settings['max_prompt_tokens']} ({tasks.dropped} dropped).")
    s = settings
    if s["tasks_per_step"] < env.world_size:
        from ..errors import ConfigError

        raise ConfigError(f"rl tasks_per_step {s['tasks_per_step']} is below the {env.world_size} "
                          "ranks; every rank needs at least one group per step.")
    fingerprint = run_fingerprint(s, tasks, val, loaded, env)
    rollout = RolloutModel(loaded.model, loaded.settings, env, compile_layers=s["rollout_compile"])
    ref = None
    if s["kl_reference"] == "frozen":
        # One process: the copy is made on the device, tensor by tensor, so the host never
        # holds a second fp32 model; FSDP shards a host module, so ranks copy on the host.
        source = (copy.deepcopy(loaded.model) if env.distributed
                  else device_copy(loaded.model, env.device, torch.float32))
        frozen, _ = build_policy(source, loaded.settings.block_size, s, env, trainable=False)
    policy, bf16 = build_policy(loaded.model, loaded.settings.block_size, s, env)
    scorer = TraceScorer(policy, s, loaded.settings, env, bf16)
    if s["kl_reference"] == "frozen":
        ref = TraceScorer(frozen, s, loaded.settings, env, bf16)
    optimizer = make_adamw(policy, s["learning_rate"], s["weight_decay"],
                           fused=env.device.type == "cuda" and not env.distributed)
    schedule = task_schedule(len(tasks.tasks), s["steps"], s["tasks_per_step"], s["curriculum_ramp_steps"],
                             s["seed"])
    checkpoint.claim_work_dir(paths.work_dir, fingerprint, env)
    start = checkpoint.restore_checkpoint(paths.work_dir, policy, optimizer, env)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="rl-score") as pool:
        run = RLRun(loaded, tasks, val, reward, s, env, scorer, ref, optimizer, rollout, pool, schedule)
        return _loop(run, paths, options, start, bf16)


def _loop(run: RLRun, paths: RLPaths, options: RunOptions, start: int, bf16: bool) -> dict | None:
    s, env = run.settings, run.env
    work = Path(paths.work_dir)
    saved = checkpoint.saved_progress(work) if start else {}
    progress = RunProgress(saved, start)
    # The logs live next to the checkpoints: both runners delete a failed job's outputs
    # (the metrics folder) before re-running it, and the summary counts every step's row.
    steps_log = StepLog(work / LOG_NAMES[0], start, env.is_main, STEP_COLUMNS)
    val_log = StepLog(work / LOG_NAMES[1], start, env.is_main, VAL_COLUMNS)
    best = _Best.from_state(saved.get("best"))
    if env.is_main:  # best models a killed run saved after its last checkpoint are not this run's
        best.prune(work)
    barrier(env)
    if start == 0:
        _select(run, paths, best, 0, val_log)
    bar = tqdm(range(start, s["steps"]), desc=f"rl {s['stage']}", disable=not env.is_main,
               initial=start, total=s["steps"])
    with StopOnSigterm(env) as term:
        for step in bar:
            done = step + 1
            with progress:  # the step and its validation
                row = rl_step(run, step)
                steps_log.write(row)
                if done % s["eval_every_steps"] == 0 or done == s["steps"]:
                    _select(run, paths, best, done, val_log)
            bar.set_postfix(reward=f"{row['mean_reward']:.3f}", kept=f"{row['groups_kept']}/{row['groups']}")
            if options.stop_after_steps is not None and done >= options.stop_after_steps:
                _save_checkpoint(run, work, done, progress, best)
                return None
            if done % s["save_every_steps"] == 0 and done < s["steps"]:
                _save_checkpoint(run, work, done, progress, best)
            if done < s["steps"] and term.requested():  # a time limit's SIGTERM
                if done % s["save_every_steps"] != 0:
                    _save_checkpoint(run, work, done, progress, best)
                raise term.stop(done, work)
    summary = _finish(run, paths, best, steps_log, progress, options)
    barrier(env)
    return summary


def _save_checkpoint(run: RLRun, work: Path, step: int, progress: RunProgress, best: _Best) -> None:
    """Weights and optimizer with the run's totals and selection state, which a resume from
    this step takes up; from here on only the best model of this step's state is kept."""
    best.checkpointed_step = best.step
    checkpoint.save_checkpoint(work, step, run.scorer.policy, run.optimizer, run.env,
                               progress=progress.state(best=best.state()))
    if run.env.is_main:
        best.prune(work)
    barrier(run.env)


@dataclass
class _Best:
    """The selection so far: the best step, its validation reward, every validation, and
    the step whose model the last checkpoint's selection names (kept until the next one)."""

    step: int = -1
    val_reward: float | None = None
    history: dict = field(default_factory=dict)
    checkpointed_step: int = -1

    @classmethod
    def from_state(cls, state: dict | None) -> _Best:
        if not state:
            return cls()
        return cls(state["step"], state["val_reward"], {int(k): v for k, v in state["history"].items()},
                   state["step"])

    def state(self) -> dict:
        return {"step": self.step, "val_reward": self.val_reward,
                "history": {str(k): v for k, v in sorted(self.history.items())}}

    @staticmethod
    def folder(work_dir: Path, step: int) -> Path:
        return Path(work_dir) / f"best-{step:08d}"

    def prune(self, work_dir: Path) -> None:
        """Remove the saved models that are neither the best nor a kept checkpoint's best
        (a damaged newest checkpoint falls back to the one before, with its best model)."""
        named = [self.step, self.checkpointed_step] + [
            p["best"]["step"] for p in checkpoint.kept_progress(work_dir) if p.get("best")]
        keep = {self.folder(work_dir, step).name for step in named}
        for folder in Path(work_dir).glob("best-*"):
            if folder.name not in keep:
                shutil.rmtree(folder, ignore_errors=True)


def _select(run: RLRun, paths: RLPaths, best: _Best, step: int, val_log: StepLog) -> None:
    """Validate at `step`; keep the model if it is at least as good as the best so far."""
    result = validate(run)
    value = result.reward
    best.history[step] = value
    val_log.write({"step": step, "val_reward": "" if value is None else value,
                   "val_tasks": len(run.val.tasks),
                   "val_compiled": "" if result.compiled is None else result.compiled})
    if run.env.is_main:  # kept beside the checkpoints until the run's end picks two
        path = _samples_file(paths.work_dir, step)
        path.with_suffix(".tmp").write_text(json.dumps(result.samples, indent=1) + "\n")
        path.with_suffix(".tmp").replace(path)
    better = best.step < 0 or (value is not None and (best.val_reward is None or value >= best.val_reward))
    if value is None:
        better = True  # no validation data: the latest model is the output
    if better:
        best.step, best.val_reward = step, value
        _save_model(run, _Best.folder(paths.work_dir, step))
        if run.env.is_main:
            best.prune(paths.work_dir)
    barrier(run.env)


def _samples_file(work_dir: Path, step: int) -> Path:
    return Path(work_dir) / f"val-samples-{step:08d}.json"


def _val_samples(work_dir: Path, best_step: int) -> dict:
    """The greedy validation decodes before the first step and at the selected one."""
    out = {}
    for key, step in (("before", 0), ("selected", best_step)):
        path = _samples_file(work_dir, step)
        out[key] = {"step": step, "samples": json.loads(path.read_text()) if path.is_file() else []}
    return out


def _save_model(run: RLRun, folder: Path) -> None:
    state = checkpoint.full_model_state(run.scorer.policy, run.env)
    if run.env.is_main:
        save_model(folder, run.loaded, state_dict=state,
                   dtype=torch.bfloat16 if run.settings["bf16"] else torch.float32)
    barrier(run.env)


def _finish(run: RLRun, paths: RLPaths, best: _Best, steps_log: StepLog, progress: RunProgress,
            options: RunOptions) -> dict:
    """The summary of the whole run (every step's row, the parts' times summed)."""
    rewards = steps_log.losses("mean_reward")
    kept = steps_log.losses("groups_kept")
    summary = {
        "stage": run.settings["stage"], "steps": run.settings["steps"],
        "best_step": best.step, "best_val_reward": best.val_reward,
        "val_rewards": {str(k): v for k, v in sorted(best.history.items())},
        "tasks": len(run.tasks.tasks), "prompts_dropped": run.tasks.dropped,
        "val_tasks": len(run.val.tasks), "val_prompts_dropped": run.val.dropped,
        "mean_reward_first": rewards[0] if rewards else None,
        "mean_reward_last": rewards[-1] if rewards else None,
        "groups_kept_total": int(sum(kept)),
        "updates_total": int(sum(steps_log.losses("updates"))),
        "val_reward_before": best.history.get(0),
        "steps_without_update": sum(1 for k in kept if k == 0),
        "train_time_s": round(progress.train_time_s, 3),  # steps and validations, every part
        **progress.resume_note(),
    }
    if summary["groups_kept_total"] == 0:
        summary["note"] = ("no group had rewards that differed, so the policy was never updated; "
                           "the output is the input checkpoint")
    if run.env.is_main:
        out = Path(paths.out_dir)
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(_Best.folder(paths.work_dir, best.step), out)
        publish_logs(paths.work_dir, paths.metrics_dir, LOG_NAMES)
        (Path(paths.metrics_dir) / VAL_SAMPLES).write_text(
            json.dumps(_val_samples(paths.work_dir, best.step), indent=1, sort_keys=True) + "\n")
        write_summary(paths.metrics_dir / "summary.json", summary)
        if not options.keep_checkpoints:
            shutil.rmtree(paths.work_dir, ignore_errors=True)
    return summary


def run_fingerprint(settings: dict, tasks: EncodedTasks, val: EncodedTasks, loaded: LoadedModel,
                    env: DistEnv) -> str:
    """What a checkpoint must match to be resumed (settings, tasks, model, ranks)."""
    import hashlib

    digest = hashlib.sha256()
    digest.update(json.dumps(settings, sort_keys=True).encode())
    digest.update(json.dumps([[t.task_id, ids] for t, ids in zip(tasks.tasks, tasks.prompt_ids)]).encode())
    digest.update(json.dumps([t.task_id for t in val.tasks]).encode())
    digest.update(loaded.model.config.to_json_string().encode())
    with torch.no_grad():  # the starting weights (a re-trained input checkpoint starts afresh)
        sums = [float(p.double().sum()) for p in loaded.model.parameters()]
    digest.update(json.dumps(sums).encode())
    digest.update(loaded.settings.to_json().encode())
    digest.update(str(env.world_size).encode())
    return digest.hexdigest()
