"""The orchestrator's handle on one sandboxed worker process (spawn, ask, kill, restart).

A worker is a fresh `python -m kernelharness.worker.main` with a scrubbed environment, its
own session (so a kill takes every process it made) and its own folder. Each request has a
deadline that the worker's phase messages move forward; past it, or when the process's memory
passes the limit, the whole process group is killed and the caller gets a failure reply, and
the next request starts a fresh process.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from . import hygiene
from .protocol import Channel, ChannelClosed
from .worker.sandbox import scrubbed_env

log = logging.getLogger(__name__)
PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])  # the folder holding the package
WATCH_INTERVAL_S = 0.5
# Workers ask the kernel to kill them when their parent *thread* exits (PR_SET_PDEATHSIG), so
# they are all started from this one thread, which lives as long as the process: a worker
# started while serving one session call stays warm after that call's threads end.
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="worker-spawner")


@dataclass(eq=False)  # a worker is one process: compared and hashed by identity
class WorkerProcess:
    role: str
    root: Path
    index: int
    config: dict
    env_extra: dict[str, str]
    start_timeout_s: float
    memory_limit_mb: int | None
    generation: int = 0
    proc: subprocess.Popen | None = None
    channel: Channel | None = None
    folder: Path | None = None
    sandbox: str = ""
    restarts: int = 0
    memory_baseline: dict = field(default_factory=dict)  # what it held when it became ready
    excess_mb: dict = field(default_factory=dict)  # what it held beyond that after its last job

    # --- life cycle -------------------------------------------------------------------------

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ensure_started(self) -> None:
        if self.alive():
            return
        self.stop()
        self.generation += 1
        self.folder = self.root / f"{self.role}-{self.index}-{self.generation}"
        self.folder.mkdir(parents=True, exist_ok=True)
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        config = dict(self.config, role=self.role, folder=str(self.folder),
                      read_fd=to_child_r, write_fd=from_child_w)
        env = scrubbed_env(dict(self.env_extra, HOME=str(self.folder), TMPDIR=str(self.folder),
                                PYTHONPATH=PACKAGE_ROOT))
        with open(self.folder / "worker.log", "ab") as log_file:
            self.proc = _SPAWNER.submit(
                subprocess.Popen,
                [sys.executable, "-m", "kernelharness.worker.main", json.dumps(config)],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                cwd=self.folder, pass_fds=(to_child_r, from_child_w), start_new_session=True,
                close_fds=True).result()
        os.close(to_child_r)
        os.close(from_child_w)
        self.channel = Channel(from_child_r, to_child_w)
        deadline = time.monotonic() + self.start_timeout_s
        try:
            ready = self.channel.recv(deadline)
        except ChannelClosed:
            ready = None
        if not ready or ready.get("op") != "ready":
            tail = self.log_tail()
            self.stop()
            raise RuntimeError(f"{self.role} worker did not start: {tail}")
        self.sandbox = ready.get("sandbox", "")
        self.memory_baseline = self._memory_now(ready.get("memory"))
        self.excess_mb = {}

    def kill(self) -> None:
        """SIGKILL the worker's process group without waiting (stop() then reaps it)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def stop(self) -> None:
        if self.proc is not None:
            self.kill()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        if self.channel is not None:
            self.channel.close()
        self.proc, self.channel = None, None
        self.memory_baseline, self.excess_mb = {}, {}
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def restart(self) -> None:
        self.restarts += 1
        self.stop()

    def _memory_now(self, reported: dict | None) -> dict:
        """Host memory read here from /proc; device memory as the worker reported it."""
        now = {"host_mb": hygiene.process_host_mb(self.proc.pid) if self.proc else None}
        for name in ("device_used_mb", "device_used_before_mb", "device_total_mb"):
            if reported and reported.get(name) is not None:
                now[name] = float(reported[name])
        return now

    def check_memory(self, reported: dict | None) -> list[str]:
        """After a job: what the worker holds beyond its start; non-empty means a leak."""
        if not self.alive():
            return []
        now = self._memory_now(reported)
        self.excess_mb = hygiene.excess_mb(self.memory_baseline, now, self.excess_mb)
        limits = hygiene.leak_limits_mb(int(self.config["memory_mb"]),
                                        self.memory_baseline.get("device_total_mb"))
        return hygiene.leaked(self.excess_mb, limits)

    def log_tail(self, limit: int = 3000) -> str:
        if self.folder is None:
            return ""
        try:
            data = (self.folder / "worker.log").read_bytes()
        except OSError:
            return ""
        return data[-limit:].decode(errors="replace")

    # --- requests ---------------------------------------------------------------------------

    def request(self, message: dict, timeout_s: float,
                on_message: Callable[[dict], dict | None] | None = None) -> dict:
        """Send one request; return the worker's `result` message or a `failed` message.

        Messages other than the result go to `on_message` (phase changes move the deadline;
        a returned dict is sent back to the worker, and the time it took does not count).
        """
        self.ensure_started()
        phase = message.get("op", "request")
        deadline = time.monotonic() + timeout_s
        try:
            self.channel.send(message)
            while True:
                wait_until = min(deadline, time.monotonic() + WATCH_INTERVAL_S)
                reply = self.channel.recv(wait_until)
                if reply is None:
                    if time.monotonic() >= deadline:
                        return self._fail("timeout", phase, f"no answer within {timeout_s:.0f} s "
                                          f"(phase {phase})")
                    if self._over_memory():
                        return self._fail("memory", phase, f"worker memory passed "
                                          f"{self.memory_limit_mb} MB (phase {phase})")
                    continue
                op = reply.get("op")
                if op == "result":
                    return reply
                if op == "phase":
                    phase = reply.get("phase", phase)
                    deadline = time.monotonic() + float(reply.get("timeout_s", timeout_s))
                elif on_message is not None:
                    answer = on_message(reply)
                    if answer is not None:
                        self.channel.send(answer)
                    deadline = time.monotonic() + timeout_s
        except ChannelClosed:
            return self._crashed(phase)

    def _over_memory(self) -> bool:
        if not self.memory_limit_mb or self.proc is None:
            return False
        try:
            with open(f"/proc/{self.proc.pid}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) > self.memory_limit_mb * 1024
        except OSError:
            return False
        return False

    def _crashed(self, phase: str) -> dict:
        code = None
        if self.proc is not None:
            try:
                code = self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                code = None
        if code is not None and code < 0:
            how = f"killed by signal {signal.Signals(-code).name}"
        else:
            how = f"exited with status {code}"
        return self._fail("crash", phase, f"worker {how} (phase {phase})")

    def _fail(self, kind: str, phase: str, text: str) -> dict:
        tail = self.log_tail()
        self.restart()
        return {"op": "failed", "kind": kind, "phase": phase, "error": text, "log": tail}
