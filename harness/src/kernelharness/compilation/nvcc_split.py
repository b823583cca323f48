"""One nvcc compile run phase by phase, its host pass against a precompiled header.

A `.cu` that includes torch's headers costs three full parses of them: cudafe++ (host side),
cicc (device side) and the host compiler on cudafe++'s output. The first two are nvcc's and
stay as they are. The third compiles `cuda.cudafe1.cpp`: torch's headers as cudafe++ wrote
them, then the candidate's own code. That header part is the same text for every candidate
with the same includes and flags, except for one name, the translation unit's module id
(which names its anonymous namespaces). So the host pass here:

1. runs nvcc with `--dryrun --keep` to get its exact phase commands, and runs them in order,
   all but the host compile;
2. as soon as cudafe++ is done (beside cicc), cuts `cuda.cudafe1.cpp` where the candidate's
   file begins, writes the module id as a same-length placeholder in both parts, and
   precompiles the header part once per (text, flags) into the cache; a build that finds
   another builder making it waits, holding no CPU slot;
3. compiles `#include "<prefix>"` + the candidate's part with the very same command.

gcc guarantees a precompiled header compiles as the text it came from, so the object is the
one the plain host pass makes, but for the anonymous namespaces' (hidden) name (checked:
same disassembly, symbols and section bytes once the name is written back); the device
code and the registration of kernels and variables (which go by the device names in the
stub) are nvcc's own. Anything unexpected (no module id, no cut point, a failed header or
compile) falls back to the plain host command, and the note says so.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .compile_steps import (
    StepError,
    cpu_slot,
    current_steps,
    record_step,
    recording,
    recoverable,
    run_commands,
    run_measured,
    wait_for_lock,
)
from .entries import checked_or_removed, file_digest, record_hash, write_checked
from .preludes import (
    NEEDS_ALL,
    minimal_source,
    only_missing_declarations,
    slim_conflicts,
    slim_originals,
)


def placeholder(module_id: str) -> str:
    """A fixed stand-in of the same length, so mangled names keep their length prefixes."""
    return "_" + "0" * (len(module_id) - 1)


# A host precompiled header is ~1 GB: beyond this many distinct header sets, compile plainly.
MAX_HOST_HEADERS = 12
_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def dryrun_lines(command: str, folder: Path, keep: Path) -> list[str]:
    """nvcc's phase lines (assignments and commands) for `command`, intermediates in keep/."""
    returncode, stdout, stderr, wall, cpu = run_measured(
        f"{command} --dryrun --keep --keep-dir {keep}", folder, shell=True)
    record_step("cuda:dryrun", wall, cpu, returncode == 0)
    if returncode != 0:
        raise StepError(f"nvcc --dryrun failed: {stderr[-2000:]}")
    # "-- Filter Dependencies -- > x.d" is no command: nvcc's own step writing the .d file
    # ninja would read; this build keeps no dependency files.
    return [line[3:] for line in (stdout + stderr).splitlines()
            if line.startswith("#$ ") and not line[3:].startswith("--")]


def host_compile_index(lines: list[str]) -> int | None:
    """The last command compiling cudafe++'s output on the host."""
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i]
        if not _ASSIGN.match(line) and ".cudafe1.cpp" in line and " -c " in f" {line} ":
            return i
    return None


def phase_env(lines: list[str]) -> dict:
    """The environment nvcc gives its tools: its variable lines (PATH, CICC_PATH, ...).

    They are not all valid shell (`SYSTEM_INCLUDES="-isystem" "..."`), so they are read here
    as nvcc means them, name=rest of line; the commands come already expanded but for these.
    """
    env = dict(os.environ)
    for line in lines:
        if _ASSIGN.match(line):
            name, _, value = line.partition("=")
            env[name] = value.strip()
    return env


def phase_name(line: str) -> str:
    """The record name of one nvcc phase command: cuda:preprocess (the host compiler's -E
    passes), cuda:cudafe, cuda:cicc, cuda:ptxas, cuda:fatbinary, cuda:host-compile, ..."""
    try:
        argv = shlex.split(line)
    except ValueError:
        argv = line.split()
    tool = os.path.basename(argv[0]) if argv else "?"
    if tool.startswith("cudafe"):
        return "cuda:cudafe"
    if tool in ("cicc", "ptxas", "fatbinary", "nvlink"):
        return f"cuda:{tool}"
    if "-E" in argv:
        return "cuda:preprocess"
    if any(a.endswith(".cudafe1.cpp") for a in argv) and "-c" in argv:
        return "cuda:host-compile"
    return f"cuda:{tool}"


def run_phases(lines: list[str], folder: Path, cache: Path, log: list[str],
               env: dict, after=None) -> str:
    """nvcc's phase commands in order in one CPU slot (as `script` would run them), each
    timed on its own; `after(step name)` as in run_commands."""
    return run_commands([(phase_name(line), line) for line in lines if not _ASSIGN.match(line)],
                        folder, cache, log, env, after)


class HeaderConflict(StepError):
    """A unit with slim operator headers also includes an original of one of them."""


def slim_check(keep: Path, originals: list[str]):
    """An `after` hook for run_phases: once the first preprocessing pass has written its
    output, a unit whose includes reach an original of a slimmed header stops there
    (HeaderConflict), before cudafe++ parses it."""
    done = []

    def check(step: str) -> None:
        if step != "cuda:preprocess" or done:
            return
        done.append(step)
        for ii in sorted(keep.glob("*.ii")):
            both = slim_conflicts(ii.read_text(errors="replace"), originals)
            if both:
                raise HeaderConflict(f"the unit includes {', '.join(both)} beside the slim "
                                     "copies of the prelude")
    return check


# `#include <torch/extension.h>` on a line of its own: torch/all.h and pybind11 on top of the
# torch/types.h that load_inline already puts first in cuda.cu.
_EXTENSION_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include[ \t]*<torch/extension\.h>[ \t]*$", re.M)
_LEFT_OUT = "// harness: <torch/extension.h> left out (light headers)"


def compile_cuda(step: dict, folder: Path, cache: Path, log: list[str],
                 light_headers: bool = False, minimal_headers: bool = False,
                 slim_ops: bool = True) -> str:
    """Run one cuda_compile step; returns a note on how it went.

    The source compiles first with the fewest headers, each tier only where it changes the
    file; any error in a tier and the next one compiles, so a source that needs the full
    headers builds exactly as before, only later:

    - minimal_headers: its torch includes replaced by its minimal prelude (ATen's Tensor and
      the operators it names: `preludes`; cudafe++ + cicc take 12.5 s instead of 28.1 s for
      one kernel on a 2-core VM), the operators' headers as slim copies (`slim_ops`:
      BuildOptions.slim_op_headers; off, the operators' own headers, what
      bench/build_breakdown.py's `no-slim-ops` variant measures); a unit
      whose own includes reach an original of one is seen after the first preprocessing
      pass (slim_check) and compiles in this tier again with the originals;
    - light_headers: without `#include <torch/extension.h>` (the kernels and their host
      wrappers rarely need more than the torch/types.h load_inline includes, and nvcc's two
      front ends then parse half as much: 52 s instead of 113 s for one build on a 2-core VM);
    - as written.
    """
    source = step["in"][0] if step["in"] else ""
    path = Path(source) if source else None
    if path is not None and not path.is_absolute():
        path = folder / path
    wanted = (light_headers or minimal_headers) and path is not None and path.is_file()
    text = path.read_text() if wanted else ""
    tiers = []
    if minimal_headers and text:
        minimal = minimal_source(text, cache, binding=False, slim=slim_ops)
        if minimal is not None:
            tiers.append(("minimal-headers", minimal))
    if light_headers and "<torch/types.h>" in text and not NEEDS_ALL.search(text):
        lighter = _EXTENSION_INCLUDE.sub(_LEFT_OUT, text)
        if lighter != text:
            tiers.append(("light-headers", lighter))
    if not tiers:
        return _compile_cuda(step, folder, cache, log)
    try:
        k = 0
        while k < len(tiers):
            label, variant = tiers[k]
            path.write_text(variant)  # the same line count: compiler messages keep their lines
            originals = slim_originals(variant) if label == "minimal-headers" else []
            try:
                with recoverable():  # its failure is not the build's: the next tier compiles
                    note = _compile_cuda(step, folder, cache, log,
                                         slim_check(folder / "nvcc", originals)
                                         if originals else None)
                    return note + "," + label + (",slim-ops" if originals else "")
            except HeaderConflict as exc:
                # the same tier again with the operators' own headers
                log.append(f"compiling with {label} (slim operator headers) stopped: {exc}")
                shutil.rmtree(folder / "nvcc", ignore_errors=True)
                tiers[k] = (label, minimal_source(text, cache, binding=False) or text)
                continue
            except StepError as exc:
                # an error that is no missing declaration is the source's own: a lighter
                # tier cannot help, so it goes straight to its headers as written
                last = k + 1 == len(tiers) or not only_missing_declarations(str(exc))
                then = "as written" if last else f"with {tiers[k + 1][0]}"
                log.append(f"compiling with {label} failed; compiling {then}: {exc}")
                shutil.rmtree(folder / "nvcc", ignore_errors=True)  # module id, intermediates
                if last:
                    break
            k += 1
        path.write_text(text)
        return _compile_cuda(step, folder, cache, log) + ",full-headers"
    finally:
        path.write_text(text)  # the build folder keeps the source as the candidate wrote it


def _compile_cuda(step: dict, folder: Path, cache: Path, log: list[str], after=None) -> str:
    command = step["command"]
    source = step["in"][0] if step["in"] else ""
    if source and Path(source).resolve().parent == folder.resolve():
        # a stable name: the header text must not name the (per-build) folder
        command = re.sub(re.escape(source) + r"(?=\s|$)", Path(source).name, command)
    keep = folder / "nvcc"
    keep.mkdir(exist_ok=True)
    lines = dryrun_lines(command, folder, Path(keep.name))
    index = host_compile_index(lines)
    if index is None:
        run_commands([("cuda:nvcc", command)], folder, cache, log)
        return "host-pch:not-split"
    env = phase_env(lines)
    front = next((k for k in range(index) if lines[k].startswith("cudafe++")), None)
    if front is None:
        run_phases(lines[:index], folder, cache, log, env, after)
        header = _prepare_host(lines[index], folder, keep, cache, env)
    else:
        run_phases(lines[:front + 1], folder, cache, log, env, after)
        # cudafe++ has written the host side and the module id: a missing header is made
        # while cicc and ptxas work on the device side (the first builds of a batch wait
        # for it, so this is their critical path)
        steps = current_steps()

        def prepare():
            with recording(steps):
                return _prepare_host(lines[index], folder, keep, cache, env)

        with ThreadPoolExecutor(max_workers=1) as pool:
            pending = pool.submit(prepare)
            run_phases(lines[front + 1:index], folder, cache, log, env)
            header = pending.result()
    note = _host_pass(lines[index], header, folder, cache, log, env)
    if index + 1 < len(lines):
        run_phases(lines[index + 1:], folder, cache, log, env)
    return note


def _prepare_host(line: str, folder: Path, keep: Path, cache: Path, env: dict) -> dict:
    """Cut cudafe++'s output and make sure its header part is precompiled."""
    try:
        argv = shlex.split(line)
    except ValueError:
        argv = []
    parts = _split_unit(argv, folder, keep) if argv and "$" not in line else None
    if parts is None:
        return {"state": "plain"}
    inp, out, prefix, suffix, source, original = parts
    base = [a for k, a in enumerate(argv) if k not in (inp, out, out - 1)]
    digest = hashlib.sha256(json.dumps([prefix, base]).encode()).hexdigest()[:24]
    header_dir = cache / "pch-cuda-host" / digest
    try:
        state = _ensure_header(header_dir, prefix, base, folder, cache, env)
    except OSError as exc:
        state = f"error:{exc.__class__.__name__}"
    return {"state": state, "argv": argv, "source": source, "original": original,
            "unit": f'#include "{header_dir / "prefix.h"}"\n{suffix}'}


def _host_pass(line: str, header: dict, folder: Path, cache: Path, log: list[str],
               env: dict) -> str:
    plain = [("cuda:host-compile", line)]
    state = header["state"]
    if state not in ("hit", "built"):
        run_commands(plain, folder, cache, log, env)
        return f"host-pch:{state}"
    # The unit takes cudafe1.cpp's place (same folder for its quoted includes, same file
    # name for the names gcc derives from it); the original comes back for a plain pass.
    header["source"].write_text(header["unit"])
    try:
        with recoverable():  # a failure here falls back to the plain pass
            output = run_commands([("cuda:host-compile", shlex.join(header["argv"]
                                                                    + ["-Winvalid-pch"]))],
                                  folder, cache, log, env)
    except StepError as exc:
        log.append(f"host pass against the precompiled header failed; plain pass: {exc}")
        header["source"].write_text(header["original"])
        run_commands(plain, folder, cache, log, env)
        return "host-pch:fallback"
    if "invalid" in output and ".gch" in output:
        return f"host-pch:{state}-unused"
    return f"host-pch:{state}"


def _split_unit(argv: list[str], folder: Path, keep: Path):
    """(input index, output index, header text, unit text, path, original text), the module
    id replaced by its placeholder in both parts."""
    try:
        out = argv.index("-o") + 1
    except ValueError:
        return None
    inp = next((k for k, a in enumerate(argv) if a.endswith(".cudafe1.cpp")), None)
    ids = list(keep.glob("*.module_id"))
    if inp is None or out >= len(argv) or len(ids) != 1:
        return None
    module_id = ids[0].read_text().strip()
    source = Path(argv[inp])
    source = source if source.is_absolute() else folder / source
    if not module_id or not source.is_file():
        return None
    text = source.read_text()
    first = text.split("\n", 1)[0]
    match = re.match(r'^# 1 ("[^"]+")$', first)
    if not match:
        return None
    marker = re.compile(r'\n# \d+ ' + re.escape(match.group(1)) + r'\n')
    found = marker.search(text, len(first))
    if found is None:
        return None
    prefix, suffix = text[:found.start() + 1], text[found.start() + 1:]
    prefix = prefix.replace(module_id, placeholder(module_id))
    suffix = suffix.replace(module_id, placeholder(module_id))
    return inp, out, prefix, suffix, source, text


def _ensure_header(header_dir: Path, prefix: str, base: list[str], folder: Path,
                   cache: Path, env: dict) -> str:
    gch = header_dir / "prefix.h.gch"
    if _header_healthy(header_dir, cache):
        return "hit"
    if (header_dir / "failed").is_file():
        return "failed-before"
    root = header_dir.parent
    root.mkdir(parents=True, exist_ok=True)
    if not header_dir.is_dir() and sum(1 for e in root.iterdir() if e.is_dir()) >= MAX_HOST_HEADERS:
        return "full"
    seen = root / f"{header_dir.name}.seen"
    if not header_dir.is_dir() and not seen.is_file():
        # made on a prefix's second build: minimal preludes vary with the operators a source
        # names, and a header made for a prefix never seen again costs three plain passes
        seen.touch()
        return "first-seen"
    header_dir.mkdir(exist_ok=True)
    with open(header_dir / "lock", "w") as lock:
        wait_for_lock(lock)  # waits, holding no CPU slot, for a builder making it
        if _header_healthy(header_dir, cache):
            return "hit"
        if (header_dir / "failed").is_file():
            return "failed-before"
        header = header_dir / "prefix.h"
        write_checked(cache, header, prefix)
        tmp = header_dir / f"prefix.h.gch.{os.getpid()}"
        cmd = [a for a in base if a != "-c"]
        for k in range(len(cmd) - 1):
            if cmd[k] == "-x":
                cmd[k + 1] = "c++-header"
        with cpu_slot(cache):
            returncode, _, stderr, wall, cpu = run_measured(cmd + [str(header), "-o", str(tmp)],
                                                            folder, env)
        record_step("pch:cuda-host", wall, cpu, returncode == 0)
        if returncode != 0 or not tmp.is_file():
            tmp.unlink(missing_ok=True)
            (header_dir / "failed").write_text(stderr[-4000:])
            return "failed"
        record_hash(cache, gch, file_digest(tmp))
        os.replace(tmp, gch)
        return "built"


def _header_healthy(header_dir: Path, cache: Path) -> bool:
    """The precompiled prefix and its text are there and match their hashes (a damaged one
    is removed, to be made again)."""
    return (checked_or_removed(cache, header_dir / "prefix.h.gch")
            and checked_or_removed(cache, header_dir / "prefix.h"))
