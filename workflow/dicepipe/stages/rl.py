"""The BiC-RL stages, rl_infill and rl_e2e (stages/rl_infill.py and stages/rl_e2e.py name the
stage and its CLI subcommand): arguments, reading the input checkpoint and splits, the harness
session and reward, then train/rl.py's run_rl.

Settings: params.yaml `rl` (defaults, stages.<stage>, overrides.<scale>). Several GPUs:
`torchrun --nproc_per_node 8 -m dicepipe.cli rl-infill ...` (FSDP). A killed run resumes
from its last step under --work-dir. The output is the step with the best validation reward
(metrics/<stage>/<scale>/summary.json names it).
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)


def add_arguments(parser) -> None:
    from ..train.launch import add_training_arguments

    add_training_arguments(
        parser,
        {"--model": "input checkpoint folder (the previous stage's)",
         "--data": "training split (parquet)",
         "--val": "held-out validation split (parquet) for model selection"},
        out="output model folder (the selected checkpoint)",
        metrics="metrics folder (steps.tsv, val.tsv, summary.json)")


def load_tasks(settings: dict, data: str, val: str, backend: str, params: dict | None = None):
    """(training tasks, validation tasks) for the stage's prompt kind and task source."""
    from ..data.schema import RL_E2E_SCHEMA, RL_INFILL_SCHEMA, VAL_SCHEMA, read_table
    from ..errors import StageInputError
    from ..train.rl_tasks import tasks_from_released_json, tasks_from_split

    kind = settings["prompt"]
    if settings["source"] == "released":
        if kind != "e2e":
            raise StageInputError("params.yaml rl: source 'released' holds end-to-end tasks only; "
                                  f"stage {settings['stage']} uses {kind!r} prompts. Use source: split.")
        tasks = tasks_from_released_json(settings["released_path"], backend,
                                         settings["released_prompt"], params)
    else:
        schema = RL_INFILL_SCHEMA if kind == "infill" else RL_E2E_SCHEMA
        tasks = tasks_from_split(read_table(data, schema).to_pylist(), kind, backend)
    if not tasks:
        raise StageInputError(f"{data}: no RL tasks; the {settings['stage']} split is empty.")
    val_tasks = tasks_from_split(read_table(val, VAL_SCHEMA).to_pylist(), kind, backend)
    if settings["val_tasks"]:
        val_tasks = val_tasks[: settings["val_tasks"]]
    return tasks, val_tasks


def harness_settings(params: dict, env):
    """The stage's session: on several ranks each rank's harness uses its own GPU only."""
    from kernelharness import HarnessSettings

    settings = HarnessSettings.from_params(params["harness"])
    if env.distributed and env.device.type == "cuda":
        import dataclasses

        settings = dataclasses.replace(settings, devices=(env.local_rank,))
    return settings


def run_stage(args, params, stage: str) -> int:
    import torch

    from ..config import resolve_scale, stage_settings
    from kernelharness import HarnessSession
    from ..judgement import named_protocol
    from ..model.loading import load_saved
    from ..model.manifest import check_model_folder
    from ..train.launch import relaunch_stage
    from ..train.parallel import init_distributed
    from ..train.rl import RLPaths, RunOptions, run_rl
    from ..train.rl_reward import KernelReward
    from ..train.rl_tasks import encode_tasks

    scale = resolve_scale(params, args.scale)
    check_model_folder(Path(args.model))  # a damaged input stops here, naming the stage that writes it
    code = relaunch_stage(args, params)
    if code is not None:
        return code
    settings = {**stage_settings(params, "rl", stage=stage, scale=args.scale), "stage": stage}
    tasks, val_tasks = load_tasks(settings, args.data, args.val, scale.backend, params)
    env = init_distributed(args.device)
    loaded = load_saved(args.model, dtype=torch.float32, device="cpu")
    encoded = encode_tasks(tasks, loaded.tokenizer, settings["max_prompt_tokens"])
    val = encode_tasks(val_tasks, loaded.tokenizer, settings["max_prompt_tokens"])
    if env.is_main:
        log.info("%s %s: %d tasks (%d prompts over %d tokens dropped), %d validation, on %s x%d", stage,
                 args.scale, len(encoded.tasks), encoded.dropped, settings["max_prompt_tokens"],
                 len(val.tasks), env.device, env.world_size)
    protocol = named_protocol(settings["protocol"], params["protocols"])
    out = Path(args.out)
    paths = RLPaths(out, Path(args.metrics),
                    Path(args.work_dir) if args.work_dir else out.with_name(out.name + ".work"))
    options = RunOptions(stop_after_steps=args.stop_after_steps, keep_checkpoints=args.keep_checkpoints)
    with HarnessSession(harness_settings(params, env)) as session:
        reward = KernelReward(session, protocol, robust=settings["robust"], backend=scale.backend,
                              latency_weight=settings["latency_weight"],
                              latency_cap_speedup=settings["latency_cap_speedup"])
        summary = run_rl(loaded, encoded, val, reward, settings, paths, env, options)
    if summary is not None and env.is_main:
        log.info("%s %s done: best step %s (validation reward %s), %d groups kept; %d rollouts "
                 "rejected before any build (no code, unparsable, statically flagged)", stage, args.scale,
                 summary["best_step"], summary["best_val_reward"], summary["groups_kept_total"],
                 reward.skipped)
    return 0
