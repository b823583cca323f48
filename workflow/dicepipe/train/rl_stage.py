"""The edge both RL stage modules share (stages/rl_infill.py, stages/rl_e2e.py): arguments,
reading the input checkpoint and splits, the harness session and reward, then run_rl."""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)


def add_arguments(parser) -> None:
    parser.add_argument("--scale", required=True, help="scale name under params.yaml 'scales'")
    parser.add_argument("--model", required=True, help="input checkpoint folder (the previous stage's)")
    parser.add_argument("--data", required=True, help="training split (parquet)")
    parser.add_argument("--val", required=True, help="held-out validation split (parquet) for model selection")
    parser.add_argument("--out", required=True, help="output model folder (the selected checkpoint)")
    parser.add_argument("--metrics", required=True, help="metrics folder (steps.tsv, val.tsv, summary.json)")
    parser.add_argument("--work-dir", default=None,
                        help="checkpoints for resuming (default: <out>.work; removed after success)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--keep-checkpoints", action="store_true")
    parser.add_argument("--launch", choices=("auto", "torchrun"), default="auto",
                        help="auto: through torchrun when the scale's gpus > 1; torchrun: always")
    parser.add_argument("--stop-after-steps", type=int, default=None,
                        help="checkpoint and exit after this many steps (testing resume)")


def load_tasks(settings: dict, data: str, val: str, backend: str, params: dict | None = None):
    """(training tasks, validation tasks) for the stage's prompt kind and task source."""
    from ..data.schema import RL_E2E_SCHEMA, RL_INFILL_SCHEMA, VAL_SCHEMA, read_table
    from ..errors import StageInputError
    from .rl_tasks import tasks_from_released_json, tasks_from_split

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
    from ..harness import HarnessSettings

    settings = HarnessSettings.from_params(params["harness"])
    if env.distributed and env.device.type == "cuda":
        import dataclasses

        settings = dataclasses.replace(settings, devices=(env.local_rank,))
    return settings


def run_stage(args, params, stage: str) -> int:
    import torch

    from ..config import resolve_scale, stage_settings
    from ..harness import HarnessSession
    from ..harness.verdict import named_protocol
    from ..model.loading import load_saved
    from .parallel import init_distributed
    from .rl import RLPaths, RunOptions, run_rl
    from .rl_reward import KernelReward
    from .rl_tasks import encode_tasks

    from ..cluster import training_processes
    from .launch import relaunch_under_torchrun

    scale = resolve_scale(params, args.scale)
    code = relaunch_under_torchrun(args, training_processes(params, args.scale),
                                   force=getattr(args, "launch", "auto") == "torchrun")
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
        log.info("%s %s done: best step %s (validation reward %s), %d groups kept", stage, args.scale,
                 summary["best_step"], summary["best_val_reward"], summary["groups_kept_total"])
    return 0
