"""The SFT loop: block-diffusion objective, AdamW, gradient accumulation, checkpoints,
per-step metrics. Readable top to bottom: `run_sft` sets up, `train_step` is one optimizer
step over this rank's micro-batches. A killed run resumes from its last checkpoint with the
rows and totals of the steps before it (train/metrics.py), so its steps.tsv and summary
are those of the whole run, the resumes noted."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from ..model.loading import LoadedModel, save_model
from ..model.objective import BlockDiffusionLM
from . import checkpoint
from .data import SFTData, StepPlan, micro_batch, stable_seed
from .interrupt import StopOnSigterm
from .metrics import RunProgress, StepLog, publish_logs, write_summary
from .optim import lr_factor, make_adamw, set_lr, warmup_steps
from .parallel import DistEnv, all_reduce_mean, all_reduce_sum, barrier, parallelize

log = logging.getLogger(__name__)
STEPS_LOG = "steps.tsv"  # written in the work folder, copied to the metrics folder at the end


@dataclass(frozen=True)
class SFTPaths:
    out_dir: Path  # final HF folder
    metrics_dir: Path  # steps.tsv (copied from work_dir at the end), summary.json
    work_dir: Path  # resumable checkpoints and the step log (removed after success unless kept)


@dataclass(frozen=True)
class RunOptions:
    stop_after_steps: int | None = None  # leave early without the final save (resume tests)
    keep_checkpoints: bool = False


def with_defaults(settings: dict) -> dict:
    """`settings` over the schema's sft defaults (the one home of every default)."""
    from ..config import schema_defaults

    return {**schema_defaults("sft", "defaults"), **settings}


def build_trainable(loaded: LoadedModel, settings: dict, env: DistEnv):
    on_gpu = env.device.type == "cuda"
    bf16 = bool(settings["bf16"]) and on_gpu
    # fp32 master weights; under FSDP the shards move to the GPU as they are made.
    lm = loaded.model.float() if env.distributed else loaded.model.to(env.device).float()
    model = BlockDiffusionLM(lm, loaded.settings.block_size,
                             compute_dtype=torch.bfloat16 if bf16 else None)
    model.train()
    parallelize(model, env, compile_layers=bool(settings["compile"]) and on_gpu,
                activation_checkpointing=bool(settings["activation_checkpointing"]), bf16=bf16)
    optimizer = make_adamw(model, settings["learning_rate"], settings["weight_decay"],
                           fused=on_gpu and not env.distributed)
    return model, optimizer, bf16


def use_flex_attention(settings: dict, env: DistEnv) -> bool:
    choice = settings["attention"]
    return choice == "flex" or (choice == "auto" and env.device.type == "cuda")


def train_step(model, optimizer, batches, *, env: DistEnv, use_flex: bool, bf16: bool,
               max_grad_norm: float) -> dict:
    optimizer.zero_grad(set_to_none=True)
    loss_total = torch.zeros((), device=env.device)
    tokens = masked = 0
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    for i, batch in enumerate(batches):
        batch = batch.to(env.device)
        if hasattr(model, "set_requires_gradient_sync"):  # FSDP: reduce once per step
            model.set_requires_gradient_sync(i == len(batches) - 1)
        mask = model.attention_mask(batch.doc_ids, use_flex)
        with autocast:
            loss_sum = model(batch, mask)
        loss = loss_sum / max(batch.num_label_tokens, 1) / len(batches)
        loss.backward()
        loss_total += loss.detach()
        tokens += batch.num_tokens
        masked += int(batch.targets.numel())
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    if hasattr(grad_norm, "full_tensor"):
        grad_norm = grad_norm.full_tensor()
    optimizer.step()
    counts = all_reduce_sum(torch.tensor([tokens, masked], dtype=torch.float64, device=env.device), env)
    return {"loss": float(all_reduce_mean(loss_total, env)), "grad_norm": float(grad_norm),
            "tokens": int(counts[0]), "masked_tokens": int(counts[1])}


def run_sft(loaded: LoadedModel, data: SFTData, settings: dict, paths: SFTPaths, env: DistEnv,
            options: RunOptions = RunOptions()) -> dict | None:
    """Train, save the final model to paths.out_dir; returns the summary (None if stopped early)."""
    settings = with_defaults(settings)
    model, optimizer, bf16 = build_trainable(loaded, settings, env)
    plan = StepPlan(len(data.rows), settings["per_device_batch_size"], settings["grad_accum_steps"],
                    env.world_size, settings["epochs"], settings["seed"])
    warmup = warmup_steps(plan.total_steps, settings["warmup_ratio"])
    checkpoint.claim_work_dir(paths.work_dir, run_fingerprint(settings, data, loaded, env), env)
    start = checkpoint.restore_checkpoint(paths.work_dir, model, optimizer, env)
    progress = RunProgress(checkpoint.saved_progress(paths.work_dir) if start else {}, start)
    # next to the checkpoints: both runners delete the metrics folder of a failed job
    steps_log = StepLog(Path(paths.work_dir) / STEPS_LOG, start, enabled=env.is_main)
    use_flex = use_flex_attention(settings, env)
    fixed_shape = env.device.type == "cuda"
    bar = tqdm(range(start, plan.total_steps), desc="sft", disable=not env.is_main, initial=start,
               total=plan.total_steps)
    with StopOnSigterm(env) as term:
        for step in bar:
            lr = settings["learning_rate"] * lr_factor(step, plan.total_steps, warmup, settings["lr_schedule"])
            set_lr(optimizer, lr)
            batches = [micro_batch(data, rows, loaded.settings, settings["noise_eps"],
                                   stable_seed(settings["seed"], step // plan.steps_per_epoch, position),
                                   settings["cutoff_len"], fixed_shape)
                       for position, rows in plan.micro_batches(step, env.rank)]
            with progress:
                stats = train_step(model, optimizer, batches, env=env, use_flex=use_flex, bf16=bf16,
                                   max_grad_norm=settings["max_grad_norm"])
            progress.tokens += stats["tokens"]
            row = {"step": step + 1, "epoch": step // plan.steps_per_epoch + 1, "learning_rate": lr,
                   "tokens_per_s": stats["tokens"] / max(progress.last_s, 1e-9), **stats}
            if (step + 1) % settings["log_every_steps"] == 0 or step + 1 == plan.total_steps:
                steps_log.write(row)
            bar.set_postfix(loss=f"{stats['loss']:.4f}")
            done = step + 1
            if options.stop_after_steps is not None and done >= options.stop_after_steps:
                checkpoint.save_checkpoint(paths.work_dir, done, model, optimizer, env,
                                           progress=progress.state())
                return None
            if done % settings["save_every_steps"] == 0 and done < plan.total_steps:
                checkpoint.save_checkpoint(paths.work_dir, done, model, optimizer, env,
                                           progress=progress.state())
            if done < plan.total_steps and term.requested():  # a time limit's SIGTERM
                if done % settings["save_every_steps"] != 0:
                    checkpoint.save_checkpoint(paths.work_dir, done, model, optimizer, env,
                                               progress=progress.state())
                raise term.stop(done, paths.work_dir)
    _save_final(model, loaded, settings, paths, env, bf16)
    summary = _summary(steps_log, plan, data, progress, model)
    if env.is_main:
        publish_logs(paths.work_dir, paths.metrics_dir, (STEPS_LOG,))
        write_summary(paths.metrics_dir / "summary.json", summary)
        if not options.keep_checkpoints:
            import shutil

            shutil.rmtree(paths.work_dir, ignore_errors=True)
    barrier(env)
    return summary


def run_fingerprint(settings: dict, data: SFTData, loaded: LoadedModel, env: DistEnv) -> str:
    """What a checkpoint must match to be resumed: the settings, the data, the model's
    starting point and the number of ranks (a changed params.yaml starts afresh)."""
    import hashlib
    import json

    digest = hashlib.sha256()
    digest.update(json.dumps(settings, sort_keys=True).encode())
    digest.update(json.dumps([[ex.input_ids, ex.labels] for ex in data.examples]).encode())
    digest.update(json.dumps(data.rows).encode())
    digest.update(loaded.model.config.to_json_string().encode())
    digest.update(loaded.settings.to_json().encode())
    digest.update(str(env.world_size).encode())
    return digest.hexdigest()


def _save_final(model, loaded, settings, paths, env, bf16) -> None:
    state = checkpoint.full_model_state(model, env)
    if env.is_main:
        loaded.model.eval()
        save_model(paths.out_dir, loaded, state_dict=state,
                   dtype=torch.bfloat16 if settings["bf16"] else torch.float32)
    barrier(env)


def _summary(steps_log: StepLog, plan: StepPlan, data: SFTData, progress: RunProgress, model) -> dict:
    """Totals of the whole run: the log holds every step's row (the parts before a resume
    re-emitted), the time and tokens are summed over the parts."""
    losses = steps_log.losses()
    return {
        "steps": plan.total_steps,
        "epochs": plan.epochs,
        "examples": len(data.examples),
        "examples_dropped": data.dropped,
        "packed_rows": len(data.rows),
        "train_tokens_per_epoch": data.num_tokens,
        "loss_first": losses[0] if losses else None,
        "loss_final": losses[-1] if losses else None,
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_time_s": round(progress.train_time_s, 3),  # optimizer steps, every part of the run
        "tokens_per_s": round(progress.tokens / max(progress.train_time_s, 1e-9), 1),
        **progress.resume_note(),
    }
