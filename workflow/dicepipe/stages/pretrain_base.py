"""`dicepipe pretrain-base`: make the tiny scale's base model (a command, not a pipeline stage).

The real scales start from a released chat model that already writes code (SDAR-Chat); the
tiny scale starts from this: a small Qwen3-shaped block-diffusion model (params.yaml
`models.tiny-init`), with a byte-level BPE tokenizer trained on its data, pretrained with the
same block-diffusion objective and loop as SFT (train/sft.py) on generated elementwise
chains (data/chains.py) in both of the project's prompt forms, end-to-end and infilling. The
pretraining chains never include a corpus chain (`--corpus` is read and excluded by its
steps and constants), and none is a benchmark task (tests/test_tiny_data.py checks both).

    dicepipe pretrain-base --out data/base/tiny

writes a checkpoint folder (`save_model`: weights, tokenizer, chat template,
block_diffusion.json) and PRETRAINED.json (per run: the command, the recipe, the data's
digest, the losses, the device), deterministic for the same arguments on the same torch
build. `--init FOLDER` continues from another base's weights and tokenizer, and its record
lists that base's runs first (the shipped base is two GPU runs, the second from the first's
weights: data/base/tiny/PRETRAINED.json). `--write-corpus DIR`
writes the shipped corpus (reference/ and kernels/ of `corpus_chains`) instead.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shlex
from pathlib import Path

log = logging.getLogger(__name__)

# The recipe, recorded in PRETRAINED.json; every value has a flag.
RECIPE = {
    "chains": 1200,         # distinct pretraining chains
    "infill_share": 0.5,    # share of examples in the infilling prompt form
    "max_chain_steps": 4,   # longest pretraining chain (the corpus's are 3-4 steps)
    "named_steps": False,   # steps named x1, x2, ... (data/chains.py); the shipped corpus is in place
    "chain_seed": 0,
    "corpus_count": 20,
    "corpus_seed": 0,
    "epochs": 2,
    "learning_rate": 3.0e-3,
    "batch_size": 8,
    "cutoff_len": 1536,
    "seed": 0,
}


def add_arguments(parser) -> None:
    parser.add_argument("--out", required=True, help="checkpoint folder (or corpus folder with --write-corpus)")
    parser.add_argument("--model", default="tiny-init", help="params.yaml models.<name> of kind tiny (architecture)")
    parser.add_argument("--write-corpus", action="store_true",
                        help="write the shipped corpus of elementwise chains to --out instead")
    parser.add_argument("--work-dir", default=None, help="checkpoints for resuming (default: <out>.work)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where to train (the shipped base was trained on a GPU: PRETRAINED.json)")
    parser.add_argument("--init", default=None,
                        help="start from this saved model (its weights and tokenizer) instead of "
                             "a random tiny-init")
    parser.add_argument("--backend", choices=("cpu", "cuda"), default="cpu",
                        help="--write-corpus: the kernels' form (C++ with OpenMP, or CUDA at the "
                             "larger CUDA shapes: data/chains.py)")
    parser.add_argument("--exclude-base", default=None,
                        help="--write-corpus: leave out every chain this saved base was "
                             "pretrained on (its PRETRAINED.json recipes) and the seed corpus, so "
                             "the corpus is held out from that base")
    parser.add_argument("--stop-after-steps", type=int, default=None, help=argparse.SUPPRESS)
    for key, value in RECIPE.items():
        if isinstance(value, bool):
            parser.add_argument("--" + key.replace("_", "-"), action="store_true", default=value)
        else:
            parser.add_argument("--" + key.replace("_", "-"), type=type(value), default=value)


def base_chain_keys(base: Path) -> set[tuple]:
    """The keys of every chain a saved base was pretrained on (each run's recipe in its
    PRETRAINED.json regenerates its chains) and of the seed corpus those runs excluded."""
    from ..data.chains import chain_key, corpus_chains, pretraining_chains
    from ..errors import ConfigError

    record = base / "PRETRAINED.json"
    if not record.is_file():
        raise ConfigError(f"--exclude-base {base}: no PRETRAINED.json there (a base made by "
                          "`dicepipe pretrain-base` records the recipes its chains are drawn from).")
    keys: set[tuple] = set()
    for stage in json.loads(record.read_text())["stages"]:
        recipe = {**RECIPE, **stage["recipe"]}
        corpus = {chain_key(c) for c in corpus_chains(recipe["corpus_count"], recipe["corpus_seed"])}
        keys |= corpus
        keys |= {chain_key(c) for c in pretraining_chains(recipe["chains"], recipe["chain_seed"], corpus,
                                                          recipe["max_chain_steps"])}
    return keys


def write_corpus(out: Path, count: int, seed: int, named: bool = False, backend: str = "cpu",
                 exclude_base: str | None = None) -> list[str]:
    """reference/<name>.py, kernels/<name>.py and meta.yaml for `corpus_chains(count, seed)`
    (kernels in `backend`'s form; none of `exclude_base`'s pretraining chains)."""
    import yaml

    from ..data.chains import corpus_chains

    exclude = base_chain_keys(Path(exclude_base)) if exclude_base else set()
    chains = corpus_chains(count, seed, backend=backend, exclude=exclude)
    for sub in ("reference", "kernels"):
        (out / sub).mkdir(parents=True, exist_ok=True)
        for old in (out / sub).glob("*.py"):
            old.unlink()
    meta = {}
    for chain in chains:
        (out / "reference" / f"{chain.name}.py").write_text(chain.reference(named))
        (out / "kernels" / f"{chain.name}.py").write_text(chain.kernel(named, backend))
        meta[chain.name] = {"level": chain.level, "note": " -> ".join(s.op for s in chain.steps)}
    flags = (f"{' --named-steps' if named else ''}{' --backend ' + backend if backend != 'cpu' else ''}"
             f"{' --exclude-base ' + Path(exclude_base).as_posix() if exclude_base else ''}")
    header = (f"# Generated by `dicepipe pretrain-base --write-corpus --out {out.as_posix()} "
              f"--corpus-count {count} --corpus-seed {seed}{flags}` "
              "(data/chains.py); do not edit by hand.\n")
    (out / "meta.yaml").write_text(header + yaml.safe_dump(meta, sort_keys=True))
    return [c.name for c in chains]


def pretraining_pairs(recipe: dict) -> list[tuple[str, str]]:
    """(prompt, response) pairs of the pretraining data, in training order."""
    import random

    from ..data import prompts
    from ..data.chains import chain_key, corpus_chains, pretraining_chains
    from ..data.infill import split_for_infilling

    exclude = {chain_key(c) for c in corpus_chains(recipe["corpus_count"], recipe["corpus_seed"])}
    chains = pretraining_chains(recipe["chains"], recipe["chain_seed"], exclude,
                                recipe["max_chain_steps"])
    rng = random.Random(f"chains-forms:{recipe['chain_seed']}")
    pairs = []
    for chain in chains:
        named = recipe["named_steps"]
        reference, kernel = chain.reference(named), chain.kernel(named)
        if rng.random() < recipe["infill_share"]:
            prefix, _, suffix = split_for_infilling(kernel)
            prompt = prompts.infilling_prompt(reference, prefix, suffix, "cpu")
        else:
            prompt = prompts.end_to_end_prompt(reference, "cpu")
        pairs.append((prompt, prompts.response_text(kernel)))
    return pairs


def _without_work_dir(argv: list[str]) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--work-dir":
            skip = True
        elif not arg.startswith("--work-dir="):
            out.append(arg)
    return out


def data_digest(pairs: list[tuple[str, str]]) -> str:
    digest = hashlib.sha256()
    for prompt, response in pairs:
        digest.update(prompt.encode() + b"\0" + response.encode() + b"\0")
    return digest.hexdigest()


def run(args, params) -> int:
    out = Path(args.out)
    recipe = {key: getattr(args, key) for key in RECIPE}
    if args.write_corpus:
        names = write_corpus(out, recipe["corpus_count"], recipe["corpus_seed"], recipe["named_steps"],
                             args.backend, args.exclude_base)
        log.info("wrote %d chains to %s", len(names), out)
        return 0

    import torch

    from ..errors import ConfigError
    from ..model.loading import build_tiny
    from ..model.tokenizer import train_tiny_tokenizer
    from ..train.data import prepare_sft_data
    from ..train.parallel import init_distributed
    from ..train.sft import RunOptions, SFTPaths, run_sft

    spec = params["models"].get(args.model)
    if spec is None or spec["kind"] != "tiny":
        raise ConfigError(f"params.yaml: models.{args.model} must be a model of kind tiny "
                          "(the architecture pretrain-base initialises).")
    torch.manual_seed(recipe["seed"])
    pairs = pretraining_pairs(recipe)
    if args.init:
        from ..model.loading import load_saved

        loaded = load_saved(args.init, dtype=torch.float32)
        tokenizer = loaded.tokenizer
    else:
        tokenizer = train_tiny_tokenizer([text for pair in pairs for text in pair], spec["vocab_size"])
        loaded = build_tiny(spec, tokenizer)
    data = prepare_sft_data([p for p, _ in pairs], [r for _, r in pairs], tokenizer, loaded.settings,
                            recipe["cutoff_len"], pack=False)
    settings = {"epochs": recipe["epochs"], "learning_rate": recipe["learning_rate"], "warmup_ratio": 0.05,
                "lr_schedule": "cosine", "per_device_batch_size": recipe["batch_size"],
                "cutoff_len": recipe["cutoff_len"], "bf16": False, "compile": False, "pack": False,
                "save_every_steps": 20, "seed": recipe["seed"]}
    env = init_distributed(args.device)
    metrics = out.with_name(out.name + ".metrics")  # read back below, then removed
    paths = SFTPaths(out, metrics, Path(args.work_dir) if args.work_dir else out.with_name(out.name + ".work"))
    log.info("pretraining %s: %d examples (%d dropped) in %d rows", out, len(data.examples), data.dropped,
             len(data.rows))
    summary = run_sft(loaded, data, settings, paths, env,
                      RunOptions(stop_after_steps=args.stop_after_steps))
    if summary is None:
        return 0
    record = {
        # the command without where its checkpoints went (no effect on the result)
        "command": "dicepipe " + shlex.join(_without_work_dir(args.argv)),
        "model": dict(spec),
        "recipe": recipe,
        "train_settings": settings,
        "data_sha256": data_digest(pairs),
        "examples": len(data.examples),
        "steps": summary["steps"],
        "loss_first": summary["loss_first"],
        "loss_final": summary["loss_final"],
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(env.device) if env.device.type == "cuda" else "cpu",
    }
    # a run from another base's weights (--init) continues that base's record of stages
    earlier = Path(args.init or "") / "PRETRAINED.json"
    stages = json.loads(earlier.read_text()).get("stages", []) if args.init and earlier.is_file() else []
    (out / "PRETRAINED.json").write_text(json.dumps({"stages": stages + [record]}, indent=2, sort_keys=True) + "\n")
    steps = metrics / "steps.tsv"
    if steps.is_file():
        (out / "pretrain_steps.tsv").write_text(steps.read_text())
    import shutil

    shutil.rmtree(metrics, ignore_errors=True)
    log.info("pretrained %s: loss %.4f -> %.4f over %d steps", out, summary["loss_first"],
             summary["loss_final"], summary["steps"])
    return 0
