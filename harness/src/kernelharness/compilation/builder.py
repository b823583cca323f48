"""Build one `load_inline` spec into the content-addressed cache (runs in a builder worker).

The sources are prepared exactly as `load_inline` prepares them and torch writes its ninja
file for them; the commands in it are then run by `compile_steps` (units side by side, each
compiler in a CPU slot shared by all builders, cuda units through `nvcc_split`) in a private
temporary folder that is renamed into place when done, so two builders racing on one key
never see a half-written build and a killed build leaves no lock.
The module is never imported here: the candidate's native code runs only in device workers.
A compiler error is cached too (a source seen before never builds again); a timeout is not.

On gcc, `torch/extension.h` is precompiled once per set of compile flags into the cache
(torch's own `use_pch` writes into the torch installation and deletes it again whenever a
build does not ask for it, which breaks under parallel builds); a build that finds another
builder making it waits for it rather than parse torch's headers itself.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import inspect
import json
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

from .buildspec import build_dir, module_name, spec_uses_cuda
from .compile_steps import (
    StepError,
    cpu_slot,
    holding_line,
    record_step,
    recoverable,
    replay_failure,
    run_command,
    run_measured,
    run_steps,
    wait_for_lock,
)
from .entries import (
    check_build_folder,
    checked_entry,
    checked_or_removed,
    discard,
    file_digest,
    record_hash,
    seal_build,
    taken_repairs,
    write_checked,
)
from .nvcc_split import compile_cuda
from .options import BuildOptions
from .preludes import binding_block, binding_suspects, has_token, minimal_source, prelude_path

LOG_LIMIT = 6000


def _call_filtered(fn, **kwargs):
    """Call a private torch helper with only the keyword arguments its version accepts."""
    params = inspect.signature(fn).parameters
    return fn(**{k: v for k, v in kwargs.items() if k in params})


def write_sources(spec: dict, folder: Path) -> list[str]:
    """main.cpp (+ cuda.cu) as load_inline writes them, bindings included."""
    cpp = list(spec["cpp_sources"])
    if not spec["no_implicit_headers"]:
        cpp.insert(0, "#include <torch/extension.h>")
    functions = spec["functions"]
    if functions is not None:
        if isinstance(functions, list):
            functions = {f: f for f in functions}
        cpp.append("PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {")
        for fname, doc in functions.items():
            target = (f"torch::wrap_pybind_function({fname})" if spec["with_pytorch_error_handling"]
                      else fname)
            cpp.append(f'm.def("{fname}", {target}, "{doc}");')
        cpp.append("}")
    sources = [folder / "main.cpp"]
    sources[0].write_text("\n".join(cpp))
    if spec["cuda_sources"]:
        cuda = list(spec["cuda_sources"])
        if not spec["no_implicit_headers"]:
            cuda[:0] = ["#include <torch/types.h>", "#include <cuda.h>",
                        "#include <cuda_runtime.h>"]
        sources.append(folder / "cuda.cu")
        sources[1].write_text("\n".join(cuda))
    return [str(s) for s in sources]


def build_spec(spec: dict, key: str, cache: Path, options: BuildOptions) -> dict:
    """Build into cache/ext/<key>/ unless already there; return the status dict.

    The options change how a source compiles, not what it computes, so they are not part of
    the key (options.py; nvcc_split.compile_cuda and preludes)."""
    final = build_dir(cache, key)
    status, damage = check_build_folder(final)
    if status is not None:
        return status
    if damage:  # the orchestrator reports it (pools.BuildService); here it is only replaced
        discard(cache, final)
    tmp_root = cache / "tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    _clean_stale_tmp(tmp_root)
    tmp = tmp_root / f"{key}.{os.getpid()}.{time.monotonic_ns()}"
    tmp.mkdir()
    start = time.monotonic()
    steps: list[dict] = []
    status = _compile(spec, key, tmp, cache, options, steps)
    status["seconds"] = round(time.monotonic() - start, 3)
    status["steps"] = steps  # one record per compiler run (compile_steps.record_step)
    repaired = taken_repairs()
    for junk in list(tmp.glob("*.o")) + list(tmp.glob("*.o.d")) + list(tmp.glob(".ninja_*")):
        junk.unlink(missing_ok=True)
    shutil.rmtree(tmp / "nvcc", ignore_errors=True)  # nvcc's intermediates: ~50 MB a build
    # the module's hash and the status's own, inside the folder that is renamed into place
    module = [f"{module_name(key)}.so"] if status["ok"] else []
    (tmp / "status.json").write_text(json.dumps(seal_build(status, tmp, module)))
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(tmp, final)
    except OSError:  # another builder finished the same key first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
        theirs, _damage = check_build_folder(final)
        if theirs is not None:
            status = theirs
    if repaired:  # reported by the orchestrator, not kept in status.json
        status = dict(status, repaired=repaired)
    return status


def _compile(spec: dict, key: str, folder: Path, cache: Path, options: BuildOptions,
             steps: list | None = None) -> dict:
    name = module_name(key)
    with_cuda = spec_uses_cuda(spec)
    sources = write_sources(spec, folder)
    pch_dir = None
    if options.use_pch and _compiler_is_gcc():
        pch_dir = cache / "pch" / _pch_signature(spec, with_cuda)
    status = _run_build(spec, name, sources, folder, with_cuda, pch_dir, cache, options, steps)
    if not status["ok"] and pch_dir is not None and _PCH_TROUBLE.search(status["log_tail"]):
        status = _run_build(spec, name, sources, folder, with_cuda, None, cache,  # safety net
                            options, steps)
        status["pch"] = "pch:retried-without"
    return status


# A failure that may come from the precompiled header rather than the candidate's source:
# gcc naming the .gch or refusing it, or the header itself not found. Not any error whose
# include chain passes through torch/extension.h (every error in main.cpp does): retrying
# those compiled every broken candidate twice, nvcc included.
_PCH_TROUBLE = re.compile(r"\.gch\b|precompiled header|torch/extension\.h: No such file")


def _run_build(spec: dict, name: str, sources: list[str], folder: Path, with_cuda: bool,
               pch_dir: Path | None, cache: Path, options: BuildOptions,
               steps: list | None = None) -> dict:
    from torch.utils import cpp_extension as ce

    include_paths = list(spec["extra_include_paths"])
    notes = ["pch:off"]
    if pch_dir is not None:
        include_paths.insert(0, str(pch_dir))
    ninja_file = folder / "build.ninja"
    try:
        ldflags = _call_filtered(ce._prepare_ldflags, extra_ldflags=list(spec["extra_ldflags"]),
                                 with_cuda=with_cuda, with_sycl=False, verbose=False,
                                 is_standalone=False)
        _call_filtered(ce._write_ninja_file_to_build_library, path=str(ninja_file),
                       name=name, sources=sources, extra_cflags=list(spec["extra_cflags"]),
                       extra_cuda_cflags=list(spec["extra_cuda_cflags"]), extra_sycl_cflags=[],
                       extra_ldflags=ldflags, extra_include_paths=include_paths,
                       with_cuda=with_cuda, with_sycl=False, is_python_module=True,
                       is_standalone=False, torch_exclude=False)

        def before_compile(step: dict) -> str | None:
            if pch_dir is None or step["rule"] != "compile":
                return None
            return _ensure_pch(ninja_file, pch_dir, cache)

        def host_compile(step: dict, log: list[str]) -> str | None:
            """main.cpp's bindings checked (see preludes), then main.cpp against its minimal
            prelude, then as written."""
            source = Path(step["in"][0]) if step["in"] else None
            if source is not None and not source.is_absolute():
                source = folder / source
            text = source.read_text() if source is not None and source.is_file() else ""
            full_only = bool(text) and _check_bindings(step, source, text, ninja_file, folder,
                                                       cache, log)
            minimal = minimal_source(text, cache, binding=True) if text and not full_only \
                else None
            if minimal is not None:
                header = ""
                if pch_dir is not None:
                    header = _ensure_prelude_pch(prelude_path(minimal), ninja_file, cache,
                                                 wait=options.wait_for_prelude_header)
                source.write_text(minimal)  # the same line count
                try:
                    with recoverable():  # its failure is not the build's: as written next
                        shared = compile_host_object(step, folder, cache, log, name, minimal,
                                                     share=options.share_host_objects)
                    return ",".join(n for n in ("host:minimal-headers", header, shared) if n)
                except StepError as exc:
                    log.append(f"main.cpp with minimal headers failed; as written: {exc}")
                finally:
                    source.write_text(text)
            with holding_line(full_only):  # likely to fail: its cuda unit waits, PCH wait too
                note = before_compile(step)
                shared = compile_host_object(step, folder, cache, log, name, text,
                                             share=options.share_host_objects)
            full = "host:full-headers" if minimal or full_only else None
            return ",".join(n for n in (note, full, shared) if n)

        def cuda_compile(step: dict, log: list[str]) -> str:
            return compile_cuda(step, folder, cache, log, options.light_headers,
                                options.minimal_headers, slim_ops=options.slim_op_headers)

        notes = run_steps(ninja_file, cache, before_compile, cuda_compile, steps,
                          host_compile if options.minimal_headers else None) or notes
    except (StepError, RuntimeError, OSError, subprocess.SubprocessError) as exc:
        return {"ok": False, "log_tail": _tail(str(exc)), "pch": ",".join(notes)}
    if not (folder / f"{name}.so").is_file():
        return {"ok": False, "log_tail": "the build produced no module file",
                "pch": ",".join(notes)}
    return {"ok": True, "log_tail": "", "pch": ",".join(sorted(notes))}


# main.cpp objects shared between builds (BuildOptions.share_host_objects). A build's main.cpp is the
# candidate's cpp_sources and bindings: rollouts of one task, which differ in their kernels,
# mostly write the same declarations (the template author's 48 builds have 4 main.cpp texts),
# and a main.cpp costs 4 CPU-s against its precompiled prelude (pybind11's code, at -O0).
# The object depends on the text, the command and the module's name (TORCH_EXTENSION_NAME,
# one per build): it is compiled once with a placeholder name of the same length into the
# cache, and each build takes a copy with its own name written over the placeholder, which
# is the object a compile with that name makes (harness/tests/test_build_steps.py checks it
# byte for byte). A compiler error is shared too. Off: every build compiles its main.cpp
# (what bench/build_breakdown.py's `no-shared-host` variant measures).
# what makes the object depend on more than the text and the command: the file's own path
# or the time, a file beside it (a relative quoted include, a computed one; an absolute one,
# as of the minimal prelude, names the same file in every build), the name used otherwise
_UNSHAREABLE = re.compile(r'__FILE__|__BASE_FILE__|__FILE_NAME__|__DATE__|__TIME__|'
                          r'__TIMESTAMP__|#\s*(?:include|include_next|import|embed)\b(?!\s*(?:<|"/))|'
                          r'__has_include(?:_next)?\s*\(\s*(?!<|"/)')
_MODULE_BLOCK = re.compile(r"\bPYBIND11_MODULE\s*\(\s*TORCH_EXTENSION_NAME\s*,")


def _placeholder_name(name: str) -> str:
    """A stand-in module name of the same length that no build key can spell (keys are hex)."""
    return name[:3] + "Z" * (len(name) - 3)


def host_object_shareable(text: str) -> bool:
    """Whether a main.cpp's object depends only on its text and command (and its name only
    through PYBIND11_MODULE)."""
    uses = len(re.findall(r"\bTORCH_EXTENSION_NAME\b", text))
    return not _UNSHAREABLE.search(text) and uses == len(_MODULE_BLOCK.findall(text))


def compile_host_object(step: dict, folder: Path, cache: Path, log: list[str], name: str,
                        text: str, share: bool = True) -> str:
    """Compile main.cpp (`text` is what the file holds now), or take the object another build
    made of the same text and command (`share`: BuildOptions.share_host_objects); returns a
    note."""
    command, source, out = step["command"], step["in"][0] if step["in"] else "", step["out"]
    flag = f"-DTORCH_EXTENSION_NAME={name}"
    placeholder = _placeholder_name(name)
    shared = command.replace(flag, f"-DTORCH_EXTENSION_NAME={placeholder}")
    if source:  # the unit by its name (the build runs in its folder): no per-build path
        shared = re.sub(re.escape(source) + r"(?=\s|$)", Path(source).name, shared)
    if (not share or not name.startswith("dp_") or command.count(flag) != 1
            or Path(out).is_absolute() or str(folder) in shared
            or str(folder.resolve()) in shared or placeholder in text
            or not host_object_shareable(text)):
        run_command(command, folder, cache, log, step="host")
        return ""
    key = hashlib.sha256(json.dumps([shared, text, _toolchain_identity(shared)]).encode()
                         ).hexdigest()[:32]
    entry = cache / "host-objects" / key[:2] / key
    entry.parent.mkdir(parents=True, exist_ok=True)
    obj = folder / out
    note = _take_host_object(entry, obj, placeholder, name, folder, log, cache)
    if note:
        return note
    with open(entry.with_suffix(".lock"), "w") as lock:
        wait_for_lock(lock)  # another build compiling it: its cuda unit goes ahead meanwhile
        note = _take_host_object(entry, obj, placeholder, name, folder, log, cache)
        if note:
            return note
        try:
            run_command(shared, folder, cache, log, step="host")
        except StepError as exc:
            message = str(exc)
            # the compiler's verdict on the text (exit 1, an error at a line of a file), not
            # a killed, crashed or starved compiler: only that one is the next build's too
            if (message.startswith("command failed (exit 1)") and _LOCATED_ERROR.search(message)
                    and not _TRANSIENT.search(message)):
                write_checked(cache, entry.with_suffix(".fail"),
                              message.replace(str(folder), "{build}").encode())
            raise
        data = obj.read_bytes()
        write_checked(cache, entry.with_suffix(".o"), data)
        obj.write_bytes(data.replace(placeholder.encode(), name.encode()))
        return "host-object:made"


_LOCATED_ERROR = re.compile(r"^[^\s:]+:\d+:(?:\d+:)? (?:fatal )?error: ", re.MULTILINE)
# ... nor one whose precompiled header was at fault (the build is tried again without it)
_TRANSIENT = re.compile(r"No space left|Cannot allocate memory|virtual memory exhausted|"
                        r"internal compiler error|Killed signal|error writing to|\.gch\b|"
                        r"precompiled header")


@functools.lru_cache(maxsize=8)
def _toolchain_identity(command: str) -> str:
    """What the object also depends on beyond the command's text: the compiler binary it
    names (resolved, with its size and time) and its version, and the torch whose headers
    it includes by path (a reinstalled torch or compiler makes other objects)."""
    import torch

    try:
        compiler = shutil.which(shlex.split(command)[0]) or ""
    except (ValueError, IndexError):
        compiler = ""
    parts = [torch.__version__, str(getattr(torch.version, "git_version", "")),
             os.path.dirname(torch.__file__)]
    if compiler:
        real = os.path.realpath(compiler)
        stat = os.stat(real)
        parts += [real, str(stat.st_size), str(stat.st_mtime_ns)]
        try:
            parts.append(subprocess.run([compiler, "--version"], capture_output=True,
                                        text=True, timeout=30, check=False).stdout)
        except (OSError, subprocess.SubprocessError):
            parts.append("?")
    return "\n".join(parts)


def _take_host_object(entry: Path, obj: Path, placeholder: str, name: str, folder: Path,
                      log: list[str], cache: Path) -> str:
    """The shared object (or compiler error) of this text, checked against its hash; a
    damaged one is removed (and made again by this build)."""
    start = time.monotonic()
    made = checked_entry(cache, entry.with_suffix(".o"))
    if made is not None:
        obj.write_bytes(made.replace(placeholder.encode(), name.encode()))
        record_step("host:shared", time.monotonic() - start, 0.0)
        return "host-object:shared"
    failed = checked_entry(cache, entry.with_suffix(".fail"))
    if failed is not None:
        replay_failure("host:shared", failed.decode().replace("{build}", str(folder)), log)
    return ""




def _check_bindings(step: dict, source: Path, text: str, ninja_file: Path, folder: Path,
                    cache: Path, log: list[str]) -> bool:
    """preludes' binding check on main.cpp: raises StepError where the unit as written fails
    at its bindings; True where it should skip the minimal try (a bound name only the
    headers spell). Anything undecided (no generated block, a preprocessing error) and
    main.cpp compiles as before."""
    block = binding_block(text)
    if block is None:
        return False
    prefix, names = block
    unspelled, own_module = binding_suspects(prefix, names)
    if not unspelled and not own_module:
        return False
    cxx, cflags, post = (_ninja_variable(ninja_file, v) for v in ("cxx", "cflags", "post_cflags"))
    preprocessed = folder / "main.check.ii"
    try:
        source.write_text(prefix)
        with recoverable():
            run_command(f"{cxx or 'c++'} {cflags} -E -dD {shlex.quote(str(source))} -o "
                        f"{shlex.quote(str(preprocessed))} {post}", folder, cache, log,
                        step="host:check")
        tokens = preprocessed.read_text(errors="replace")
    except (StepError, OSError):
        return False
    finally:
        source.write_text(text)
        preprocessed.unlink(missing_ok=True)
    module = re.search(r"-DTORCH_EXTENSION_NAME=(\S+)", f"{cflags} {post}")
    if own_module and module and has_token(tokens, f"PyInit_{module.group(1)}"):
        raise StepError(
            "main.cpp defines its Python module twice: cpp_sources has its own "
            "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) block and load_inline writes another "
            "for `functions` (give functions=None with an own block, or drop the block). "
            "main.cpp: error: redefinition of "
            f"'void pybind11_init_{module.group(1)}(pybind11::module_&)'")
    absent = [n for n in unspelled if not has_token(tokens, n)]
    if absent:
        raise StepError(
            f"main.cpp binds {', '.join(absent)}, which neither its cpp_sources nor the "
            "headers it includes declare (load_inline's `functions` name functions that "
            "cpp_sources must declare; a definition in cuda_sources is not seen by main.cpp). "
            + "; ".join(f"main.cpp: error: '{n}' was not declared in this scope"
                        for n in absent))
    return bool(unspelled)


def _tail(text: str) -> str:
    return text if len(text) <= LOG_LIMIT else "..." + text[-LOG_LIMIT:]


def _compiler_is_gcc() -> bool:
    cxx = os.environ.get("CXX", "c++")
    try:
        out = subprocess.run([cxx, "-v"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.SubprocessError):
        return False
    return "gcc version" in out


def _pch_signature(spec: dict, with_cuda: bool) -> str:
    import torch

    blob = json.dumps([torch.__version__, os.environ.get("CXX", "c++"), spec["extra_cflags"],
                       spec["extra_include_paths"], with_cuda])
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def _ensure_pch(ninja_file: Path, pch_dir: Path, cache: Path) -> str:
    """Precompile torch/extension.h with this build's exact flags, once per flag set.

    A build that finds another builder making it waits (holding no CPU slot): the header
    takes one parse of torch's headers, and compiling without it would take the same again.
    """
    target = pch_dir / "torch" / "extension.h.gch"
    if (pch_dir / "torch" / "extension.h").exists() and checked_or_removed(cache, target):
        return "pch:hit"
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(pch_dir / "lock", "w") as lock:
        wait_for_lock(lock)
        if (pch_dir / "torch" / "extension.h").exists() and checked_or_removed(cache, target):
            return "pch:hit"
        if (pch_dir / "failed").is_file():
            return "pch:failed"
        cflags = _ninja_variable(ninja_file, "cflags")
        flags = [f for f in shlex.split(cflags) if not f.startswith("-DTORCH_EXTENSION_NAME=")]
        from torch.utils import cpp_extension as ce

        header = os.path.join(ce._TORCH_PATH, "include", "torch", "extension.h")
        link = pch_dir / "torch" / "extension.h"
        if checked_or_removed(cache, target):  # made by an older builder, without the link
            os.symlink(header, link)
            return "pch:hit"
        tmp = target.with_name(f"extension.h.gch.{os.getpid()}")
        cxx = os.environ.get("CXX", "c++")
        with cpu_slot(cache):
            returncode, _, stderr, wall, cpu = run_measured(
                [cxx, *flags, "-x", "c++-header", header, "-o", str(tmp)], None)
        record_step("pch:host", wall, cpu, returncode == 0)
        if returncode != 0 or not tmp.is_file():
            tmp.unlink(missing_ok=True)
            (pch_dir / "failed").write_text(stderr[-4000:])
            return "pch:failed"
        # A source that includes torch/extension.h a second time makes gcc look for the
        # header beside its .gch: the link sends it to the real one (#pragma once holds).
        if not link.exists():
            os.symlink(header, link)
        record_hash(cache, target, file_digest(tmp))
        os.rename(tmp, target)
        return "pch:built"


def _ensure_prelude_pch(header: Path | None, ninja_file: Path, cache: Path,
                        wait: bool = True) -> str:
    """Precompile a minimal prelude (preludes.py) with this build's flags, once per flag set.

    gcc looks for `<header>.gch` beside a header included first and, when that is a folder,
    uses the first file in it made with matching options: one file a flag set, so builds
    with other flags share the folder. It is made the second time a (prelude, flags) pair is
    used: the first build compiles plainly, so a prelude used once costs no header. A build
    that finds another builder making it waits for it (`wait`:
    BuildOptions.wait_for_prelude_header; bench/build_breakdown.py's `no-prelude-wait`
    variant turns it off), holding no CPU
    slot: its main.cpp leaves the line (compile_steps.HostFirst), so its cuda unit compiles
    meanwhile, and main.cpp then takes 3-4 CPU-s against the header instead of 7-9 plainly
    (H200: 14 such units in a cold 48-build run, before the wait:
    docs/journal/2026-12-04-build-cut-slim-ops.md). Off, it compiles plainly at once
    ("prelude-pch:busy"). A failed header is not tried again."""
    if header is None or not header.is_file():
        return ""
    cflags = _ninja_variable(ninja_file, "cflags")
    flags = [f for f in shlex.split(cflags) if not f.startswith("-DTORCH_EXTENSION_NAME=")]
    cxx = os.environ.get("CXX", "c++")
    digest = hashlib.sha256(json.dumps([cxx, flags]).encode()).hexdigest()[:16]
    folder = header.with_name(header.name + ".gch")
    target = folder / digest
    failed = header.with_name(f"{header.name}.{digest}.failed")
    if checked_or_removed(cache, target):
        return "prelude-pch:hit"
    if failed.is_file():
        return "prelude-pch:failed-before"
    seen = header.with_name(f"{header.name}.{digest}.seen")
    if not seen.is_file():  # made on its second use: a prelude seen once costs no header
        seen.touch()
        return "prelude-pch:first-seen"
    folder.mkdir(exist_ok=True)
    with open(header.with_name(f"{header.name}.{digest}.lock"), "w") as lock:
        waited = False
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another builder is making it
            if not wait:
                return "prelude-pch:busy"
            wait_for_lock(lock)
            waited = True
        if checked_or_removed(cache, target):
            return "prelude-pch:waited" if waited else "prelude-pch:hit"
        if failed.is_file():
            return "prelude-pch:failed-before"
        tmp = header.with_name(f"{header.name}.{digest}.{os.getpid()}.tmp")
        with cpu_slot(cache):
            returncode, _, stderr, wall, cpu = run_measured(
                [cxx, *flags, "-x", "c++-header", str(header), "-o", str(tmp)], None)
        record_step("pch:prelude", wall, cpu, returncode == 0)
        if returncode != 0 or not tmp.is_file():
            tmp.unlink(missing_ok=True)
            failed.write_text(stderr[-4000:])
            return "prelude-pch:failed"
        record_hash(cache, target, file_digest(tmp))
        os.replace(tmp, target)
        return "prelude-pch:built"


def _ninja_variable(ninja_file: Path, name: str) -> str:
    match = re.search(rf"^{name} = (.*)$", ninja_file.read_text(), re.MULTILINE)
    return match.group(1) if match else ""


def _clean_stale_tmp(tmp_root: Path) -> None:
    """Remove temporary build folders whose builder process is gone (killed on timeout)."""
    for entry in tmp_root.iterdir():
        parts = entry.name.split(".")
        if len(parts) != 3 or not parts[1].isdigit():
            continue
        pid = int(parts[1])
        if pid == os.getpid():
            continue
        if not os.path.exists(f"/proc/{pid}"):  # not os.kill: workers may not signal others
            shutil.rmtree(entry, ignore_errors=True)
