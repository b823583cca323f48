"""What one `load_inline` call asks to build, its content key, and where the build lives.

A build's key is the hash of everything that decides the binary: the sources, the exported
functions, every flag, and the toolchain (torch version and its CUDA version, the Python ABI,
the C++ compiler and nvcc versions, and the target: the local GPU's architecture on cuda,
the CPU's instruction-set flags on cpu, since `-march=native` may be among the flags).
The extension name is not part of the key: the same source under another name is the same
binary, built once and loaded under a name derived from its key.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

from ..errors import HarnessError
from .entries import check_build_folder

# Bumped whenever the way builds are made changes, so no stale (or stale failed) build is reused.
BUILDER_VERSION = 1
SPEC_LIST_FIELDS = ("cpp_sources", "cuda_sources", "extra_cflags", "extra_cuda_cflags",
                    "extra_ldflags", "extra_include_paths")
# Flags that would run programs of the candidate's choosing inside the compiler driver.
_FORBIDDEN_FLAG = re.compile(r"^(-wrapper|-fplugin|-specs|@|-B|--compiler-bindir|-ccbin)")


def normalize_spec(args: dict) -> dict:
    """A JSON-able spec from `load_inline`'s keyword arguments (as load_inline reads them)."""
    spec: dict = {"name": str(args.get("name", "ext"))}
    for key in SPEC_LIST_FIELDS:
        value = args.get(key)
        if value is None:
            value = []
        elif isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise HarnessError(f"load_inline argument {key}: expected a string or list of strings")
        spec[key] = list(value)
    functions = args.get("functions")
    if isinstance(functions, str):
        functions = [functions]
    if isinstance(functions, tuple):
        functions = list(functions)
    if functions is not None and not isinstance(functions, (list, dict)):
        raise HarnessError("load_inline argument functions: expected a list, dict or string")
    if isinstance(functions, dict):
        functions = {str(k): str(v) for k, v in functions.items()}
    spec["functions"] = functions
    with_cuda = args.get("with_cuda")
    spec["with_cuda"] = None if with_cuda is None else bool(with_cuda)
    spec["with_pytorch_error_handling"] = bool(args.get("with_pytorch_error_handling", True))
    spec["no_implicit_headers"] = bool(args.get("no_implicit_headers", False))
    if args.get("sycl_sources"):
        raise HarnessError("load_inline sycl_sources: this harness builds C++ and CUDA only")
    if args.get("is_python_module", True) is not True:
        raise HarnessError("load_inline is_python_module=False: only Python modules are supported")
    for flag in spec["extra_cflags"] + spec["extra_cuda_cflags"] + spec["extra_ldflags"]:
        if _FORBIDDEN_FLAG.match(flag.strip()):
            raise HarnessError(f"load_inline flag {flag!r} is not allowed (it runs other programs)")
    return spec


def spec_uses_cuda(spec: dict) -> bool:
    return bool(spec["cuda_sources"]) if spec["with_cuda"] is None else spec["with_cuda"]


def spec_key(spec: dict, toolchain: dict) -> str:
    content = {k: v for k, v in spec.items() if k != "name"}
    tool = dict(toolchain)
    if not spec_uses_cuda(spec):
        tool.pop("nvcc", None)
        tool.pop("cuda_arch", None)
    blob = json.dumps({"spec": content, "toolchain": tool}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def module_name(key: str) -> str:
    return f"dp_{key[:24]}"


def build_dir(cache: Path, key: str) -> Path:
    return cache / "ext" / key[:2] / key


def so_path(cache: Path, key: str) -> Path:
    return build_dir(cache, key) / f"{module_name(key)}.so"


def check_build(cache: Path, key: str, files: bool = True) -> tuple[dict | None, str | None]:
    """(status, None) of a healthy cached build ({"ok": bool, "log_tail": str, ...}), (None,
    None) if never built, (None, why) where the entry is damaged (entries.check_build_folder:
    status.json and, with `files`, the module are checked against the hashes written with
    them)."""
    return check_build_folder(build_dir(cache, key), files)


def read_status(cache: Path, key: str, files: bool = True) -> dict | None:
    """The cached build's status, or None if never built or damaged (built again then).
    A device worker reads it with `files=False`: the orchestrator checks the module's hash
    before the job and again after any failure to load it (orchestrator.py)."""
    return check_build(cache, key, files)[0]


# --- toolchain fingerprint -----------------------------------------------------------------

def _first_line(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "absent"
    lines = [line for line in out.splitlines() if line.strip()]
    return lines[-1] if cmd[-1] == "--version" and "nvcc" in cmd[0] else (lines[0] if lines else "")


def _cpu_flags_digest() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown"
    flags = next((line for line in text.splitlines() if line.startswith(("flags", "Features"))), "")
    return hashlib.sha256(flags.encode()).hexdigest()[:16]


def local_cuda_arch() -> str | None:
    """The visible GPUs' compute capabilities ("9.0" or "8.0;9.0") without a CUDA context here."""
    from ..gpus import ENV, nvidia_smi_selector

    exe = shutil.which("nvidia-smi")
    selector = nvidia_smi_selector(os.environ.get(ENV))  # only the GPUs this process may use
    if exe and selector is not None:
        try:
            out = subprocess.run([exe, *selector, "--query-gpu=compute_cap",
                                  "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=60).stdout
            caps = sorted({line.strip() for line in out.splitlines() if re.match(r"^\d+\.\d+$",
                                                                                  line.strip())})
            if caps:
                return ";".join(caps)
        except (OSError, subprocess.SubprocessError):
            pass
    probe = ("import torch\nn=torch.cuda.device_count()\n"
             "print(';'.join(sorted({'%d.%d' % torch.cuda.get_device_capability(i) "
             "for i in range(n)})))")
    try:
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                             timeout=120).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out or None


def toolchain_fingerprint(backend: str) -> dict:
    import torch
    from torch.utils import cpp_extension

    cxx = os.environ.get("CXX", "c++")
    tool = {
        "builder": BUILDER_VERSION,
        "torch": torch.__version__,
        "torch_cuda": str(torch.version.cuda),
        "python": sys.implementation.cache_tag,
        "machine": platform.machine(),
        "cxx": _first_line([cxx, "--version"]),
        "cpu_flags": _cpu_flags_digest(),
    }
    if backend == "cuda":
        home = cpp_extension.CUDA_HOME or ""
        nvcc = os.path.join(home, "bin", "nvcc") if home else (shutil.which("nvcc") or "nvcc")
        tool["nvcc"] = _first_line([nvcc, "--version"])
        arch = os.environ.get("TORCH_CUDA_ARCH_LIST") or local_cuda_arch()
        if not arch:
            raise HarnessError("backend cuda: no GPU found (nvidia-smi and torch see none). "
                               "Run on a machine with a GPU or use backend cpu.")
        tool["cuda_arch"] = arch
    return tool
