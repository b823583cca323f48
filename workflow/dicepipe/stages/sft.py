"""`dicepipe sft`: supervised fine-tuning of a block-diffusion model on the CuKe sft split.

    dicepipe sft --scale tiny --data data/cuke/seed/sft.parquet \\
        --out models/sft/tiny --metrics metrics/sft/tiny

Several GPUs: set params.yaml `scales.<scale>.gpus`; the stage then starts itself again
under torchrun with that many ranks (FSDP, one GPU each; dicepipe.train.launch). A killed run
resumes from its last checkpoint under --work-dir when started again with the same
arguments, keeping every step's metrics (summary.json counts the whole run and notes the
resumes). The output folder is a transformers checkpoint (model, tokenizer, chat template)
plus block_diffusion.json; metrics are steps.tsv (per step) and summary.json.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)


def add_arguments(parser) -> None:
    from ..train.launch import add_training_arguments

    add_training_arguments(parser, {"--data": "sft split (parquet, SFT_SCHEMA)"},
                           out="output model folder",
                           metrics="metrics folder (steps.tsv, summary.json)",
                           steps="optimizer steps")
    parser.add_argument("--download", action="store_true",
                        help="allow downloading a hub checkpoint missing from the local cache")


def _load_model(spec: dict, name: str, prompts, responses, env):
    import torch

    from ..model.loading import load_model
    from ..model.tokenizer import train_tiny_tokenizer

    tokenizer = None
    if spec["kind"] == "tiny":
        texts = [text for pair in zip(prompts, responses) for text in pair]
        tokenizer = train_tiny_tokenizer(texts, spec["vocab_size"])
    loaded = load_model(spec, name, tokenizer=tokenizer, dtype=torch.float32, device="cpu")
    if loaded.settings.causal:
        from ..errors import ModelError

        raise ModelError(f"models.{name} is a causal model without a mask token; block-diffusion "
                         "SFT needs one. Set models." + name + ".mask_token_id.")
    return loaded


def run(args, params) -> int:
    from ..config import resolve_scale, stage_settings
    from ..data.schema import SFT_SCHEMA, read_table
    from ..errors import StageInputError
    from ..model.loading import resolve_checkpoint
    from ..train.data import prepare_sft_data
    from ..train.launch import relaunch_stage
    from ..train.parallel import init_distributed
    from ..train.sft import RunOptions, SFTPaths, run_sft

    scale = resolve_scale(params, args.scale)
    code = relaunch_stage(args, params)
    if code is not None:
        return code
    settings = stage_settings(params, "sft", scale=args.scale)
    spec = scale.model_spec
    if spec["kind"] != "tiny":  # fail before any work when the checkpoint is missing
        resolve_checkpoint(spec, scale.model, allow_download=args.download)
    table = read_table(args.data, SFT_SCHEMA)
    if table.num_rows == 0:
        raise StageInputError(f"{args.data}: no rows; the sft split is empty.")
    prompts = table.column("prompt").to_pylist()
    responses = table.column("response").to_pylist()
    env = init_distributed(args.device)
    loaded = _load_model(spec, scale.model, prompts, responses, env)
    data = prepare_sft_data(prompts, responses, loaded.tokenizer, loaded.settings, settings["cutoff_len"],
                            pack=settings["pack"])
    if not data.rows:
        raise StageInputError(f"{args.data}: every example is longer than cutoff_len "
                              f"{settings['cutoff_len']} (params.yaml sft.cutoff_len).")
    if env.is_main:
        log.info("sft %s: %d examples in %d rows on %s x%d", args.scale, len(data.examples),
                 len(data.rows), env.device, env.world_size)
    out = Path(args.out)
    paths = SFTPaths(out, Path(args.metrics), Path(args.work_dir) if args.work_dir else out.with_name(out.name + ".work"))
    options = RunOptions(stop_after_steps=args.stop_after_steps, keep_checkpoints=args.keep_checkpoints)
    summary = run_sft(loaded, data, settings, paths, env, options)
    if summary is not None and env.is_main:
        log.info("sft %s done: loss %s -> %s", args.scale, summary["loss_first"], summary["loss_final"])
    return 0
