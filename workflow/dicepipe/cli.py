"""The one command line of the pipeline: one subcommand per stage.

Snakemake rules and DVC stages call exactly these subcommands with the same arguments.
Each stage lives in `dicepipe.stages.<name>` and exposes `add_arguments(parser)` and
`run(args, params) -> int`; heavy imports (torch, transformers) happen inside `run`.
Errors meant for the user are `DicepipeError`s, caught here once.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from pathlib import Path

from .errors import DicepipeError, HarnessError

# subcommand -> (module under dicepipe.stages, one-line help)
STAGES: dict[str, tuple[str, str]] = {
    "check-params": ("check_params", "validate params.yaml and print the resolved scales"),
    "acquire": ("acquire", "fetch an external input (dataset, repository, base model) by source and pin"),
    "ingest": ("ingest", "read a corpus source into a normalised samples table"),
    "verify": ("verify", "measure one shard of a corpus's samples with the harness"),
    "verify-gather": ("verify_gather", "join verify shards into one measurements table"),
    "augment": ("augment", "generate and verify structural samples (attention, MLP blocks)"),
    "assemble": ("assemble", "apply the threshold and write the CuKe splits"),
    "sft": ("sft", "supervised fine-tuning of a block-diffusion model"),
    "rl-infill": ("rl_infill", "BiC-RL stage 1: kernel-infilling RL from the SFT checkpoint"),
    "rl-e2e": ("rl_e2e", "BiC-RL stage 2: end-to-end kernel RL from the rl_infill checkpoint"),
    "benchmark": ("benchmark", "materialise a benchmark suite (KernelBench levels) as a table"),
    "evaluate": ("evaluate", "KernelBench evaluation of a scale's model and its baselines"),
    "curves": ("curves", "plot a scale's SFT and RL training curves"),
    "provenance": ("provenance", "record a scale's params, package versions and input pins"),
    "pretrain-base": ("pretrain_base", "make the tiny scale's base model, or its corpus (not a pipeline stage)"),
    "export-sdar": ("export_sdar", "write a saved model as an SDAR-shaped checkpoint folder (not a pipeline stage)"),
    "score": ("score", "score anyone's kernels: a folder or parquet of (reference, candidate)"),
    "cache": ("cache", "check the build cache and resume stores against their hashes; prune"),
    "wheelhouse": ("wheelhouse", "fetch the wheels an offline machine lacks, for its Python and platform (its torch stays)"),
}

log = logging.getLogger("dicepipe")


class CheckoutMismatchError(DicepipeError):
    """The imported dicepipe is not the code of the workflow being run."""


def _package_files(package_dir: Path) -> dict[str, bytes]:
    return {str(f.relative_to(package_dir)): f.read_bytes()
            for f in sorted(package_dir.rglob("*"))
            if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc"}


def check_checkout(workdir: Path, imported: Path | None = None) -> None:
    """Refuse to run another checkout's code. Rules and stages call the `dicepipe` on PATH;
    installed from another checkout, a stage would run that code while Snakemake and DVC track
    this workflow's files. Run from a repository (`workflow/dicepipe` below the working
    folder), the imported package must be that folder, or a byte-identical copy of it (DVC's
    `exp run --temp`/`--queue` run in a copy of the repository)."""
    own = workdir / "workflow" / "dicepipe"
    if not (own / "__init__.py").is_file():
        return
    imported = (imported or Path(__file__).parent).resolve()
    own = own.resolve()
    if not (imported == own or _package_files(imported) == _package_files(own)):
        raise CheckoutMismatchError(
            f"dicepipe is imported from {imported}, not from this workflow's {own}: the stage "
            f"would run that checkout's code while Snakemake and DVC track this one's. Install "
            f"this checkout (`pip install -e ./harness -e .` in {own.parent.parent}) or run "
            f"with PYTHONPATH={own.parent}.")
    # the harness likewise: the runners track the method version of this checkout's harness
    own_harness = (workdir / "harness" / "src" / "kernelharness").resolve()
    if not (own_harness / "__init__.py").is_file():
        return
    import kernelharness

    harness = Path(kernelharness.__file__).resolve().parent
    if harness == own_harness or _package_files(harness) == _package_files(own_harness):
        return
    raise CheckoutMismatchError(
        f"kernelharness is imported from {harness}, not from this workflow's {own_harness}: "
        f"the stage would measure with that checkout's harness while Snakemake and DVC track "
        f"this one's method version. Install this checkout's (`pip install -e ./harness` in "
        f"{own_harness.parent.parent.parent}) or run with PYTHONPATH={own_harness.parent}.")


def _setup_logging(log_path: str | None, verbose: bool) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    # Under torchrun (RANK set) the launching process has already started the log: rank 0
    # appends to it, the other ranks log to stderr only (torchrun forwards it).
    rank = os.environ.get("RANK")
    if log_path and rank in (None, "0"):
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_path, mode="w" if rank is None else "a"))
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        handlers=handlers,
        force=True,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dicepipe", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command, (module_name, help_text) in STAGES.items():
        module = importlib.import_module(f"dicepipe.stages.{module_name}")
        p = sub.add_parser(command, help=help_text, description=help_text)
        p.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
        p.add_argument("--log", default=None, help="also write the log to this file")
        p.add_argument("-v", "--verbose", action="store_true")
        module.add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:  # a stage started under torchrun (train/launch.py torchrun_command)
        argv = argv[1:]
    args = parser.parse_args(argv)
    # the command line as given, for stages that start themselves again under torchrun
    args.argv = argv
    _setup_logging(args.log, args.verbose)
    try:
        check_checkout(Path.cwd())
        from .config import load_params

        params = load_params(args.params)
        return int(args._module.run(args, params) or 0)
    except (DicepipeError, HarnessError) as exc:
        log.error("%s", exc)
        return 2
    except KeyboardInterrupt:
        log.error("interrupted; finished work is kept and the stage resumes when re-run")
        return 130


if __name__ == "__main__":
    sys.exit(main())
