"""The compile steps of one extension build, run without ninja, each holding a CPU slot.

torch writes a ninja file for every `load_inline` build; this module reads the commands that
file would run (same flags, same order of arguments) and runs them itself:

- the units of one build (main.cpp, cuda.cu) run side by side, the link after both; the
  first unit that fails stops its siblings (a queued one never starts, a running compiler
  and its children are killed), so a file whose bindings do not compile frees its CPU slots
  in the seconds main.cpp takes, not the minute nvcc would;
- main.cpp goes first: a build's cuda unit takes no CPU slot until its host unit is done,
  so a main.cpp that does not compile (a binding of an undeclared function: the commonest
  failure of released kernels) costs its own seconds, not nvcc's as well; main.cpp takes a
  few seconds against its minimal prelude. A host unit that must wait for another builder's
  lock (a precompiled header being made) lets the cuda unit go ahead meanwhile;
- every compiler process first takes one of the machine's CPU slots (a lock file among
  `slots` in the cache, shared by every builder process), so there are never more compilers
  than cores however many builds are in flight, and a build waiting for a precompiled header
  holds no slot: with more builders than slots the cores stay busy until the last build;
- a cuda unit goes through `nvcc_split`, which runs nvcc's own phases and compiles the host
  side against a precompiled prefix (the device code is nvcc's, untouched).

Every command's wall and CPU time (its whole process tree's, from `wait4`) is recorded in the
build's `steps` list when one is given (`run_steps(steps=...)`): one entry per compiler run,
{"step", "seconds", "cpu_s", "wait_s", "ok"}; bench/build_breakdown.py reads them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import select
import signal
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SLOTS_ENV = "DICEPIPE_BUILD_SLOTS"
_VAR = re.compile(r"\$(\$|\{[A-Za-z0-9_.-]+\}|[A-Za-z0-9_-]+|[ :\n])")


class StepError(RuntimeError):
    pass


class StepCancelled(Exception):
    """A sibling unit of the same build failed, so this one stopped. Not a StepError: no
    fallback (a plain pass, full headers) may catch it and compile again."""


# The stop signal of the build a thread's compile steps belong to (run_steps sets it).
_local = threading.local()


def _cancelled() -> bool:
    event = getattr(_local, "cancel", None)
    return event is not None and event.is_set()


class HostFirst:
    """How many host units (rule `compile`: main.cpp) of one build are not done yet; the
    build's other units take no CPU slot while any is (see the module docstring). A host
    unit leaves the line once: when its step ends, or when it has to wait for another
    builder's lock, whichever comes first."""

    def __init__(self, in_line: int):
        self._in_line = in_line
        self._lock = threading.Lock()

    def waiting(self) -> bool:
        with self._lock:
            return self._in_line > 0

    def leave(self) -> None:
        with self._lock:
            self._in_line -= 1


def _host_leaves_line() -> None:
    if getattr(_local, "host_in_line", False):
        _local.host_in_line = False
        _local.host_first.leave()


def _yields_to_host() -> bool:
    """A cuda (or other non-host) unit whose build's main.cpp still waits for a slot."""
    gate = getattr(_local, "host_first", None)
    return (gate is not None and not getattr(_local, "is_host", False) and gate.waiting())


@contextlib.contextmanager
def _thread_setting(name: str, value):
    """This thread's `name` set to `value` inside the block, restored after it."""
    before = getattr(_local, name, None)
    setattr(_local, name, value)
    try:
        yield
    finally:
        setattr(_local, name, before)


def recoverable():
    """Commands run inside may fail without failing the build (a first try that has a
    fallback: light headers, the precompiled host header): their failure stops no sibling."""
    return _thread_setting("recoverable", True)


def holding_line(hold: bool = True):
    """With `hold`, waits for a lock inside keep the build's other units held back (see
    HostFirst): for a main.cpp expected to fail, whose cuda unit's work would be wasted."""
    return _thread_setting("hold_line", hold)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_tree(proc: subprocess.Popen) -> None:
    """Kill a compile command's shell and everything it started (nvcc's cicc, ptxas, gcc);
    they stay in the builder's process group, so a killed builder takes them along too.
    The tree is stopped first (a stopped process cannot fork), then found again and killed."""
    stopped: list[int] = []
    for _ in range(2):
        for pid in [proc.pid, *_descendants(proc.pid)]:
            if pid not in stopped:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)
    for pid in dict.fromkeys([*stopped, *_descendants(proc.pid)]):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    try:
        proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:  # an escaped grandchild holds the pipes: stop reading
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        proc.wait()


def parse_ninja(text: str) -> tuple[dict, dict, list[tuple[str, str, list[str]]]]:
    """(top-level variables, rule -> command, [(output, rule, inputs)]) of torch's ninja file."""
    variables: dict[str, str] = {}
    rules: dict[str, str] = {}
    builds: list[tuple[str, str, list[str]]] = []
    rule = None
    for raw in text.splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        if raw.startswith((" ", "\t")):
            key, _, value = raw.strip().partition("=")
            if rule is not None and key.strip() == "command":
                rules[rule] = value.strip()
            continue
        rule = None
        if raw.startswith("rule "):
            rule = raw.split(None, 1)[1].strip()
        elif raw.startswith("build "):
            outs, _, rest = raw[len("build "):].partition(": ")
            parts = rest.split()
            builds.append((outs.strip().replace("$:", ":"), parts[0],
                           [p.replace("$:", ":") for p in parts[1:]]))
        elif "=" in raw and not raw.startswith("default "):
            key, _, value = raw.partition("=")
            variables[key.strip()] = value.strip()
    return variables, rules, builds


def expand(template: str, scope: dict) -> str:
    def sub(match: re.Match) -> str:
        name = match.group(1)
        if name in ("$", " ", ":", "\n"):
            return name if name != "\n" else ""
        return scope.get(name.strip("{}"), "")

    return _VAR.sub(sub, template)


def plan(ninja_file: Path) -> tuple[list[dict], dict | None]:
    """The compile steps and the link step, each {"rule", "out", "in", "command"}."""
    variables, rules, builds = parse_ninja(ninja_file.read_text())
    compiles, link = [], None
    for out, rule, inputs in builds:
        if rule not in rules:
            raise StepError(f"ninja file names an unknown rule {rule!r}")
        scope = dict(variables, out=out, **{"in": " ".join(inputs)})
        step = {"rule": rule, "out": out, "in": inputs,
                "command": expand(rules[rule], scope)}
        if rule == "link":
            link = step
        else:
            compiles.append(step)
    return compiles, link


# Waiting for a CPU slot or for another builder's precompiled header is queueing, not
# building: while this process holds no slot, it tells the orchestrator so every few seconds
# (`set_wait_hook`), and the build's timeout counts from its last such message. A process
# holding a slot sends nothing, so a hung compile still times out and frees its slot.
HEARTBEAT_S = 5.0
_wait_state = {"held": 0, "hook": None, "last": 0.0}
_wait_lock = threading.Lock()


def set_wait_hook(hook) -> None:
    """`hook(phase)`: "build:queued" (throttled) while this process waits holding no CPU
    slot, "build" when it takes its first slot (the build's own time starts there)."""
    _wait_state["hook"] = hook


def waiting() -> None:
    with _wait_lock:
        hook = _wait_state["hook"]
        now = time.monotonic()
        if hook is None or _wait_state["held"] or now - _wait_state["last"] < HEARTBEAT_S:
            return
        _wait_state["last"] = now
        hook("build:queued")


def wait_for_lock(handle) -> None:
    """An exclusive flock on `handle`, waited for with heartbeats."""
    delay = 0.05
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if not getattr(_local, "hold_line", False):
                _host_leaves_line()  # another builder holds it: no reason to hold nvcc back
            waiting()
            time.sleep(delay)
            delay = min(delay * 2, 0.5)


@contextlib.contextmanager
def cpu_slot(cache: Path):
    """Hold one of the machine's CPU slots (none when the slot count is not set)."""
    count = int(os.environ.get(SLOTS_ENV, "0") or 0)
    if count <= 0:
        yield
        return
    folder = cache / "slots" / str(count)
    folder.mkdir(parents=True, exist_ok=True)
    start = os.getpid() % count  # spread first attempts over the slots
    delay = 0.02
    while True:
        for k in range(0 if _yields_to_host() else count):
            path = folder / f"{(start + k) % count}.lock"
            handle = open(path, "w")  # noqa: SIM115 - held over the yield
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            with _wait_lock:
                _wait_state["held"] += 1
                if _wait_state["held"] == 1 and _wait_state["hook"] is not None:
                    _wait_state["hook"]("build")
            try:
                yield
            finally:
                with _wait_lock:
                    _wait_state["held"] -= 1
                handle.close()
            return
        if _cancelled():
            raise StepCancelled()
        waiting()
        time.sleep(delay)
        delay = min(delay * 2, 0.25)


def current_steps() -> list | None:
    """The step record of the build this thread works for (None: not recording)."""
    return getattr(_local, "steps", None)


def recording(steps: list | None):
    """Record this thread's commands into `steps` (e.g. in a helper thread of one build)."""
    return _thread_setting("steps", steps)


def record_step(step: str, seconds: float, cpu_s: float, ok: bool = True,
                wait_s: float = 0.0) -> None:
    steps = current_steps()
    if steps is not None:
        steps.append({"step": step, "seconds": round(seconds, 3), "cpu_s": round(cpu_s, 3),
                      "wait_s": round(wait_s, 3), "ok": ok})


def _reap(proc: subprocess.Popen, poll_s: float) -> float | None:
    """Reap `proc` if it has ended within `poll_s`: its CPU seconds (user + system, its
    children's included: wait4's usage), or None while it runs. Sets proc.returncode."""
    pidfd = None
    with contextlib.suppress(AttributeError, OSError):
        pidfd = os.pidfd_open(proc.pid)
    try:
        deadline = time.monotonic() + poll_s
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                return usage.ru_utime + usage.ru_stime
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if pidfd is not None:
                select.select([pidfd], [], [], left)
            else:
                time.sleep(min(left, 0.01))
    finally:
        if pidfd is not None:
            os.close(pidfd)


def run_measured(argv, cwd: Path, env: dict | None = None, shell: bool = False,
                 cancellable: bool = False):
    """Run one process to its end: (returncode, stdout, stderr, wall s, CPU s).

    Output goes through temporary files (no pipe to drain while waiting), and the process is
    reaped with wait4 for its CPU time. `cancellable`: the build's stop signal kills it."""
    args = ["/bin/sh", "-c", argv] if shell else argv
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.monotonic()
        proc = subprocess.Popen(args, cwd=cwd, stdout=out, stderr=err, env=env)
        try:
            while True:
                cpu = _reap(proc, 0.2)
                if cpu is not None:
                    break
                if cancellable and _cancelled():
                    _kill_tree(proc)
                    raise StepCancelled()
        except BaseException:
            if proc.returncode is None:
                _kill_tree(proc)
            raise
        wall = time.monotonic() - start
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        stderr = err.read().decode(errors="replace")
    return proc.returncode, stdout, stderr, wall, cpu


def run_command(command: str, cwd: Path, cache: Path, log: list[str],
                env: dict | None = None, step: str = "command") -> str:
    """One shell command (as ninja runs it) in a CPU slot; its output also goes to `log`."""
    return run_commands([(step, command)], cwd, cache, log, env)


def run_commands(commands: list[tuple[str, str]], cwd: Path, cache: Path, log: list[str],
                 env: dict | None = None, after=None) -> str:
    """(step name, shell command) pairs run in order in one CPU slot, stopping at the first
    that fails (as `set -e` would); each is recorded on its own. Returns their output.
    `after(step name)` runs after each command that succeeds, in the slot (a StepError it
    raises stops the rest)."""
    outputs: list[str] = []
    queued = time.monotonic()
    with cpu_slot(cache):
        wait_s = time.monotonic() - queued
        for step, command in commands:
            if _cancelled():
                raise StepCancelled()
            returncode, stdout, stderr, wall, cpu = run_measured(command, cwd, env, shell=True,
                                                                 cancellable=True)
            record_step(step, wall, cpu, returncode == 0, wait_s)
            wait_s = 0.0
            if returncode != 0:
                _stop_siblings()  # before the slot is free: no sibling starts after a failure
            output = (stdout + stderr).strip()
            if output:
                log.append(output)
                outputs.append(output)
            if returncode != 0:
                raise StepError(f"command failed (exit {returncode}): {command}\n{output}")
            if after is not None:
                after(step)
    return "\n".join(outputs)


def replay_failure(step: str, message: str, log: list[str]) -> None:
    """Fail as run_commands fails, for a command whose failure is already known (a compiler
    error cached by an earlier build): recorded, the build's other units stopped (unless
    recoverable), its message logged, StepError raised."""
    record_step(step, 0.0, 0.0, False)
    _stop_siblings()
    log.append(message)
    raise StepError(message)


def _stop_siblings() -> None:
    """A unit of this build failed: its other units stop, unless the failure is recoverable
    (a minimal-header try the unit repeats as written)."""
    if getattr(_local, "cancel", None) is not None and not getattr(_local, "recoverable", False):
        _local.cancel.set()


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write `path` whole or not at all (a reader in another builder never sees half)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    if isinstance(data, str):
        tmp.write_text(data)
    else:
        tmp.write_bytes(data)
    os.replace(tmp, path)


def run_steps(ninja_file: Path, cache: Path, before_compile=None, cuda_compile=None,
              steps: list | None = None, host_compile=None) -> list[str]:
    """Every compile step in parallel, then the link. Returns notes (e.g. header use).
    The first step to fail stops the others (StepCancelled) and its error is raised.
    `steps`: a list that receives one timing record per command run (see record_step).

    `before_compile(step)` runs outside any slot first (waiting for a precompiled header);
    `cuda_compile(step, log)` replaces running a cuda_compile step's command as it is;
    `host_compile(step, log)` a compile (main.cpp) step's, before_compile included.
    """
    folder = ninja_file.parent
    compiles, link = plan(ninja_file)
    log: list[str] = []
    notes: list[str] = []
    lock = threading.Lock()

    cancel = threading.Event()
    host_first = HostFirst(sum(step["rule"] == "compile" for step in compiles))

    def one(step: dict) -> None:
        _local.cancel = cancel
        _local.host_first = host_first
        _local.is_host = _local.host_in_line = step["rule"] == "compile"
        _local.steps = steps
        try:
            run_one(step)
        except BaseException:
            cancel.set()  # the other units stop: this build has failed
            raise
        finally:
            _host_leaves_line()
            _local.cancel = _local.host_first = _local.steps = None
            _local.is_host = False

    def run_one(step: dict) -> None:
        if step["rule"] == "compile" and host_compile is not None:
            note = host_compile(step, log)
            if note:
                with lock:
                    notes.append(note)
            return
        if before_compile is not None:
            note = before_compile(step)
            if note:
                with lock:
                    notes.append(note)
        if step["rule"] == "cuda_compile" and cuda_compile is not None:
            note = cuda_compile(step, log)
            if note:
                with lock:
                    notes.append(note)
        else:
            run_command(step["command"], folder, cache, log, step=_unit_step(step))

    with ThreadPoolExecutor(max_workers=max(1, len(compiles))) as pool:
        futures = [pool.submit(one, step) for step in compiles]
        errors = [f.exception() for f in futures]
    failures = [e for e in errors if e is not None and not isinstance(e, StepCancelled)]
    if failures:
        raise failures[0]
    if any(errors):  # cancelled with no failure beside it: not expected, still a failed build
        raise StepError("compile steps were stopped with no failing step:\n" + "\n".join(log))
    if link is not None:
        with recording(steps):
            run_command(link["command"], folder, cache, log, step="link")
    return notes


def _unit_step(step: dict) -> str:
    """The record name of a unit compiled as written: host (main.cpp) or the unit's rule."""
    return "host" if step["rule"] == "compile" else step["rule"]
