"""Start a training stage on several GPUs: the stage re-executes its own command line under
torchrun (`python -m torch.distributed.run --standalone --nproc_per_node N -m dicepipe.cli
...`) when its scale asks for more than one process and it is not running under torchrun
already. Snakemake, DVC and SLURM then see one command, as with one process; the ranks find
each other through torchrun's environment (dicepipe.train.parallel.init_distributed).

Every training stage (sft, rl_infill, rl_e2e) declares its arguments with `add_training_arguments`
and starts its `run` with

    code = relaunch_stage(args, params)
    if code is not None:
        return code
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

from ..errors import ConfigError

log = logging.getLogger(__name__)

# Set by torchrun in every process it starts.
TORCHRUN_ENV = ("TORCHELASTIC_RUN_ID", "LOCAL_RANK")


def under_torchrun(environ=None) -> bool:
    environ = os.environ if environ is None else environ
    return all(name in environ for name in TORCHRUN_ENV)


def torchrun_command(argv: list[str], nproc: int, python: str = sys.executable) -> list[str]:
    """The command that runs `dicepipe <argv>` as `nproc` ranks on this machine. The stage's
    arguments follow `--`: torchrun's own parser reads every later argument as an option too,
    and refuses one that abbreviates several of its own (`--log`: --log-dir, --logs-specs);
    after `--` it reads none. Whether torchrun then passes the `--` on depends on the Python
    (argparse's REMAINDER kept it before 3.12): dicepipe.cli drops a leading one."""
    return [python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
            "-m", "dicepipe.cli", "--", *argv]


def needs_relaunch(nproc: int, force: bool = False, environ=None) -> bool:
    """More than one process asked for (or `force`, to run one rank through torchrun as a
    check), and not already a torchrun rank."""
    return (nproc > 1 or force) and not under_torchrun(environ)


def check_gpu_count(nproc: int, device: str) -> None:
    """Refuse before starting ranks that would find no GPU of their own."""
    if device == "cpu":
        return
    import torch

    if not torch.cuda.is_available():
        if device == "cuda":
            raise ConfigError("--device cuda: no GPU is visible (check CUDA_VISIBLE_DEVICES).")
        return  # auto on a CPU machine: the ranks run on the CPU with gloo
    visible = torch.cuda.device_count()
    if visible < nproc:
        raise ConfigError(
            f"the scale asks for {nproc} training processes (params.yaml scales.<scale>.gpus) "
            f"but this job sees {visible} GPUs. Set gpus to {visible} or give the job more "
            "GPUs (resources on a cluster; CUDA_VISIBLE_DEVICES here).")


def relaunch_under_torchrun(args, nproc: int, force: bool = False) -> int | None:
    """Run this stage's command again under torchrun with `nproc` ranks and return its exit
    code; None when this process should do the work itself (one process, or already a rank).
    `args` is the CLI's namespace (its `argv` holds the command line as given)."""
    if not needs_relaunch(nproc, force):
        return None
    argv = getattr(args, "argv", None)
    if argv is None:
        raise ConfigError(f"{nproc} training processes need the `dicepipe` command line to start "
                          "them under torchrun; call the stage through dicepipe.cli.main.")
    check_gpu_count(nproc, getattr(args, "device", "auto"))
    command = torchrun_command(argv, nproc)
    log.info("starting %d ranks: %s", nproc, " ".join(command))
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    return subprocess.run(command, env=env, check=False).returncode


def add_training_arguments(parser, inputs: dict[str, str], out: str, metrics: str,
                           steps: str = "steps") -> None:
    """The command line every training stage shares: its scale, its inputs (flag: help), the
    folders its model and metrics go to, then how it runs: where its checkpoints for resuming
    go, its device, how it starts (--launch) and when it stops early."""
    parser.add_argument("--scale", required=True, help="scale name under params.yaml 'scales'")
    for flag, text in inputs.items():
        parser.add_argument(flag, required=True, help=text)
    parser.add_argument("--out", required=True, help=out)
    parser.add_argument("--metrics", required=True, help=metrics)
    parser.add_argument("--work-dir", default=None,
                        help="checkpoints for resuming (default: <out>.work; removed after success)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--keep-checkpoints", action="store_true")
    parser.add_argument("--launch", choices=("auto", "torchrun"), default="auto",
                        help="auto: through torchrun when the scale's gpus > 1; torchrun: always "
                             "(one rank when gpus is 1, to check the launch)")
    parser.add_argument("--stop-after-steps", type=int, default=None,
                        help=f"checkpoint and exit after this many {steps} (testing resume)")


def relaunch_stage(args, params: dict) -> int | None:
    """`relaunch_under_torchrun` with the scale's training processes (params.yaml
    scales.<scale>.gpus), forced by `--launch torchrun` or the scale's `launch: torchrun`."""
    from ..cluster import training_processes

    force = "torchrun" in (getattr(args, "launch", "auto"), params["scales"][args.scale].get("launch", "auto"))
    return relaunch_under_torchrun(args, training_processes(params, args.scale), force=force)
