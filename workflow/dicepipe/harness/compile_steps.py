"""The compile steps of one extension build, run without ninja, each holding a CPU slot.

torch writes a ninja file for every `load_inline` build; this module reads the commands that
file would run (same flags, same order of arguments) and runs them itself:

- the units of one build (main.cpp, cuda.cu) run side by side, the link after both;
- every compiler process first takes one of the machine's CPU slots (a lock file among
  `slots` in the cache, shared by every builder process), so there are never more compilers
  than cores however many builds are in flight, and a build waiting for a precompiled header
  holds no slot: with more builders than slots the cores stay busy until the last build;
- a cuda unit goes through `nvcc_split`, which runs nvcc's own phases and compiles the host
  side against a precompiled prefix (the device code is nvcc's, untouched).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SLOTS_ENV = "DICEPIPE_BUILD_SLOTS"
_VAR = re.compile(r"\$(\$|\{[A-Za-z0-9_.-]+\}|[A-Za-z0-9_-]+|[ :\n])")


class StepError(RuntimeError):
    pass


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
        for k in range(count):
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
        waiting()
        time.sleep(delay)
        delay = min(delay * 2, 0.25)


def run_command(command: str, cwd: Path, cache: Path, log: list[str],
                env: dict | None = None) -> str:
    """One shell command (as ninja runs it) in a CPU slot; its output also goes to `log`."""
    with cpu_slot(cache):
        proc = subprocess.run(["/bin/sh", "-c", command], cwd=cwd, capture_output=True,
                              text=True, env=env, check=False)
    output = (proc.stdout + proc.stderr).strip()
    if output:
        log.append(output)
    if proc.returncode != 0:
        raise StepError(f"command failed (exit {proc.returncode}): {command}\n{output}")
    return output


def run_steps(ninja_file: Path, cache: Path, before_compile=None, cuda_compile=None) -> list[str]:
    """Every compile step in parallel, then the link. Returns notes (e.g. header use).

    `before_compile(step)` runs outside any slot first (waiting for a precompiled header);
    `cuda_compile(step, log)` replaces running a cuda_compile step's command as it is.
    """
    folder = ninja_file.parent
    compiles, link = plan(ninja_file)
    log: list[str] = []
    notes: list[str] = []
    lock = threading.Lock()

    def one(step: dict) -> None:
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
            run_command(step["command"], folder, cache, log)

    with ThreadPoolExecutor(max_workers=max(1, len(compiles))) as pool:
        for future in [pool.submit(one, step) for step in compiles]:
            future.result()
    if link is not None:
        run_command(link["command"], folder, cache, log)
    return notes
