"""Process isolation for the harness's workers, applied by each worker to itself at start.

Everything here is best effort by design: a feature the OS refuses (no network namespace
without privileges, no Landlock on an old kernel, no seccomp filter on a foreign CPU) is
skipped and the list of features actually applied is reported, so every result row can say
what protected it. Only the standard library is used (ctypes for the raw system calls), so
it runs before torch is imported.

- rlimits: address space, CPU seconds, open files, file size, no core dumps, processes
  (the last is ignored by the kernel for root, hence the seccomp filter below);
- `unshare(CLONE_NEWNET)`: a network namespace with only a down loopback: no network;
- Landlock: file writes only below the given folders (and device files), no TCP, and no
  signals or abstract sockets towards processes outside the worker;
- seccomp: no new processes and no exec (threads still allowed): fork storms and
  `os.system` fail with EPERM instead of taking the machine down.
"""

from __future__ import annotations

import ctypes
import errno
import glob
import os
import platform
import resource
import signal
import struct

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.prctl.restype = ctypes.c_int

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000

_SYS_X86_64 = {"landlock_create_ruleset": 444, "landlock_add_rule": 445,
               "landlock_restrict_self": 446, "seccomp": 317}


def _syscall(name: str, *args) -> int:
    number = _SYS_X86_64[name] if platform.machine() == "x86_64" else _SYS_AARCH64[name]
    return _libc.syscall(number, *args)


# Landlock and seccomp(2) share numbers on every 64-bit Linux except x86-64.
_SYS_AARCH64 = {"landlock_create_ruleset": 444, "landlock_add_rule": 445,
                "landlock_restrict_self": 446, "seccomp": 277}


def die_with_parent() -> None:
    """Exit when the orchestrator dies, even by SIGKILL (no orphaned workers)."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:
        os._exit(1)


def set_limits(memory_mb: int | None, open_files: int, cpu_seconds: int | None,
               file_size_mb: int | None, nproc: int | None) -> list[str]:
    applied = []

    def setlim(res, value, tag):
        try:
            _soft, hard = resource.getrlimit(res)
            new_hard = hard if hard == resource.RLIM_INFINITY or hard >= value else hard
            resource.setrlimit(res, (min(value, new_hard) if new_hard != resource.RLIM_INFINITY
                                     else value, new_hard))
            applied.append(tag)
        except (ValueError, OSError):
            pass

    setlim(resource.RLIMIT_CORE, 0, "nocore")
    setlim(resource.RLIMIT_NOFILE, open_files, "nofile")
    if memory_mb:
        setlim(resource.RLIMIT_AS, memory_mb * 2**20, "as")
    if cpu_seconds:
        setlim(resource.RLIMIT_CPU, cpu_seconds, "cpu")
    if file_size_mb:
        setlim(resource.RLIMIT_FSIZE, file_size_mb * 2**20, "fsize")
    if nproc and os.geteuid() != 0:  # root ignores RLIMIT_NPROC; seccomp covers it there
        setlim(resource.RLIMIT_NPROC, nproc, "nproc")
    return applied


def extend_cpu_limit(seconds: float) -> None:
    """Allow `seconds` more CPU time from now (the soft limit is per process, cumulative)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = usage.ru_utime + usage.ru_stime
    _soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    want = int(used + seconds) + 1
    if hard != resource.RLIM_INFINITY:
        want = min(want, hard)
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (want, hard))
    except (ValueError, OSError):
        pass


def isolate_network() -> str | None:
    """A fresh network namespace: no interface but a down loopback. Needs root or userns."""
    if _libc.unshare(CLONE_NEWNET) == 0:
        return "netns"
    if _libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
        return "userns+netns"
    return None


# --- Landlock -------------------------------------------------------------------------------

_LL_WRITE_FILE = 1 << 1
_LL_FS_WRITE_RIGHTS_ABI1 = sum(1 << b for b in (1, 4, 5, 6, 7, 8, 9, 10, 11, 12))
_LL_REFER = 1 << 13  # ABI 2
_LL_TRUNCATE = 1 << 14  # ABI 3
_LL_NET_TCP = (1 << 0) | (1 << 1)  # ABI 4: bind, connect
_LL_SCOPE = (1 << 0) | (1 << 1)  # ABI 6: abstract unix sockets, signals
_LL_RULE_PATH_BENEATH = 1
_O_PATH = getattr(os, "O_PATH", 0o10000000)


def landlock_abi() -> int:
    version = _syscall("landlock_create_ruleset", None, 0, 1)
    return int(version) if version > 0 else 0


def restrict_writes(writable_dirs: list[str], device_files: list[str]) -> str | None:
    """Allow file writes only below `writable_dirs` (and to `device_files`); no TCP; scoped."""
    abi = landlock_abi()
    if abi < 1:
        return None
    fs_rights = _LL_FS_WRITE_RIGHTS_ABI1
    if abi >= 2:
        fs_rights |= _LL_REFER
    if abi >= 3:
        fs_rights |= _LL_TRUNCATE
    net_rights = _LL_NET_TCP if abi >= 4 else 0
    scoped = _LL_SCOPE if abi >= 6 else 0
    if abi >= 6:
        attr = struct.pack("QQQ", fs_rights, net_rights, scoped)
    elif abi >= 4:
        attr = struct.pack("QQ", fs_rights, net_rights)
    else:
        attr = struct.pack("Q", fs_rights)
    buf = ctypes.create_string_buffer(attr, len(attr))
    ruleset = _syscall("landlock_create_ruleset", buf, ctypes.c_size_t(len(attr)), 0)
    if ruleset < 0:
        return None
    try:
        file_rights = fs_rights & (_LL_WRITE_FILE | _LL_TRUNCATE)
        for path, rights in [(d, fs_rights) for d in writable_dirs] + \
                            [(f, file_rights) for f in device_files]:
            _add_path_rule(ruleset, path, rights)
        if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return None
        if _syscall("landlock_restrict_self", ruleset, 0) != 0:
            return None
    finally:
        os.close(ruleset)
    return f"landlock{abi}"


def _add_path_rule(ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, _O_PATH | os.O_CLOEXEC)
    except OSError:
        return
    try:
        if not os.path.isdir(path):
            rights &= _LL_WRITE_FILE | _LL_TRUNCATE  # directory rights on a file are refused
        rule = struct.pack("=Qi", rights, fd)
        buf = ctypes.create_string_buffer(rule, len(rule))
        _syscall("landlock_add_rule", ruleset, _LL_RULE_PATH_BENEATH, buf, 0)
    finally:
        os.close(fd)


def device_files() -> list[str]:
    """Device nodes a worker legitimately writes: the null sinks and the GPU's nodes."""
    names = ["/dev/null", "/dev/zero", "/dev/full", "/dev/urandom", "/dev/random"]
    names += glob.glob("/dev/nvidia*") + glob.glob("/dev/nvidia-caps/*")
    return [n for n in names if os.path.exists(n)]


# --- seccomp ----------------------------------------------------------------------------------

_AUDIT_ARCH_X86_64 = 0xC000003E
_BPF_LD_W_ABS, _BPF_JEQ, _BPF_JSET, _BPF_JGE, _BPF_RET = 0x20, 0x15, 0x45, 0x35, 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_CLONE_THREAD = 0x00010000
_NR = {"clone": 56, "fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "clone3": 435}


def _bpf(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def _no_process_filter() -> bytes:
    eperm, enosys = _RET_ERRNO | errno.EPERM, _RET_ERRNO | errno.ENOSYS
    prog = [
        _bpf(_BPF_LD_W_ABS, 0, 0, 4),  # 0: arch
        _bpf(_BPF_JEQ, 1, 0, _AUDIT_ARCH_X86_64),  # 1: x86-64 -> 3
        _bpf(_BPF_RET, 0, 0, eperm),  # 2: any other ABI (int 0x80) is refused
        _bpf(_BPF_LD_W_ABS, 0, 0, 0),  # 3: syscall number
        _bpf(_BPF_JGE, 0, 1, 0x40000000),  # 4: the x32 ABI -> refuse
        _bpf(_BPF_RET, 0, 0, eperm),  # 5
        _bpf(_BPF_JEQ, 0, 1, _NR["clone3"]),  # 6: clone3 -> ENOSYS (glibc falls back to clone)
        _bpf(_BPF_RET, 0, 0, enosys),  # 7
        _bpf(_BPF_JEQ, 4, 0, _NR["fork"]),  # 8 -> 13
        _bpf(_BPF_JEQ, 3, 0, _NR["vfork"]),  # 9 -> 13
        _bpf(_BPF_JEQ, 2, 0, _NR["execve"]),  # 10 -> 13
        _bpf(_BPF_JEQ, 1, 0, _NR["execveat"]),  # 11 -> 13
        _bpf(_BPF_JEQ, 1, 4, _NR["clone"]),  # 12: clone -> 14, anything else -> 17
        _bpf(_BPF_RET, 0, 0, eperm),  # 13
        _bpf(_BPF_LD_W_ABS, 0, 0, 16),  # 14: clone flags (low word of args[0])
        _bpf(_BPF_JSET, 1, 0, _CLONE_THREAD),  # 15: a thread -> 17, a process -> 16
        _bpf(_BPF_RET, 0, 0, eperm),  # 16
        _bpf(_BPF_RET, 0, 0, _RET_ALLOW),  # 17
    ]
    return b"".join(prog)


def forbid_new_processes() -> str | None:
    """seccomp filter (all threads): fork, vfork, exec and non-thread clone return EPERM."""
    if platform.machine() != "x86_64":
        return None
    filt = _no_process_filter()
    count = len(filt) // 8
    buf = ctypes.create_string_buffer(filt, len(filt))
    prog = struct.pack("HxxxxxxP", count, ctypes.addressof(buf))
    prog_buf = ctypes.create_string_buffer(prog, len(prog))
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return None
    flags = 1  # SECCOMP_FILTER_FLAG_TSYNC: every thread, not just this one
    if _syscall("seccomp", 1, flags, prog_buf) != 0:
        return None
    return "seccomp"


def scrubbed_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A minimal environment: no tokens, keys or proxies reach candidate code."""
    # CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER: a worker never sees a GPU its parent may
    # not use, and numbers GPUs as its parent does (device workers narrow the list further).
    keep = ("PATH", "LANG", "LC_ALL", "CUDA_HOME", "CUDA_PATH", "CC", "CXX", "LD_LIBRARY_PATH",
            "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS",
            "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.setdefault("LANG", "C.UTF-8")
    env.update({"PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1",
                "PYTHONUNBUFFERED": "1", "NCCL_NVLS_ENABLE": "0",
                # torch and a candidate extension each bring an OpenMP pool; spinning idle
                # threads of one starve the other in interleaved timing.
                "OMP_WAIT_POLICY": "PASSIVE",
                "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"})
    env.update(extra or {})
    return env
