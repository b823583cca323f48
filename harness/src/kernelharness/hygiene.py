"""Worker hygiene: what a device worker holds after a job, and when to replace it.

A job may leave memory behind (a `cudaMalloc` or `malloc` never freed, a global list). The
next job on that worker would then run with less memory than a fresh worker has, and its row
would depend on which jobs ran before it. So after every job the orchestrator compares what
the worker holds with what it held when it started, replaces a worker that holds more than
a leak limit, and re-runs once on a fresh worker a job that failed for want of memory (or
with a CUDA error) on a worker that held any excess at all.
  host: the process's anonymous resident memory, read from /proc by the orchestrator,
        against its value when the worker became ready;
  GPU:  the device's used memory at the driver level (what `cudaMalloc` took counts, not
        only torch's allocator), which the worker reads after `empty_cache` right before
        and right after each job. The device is shared (an RL trainer may sit on the same
        GPU and grow between jobs), so the excess is the sum of the per-job changes, not
        the difference to the start: what others allocate between jobs never counts.
"""

from __future__ import annotations

MB = 2**20
# Below this, what a worker holds after a job is its own working state (an extension's code,
# allocator and library caches, thread stacks), not something a job left behind.
SLACK_MB = 128.0
MEMORY_FAILURE_MARKERS = (
    "out of memory", "OutOfMemoryError", "MemoryError", "std::bad_alloc", "CUDA error",
    "cudaErrorMemoryAllocation", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED",
    "illegal memory access", "unspecified launch failure",
)


def memory_report(device: str) -> dict:
    """Inside a worker: the memory it holds now (device memory after releasing torch's cache).

    host_mb is also read from /proc by the orchestrator (candidate code cannot fake that one);
    device_used_mb is what the driver says is in use on this worker's GPU.
    """
    report = {"host_mb": process_host_mb("self")}
    if device == "cuda":
        try:
            import torch

            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            free, total = torch.cuda.mem_get_info()
            report.update(device_used_mb=(total - free) / MB, device_total_mb=total / MB)
        except Exception as exc:  # a broken context: the job's `fatal` hint replaces the worker
            report["device_error"] = repr(exc)[:200]
    return report


def process_host_mb(pid: int | str) -> float | None:
    """Anonymous resident memory of a process in MB (None when it is gone).

    Anonymous only: what malloc, Python objects and tensors hold. Libraries a job makes the
    process load (cuDNN's engines are hundreds of MB) are file-backed and shared, no leak,
    so a worker is not replaced for them.
    """
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def leak_limits_mb(memory_limit_mb: int, device_total_mb: float | None) -> dict:
    """Excess over the baseline at which a worker is replaced, per kind of memory.

    Host: a sixteenth of the worker's memory limit, at most 1 GiB (the limit is sized for
    KernelBench's largest reference, 64 GiB, and a worker holding 4 GiB more than at start
    would carry that into the next job). GPU: a twentieth of the device (7 GB on an H200)
    but at least 1 GiB, since cuDNN and cuBLAS handles that an honest job creates stay with
    the context.
    """
    limits = {"host_mb": min(1024.0, max(2 * SLACK_MB, memory_limit_mb / 16.0))}
    if device_total_mb:
        limits["device_used_mb"] = max(1024.0, device_total_mb / 20.0)
    return limits


def excess_mb(baseline: dict, now: dict, previous: dict | None = None) -> dict:
    """How much more than at start the worker holds, per kind of memory (never negative).

    `now` holds host_mb and, on cuda, device_used_before_mb/device_used_mb (the device around
    the last job); `previous` is this function's result after the job before.
    """
    out = {}
    if baseline.get("host_mb") is not None and now.get("host_mb") is not None:
        out["host_mb"] = max(0.0, float(now["host_mb"]) - float(baseline["host_mb"]))
    if now.get("device_used_mb") is not None and now.get("device_used_before_mb") is not None:
        change = float(now["device_used_mb"]) - float(now["device_used_before_mb"])
        out["device_used_mb"] = max(0.0, (previous or {}).get("device_used_mb", 0.0) + change)
    return out


def leaked(excess: dict, limits: dict) -> list[str]:
    """The kinds of memory whose excess passes its limit (empty: the worker may stay)."""
    return [f"{name[:-3]} +{value:.0f} MB" for name, value in sorted(excess.items())
            if value > limits.get(name, float("inf"))]


def holds_excess(excess: dict) -> bool:
    return any(value > SLACK_MB for value in excess.values())


def memory_failure(reply: dict) -> bool:
    """A job that failed for want of memory or with a CUDA error (a candidate for a re-run)."""
    if reply.get("op") == "failed":
        if reply.get("kind") == "memory":
            return True
        text = f"{reply.get('error', '')}\n{reply.get('log', '')}"
    else:
        text = str((reply.get("row") or {}).get("error") or "")
    return any(marker in text for marker in MEMORY_FAILURE_MARKERS)
