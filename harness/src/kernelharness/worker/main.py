"""Entry point of every harness worker: `python -m kernelharness.worker.main CONFIG_JSON`.

Roles:
  extract  runs candidate files with load_inline recorded (no GPU, no new processes);
  build    compiles specs into the cache (no GPU; runs the compiler, nothing else);
  device   runs jobs on one device (`cpu`, or one GPU) with the candidate's code.
The sandbox goes up in two steps: limits and the network namespace before anything is
imported, then Landlock (writes only in the worker's folder, and the cache for builders) and
seccomp (no processes, except in builders) once torch and, on cuda, the GPU are initialised,
so that nothing the libraries do at start-up trips over them.
"""

from __future__ import annotations

import faulthandler
import json
import os
import shutil
import sys
import threading
from pathlib import Path

from . import sandbox


def _apply_early(cfg: dict) -> list[str]:
    sandbox.die_with_parent()
    memory = None if (cfg["role"] == "device" and cfg["device"] == "cuda") else cfg["memory_mb"]
    applied = sandbox.set_limits(memory_mb=memory, open_files=cfg["open_files"],
                                 cpu_seconds=None, file_size_mb=cfg["file_size_mb"],
                                 nproc=cfg.get("nproc"))
    net = sandbox.isolate_network()
    if net:
        applied.append(net)
    return applied


def _apply_late(cfg: dict, applied: list[str]) -> None:
    writable = [cfg["folder"]]
    if cfg["role"] == "build":
        writable.append(cfg["cache_dir"])
    if cfg["role"] == "device" and cfg["device"] == "cuda" and os.path.isdir("/dev/shm"):
        writable.append("/dev/shm")  # the CUDA driver's shared-memory files (IPC, caches)
    landlock = sandbox.restrict_writes(writable, sandbox.device_files())
    if landlock:
        applied.append(landlock)
    if cfg["role"] in ("extract", "device"):
        seccomp = sandbox.forbid_new_processes()
        if seccomp:
            applied.append(seccomp)


class DeviceContext:
    """What a device worker keeps between jobs."""

    def __init__(self, cfg: dict, channel):
        self.device = cfg["device"]
        self.cache = Path(cfg["cache_dir"])
        self.toolchain = cfg["toolchain"]
        self.channel = channel
        self.folder = Path(cfg["folder"])
        self.extensions: dict = {}
        self.job_count = 0
        self.job_folder = self.folder
        self.current_phase = "load"
        from .guards import ThreadWatch

        self.thread_watch = ThreadWatch()
        self.base_threads = threading.active_count()

    def phase(self, name: str, timeout_s: float) -> None:
        self.current_phase = name.split(":")[0]
        self.channel.send({"op": "phase", "phase": name, "timeout_s": timeout_s})

    def request_build(self, spec: dict, key: str) -> dict:
        self.channel.send({"op": "build_request", "spec": spec, "key": key})
        reply = self.channel.recv()
        if reply is None or reply.get("op") != "build_reply":
            raise RuntimeError("no build reply from the orchestrator")
        return reply["status"]


def _init_device(device: str) -> None:
    import torch

    # TF32 switches are set per job from its settings (device_job.apply_backend_settings)
    torch.backends.cudnn.benchmark = False
    if device == "cuda":
        torch.cuda.init()
        x = torch.randn(64, 64, device="cuda")
        (x @ x).sum().item()  # loads cuBLAS before the sandbox closes
        torch.cuda.synchronize()
    from .correctness import scrub_free_memory

    scrub_free_memory(device)  # loads what the scrub uses (libc's malloc_trim) up front


def _serve_device(cfg: dict, channel) -> None:
    from ..hygiene import memory_report
    from .device_job import run_job, run_probe

    ctx = DeviceContext(cfg, channel)
    while True:
        msg = channel.recv()
        if msg is None or msg.get("op") == "stop":
            return
        ctx.job_count += 1
        ctx.job_folder = ctx.folder / f"job-{ctx.job_count}"
        ctx.job_folder.mkdir()
        os.chdir(ctx.job_folder)
        _truncate_log()
        sandbox.extend_cpu_limit(cfg["cpu_seconds_per_job"])
        before = memory_report(ctx.device)  # the device is shared: its use right before the job
        result = (run_probe if msg.get("op") == "probe" else run_job)(msg, ctx)
        os.chdir(ctx.folder)
        shutil.rmtree(ctx.job_folder, ignore_errors=True)
        if not result["fatal"]:  # what the job left behind (the orchestrator decides: hygiene.py)
            result["memory"] = dict(memory_report(ctx.device),
                                    device_used_before_mb=before.get("device_used_mb"))
        channel.send(dict(result, op="result"))
        if result["fatal"] or result["restart"]:
            os._exit(0)  # the orchestrator starts a fresh worker for the next job


def _serve_extract(cfg: dict, channel) -> None:
    from .extract import extract_specs

    folder = Path(cfg["folder"])
    count = 0
    while True:
        msg = channel.recv()
        if msg is None or msg.get("op") == "stop":
            return
        count += 1
        job_folder = folder / f"extract-{count}"
        job_folder.mkdir()
        os.chdir(job_folder)
        sandbox.extend_cpu_limit(cfg["cpu_seconds_per_job"])
        result = extract_specs(msg["candidate_code"], msg["reference_code"], job_folder)
        os.chdir(folder)
        shutil.rmtree(job_folder, ignore_errors=True)
        channel.send(dict(result, op="result"))
        if not result["ok"]:
            os._exit(0)  # a candidate that failed half-way may have left anything behind


def _serve_build(cfg: dict, channel) -> None:
    from ..compilation.builder import build_spec
    from ..compilation.compile_steps import set_wait_hook
    from ..compilation.options import BuildOptions

    cache = Path(cfg["cache_dir"])
    # Queued, not stuck: each message moves this build's deadline forward (see compile_steps).
    set_wait_hook(lambda phase: channel.send({"op": "phase", "phase": phase}))
    while True:
        msg = channel.recv()
        if msg is None or msg.get("op") == "stop":
            return
        try:
            status = build_spec(msg["spec"], msg["key"], cache,
                                BuildOptions.from_wire(msg["options"]))
        except Exception as exc:
            status = {"ok": False, "transient": True, "log_tail": f"builder error: {exc!r}"}
        channel.send({"op": "result", "status": status})


def main() -> None:
    cfg = json.loads(sys.argv[1])
    faulthandler.enable()
    applied = _apply_early(cfg)
    from ..protocol import Channel

    channel = Channel(cfg["read_fd"], cfg["write_fd"])
    if cfg["role"] == "device":
        _init_device(cfg["device"])
    else:
        import torch  # noqa: F401 - imported before the sandbox closes, as on the device
    _apply_late(cfg, applied)
    if cfg["role"] != "device":
        os.nice(10)  # builds and extraction yield the CPU to timed work
    ready = {"op": "ready", "sandbox": ",".join(applied), "pid": os.getpid()}
    if cfg["role"] == "device":  # the baseline a job's leftovers are measured against
        from ..hygiene import memory_report

        ready["memory"] = memory_report(cfg["device"])
    channel.send(ready)
    serve = {"device": _serve_device, "extract": _serve_extract, "build": _serve_build}
    serve[cfg["role"]](cfg, channel)


def _truncate_log() -> None:
    try:
        os.ftruncate(1, 0)
    except OSError:
        pass


if __name__ == "__main__":
    main()
