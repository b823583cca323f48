"""Which GPUs the harness may use: the parent's CUDA_VISIBLE_DEVICES, respected everywhere.

`settings.devices` and torch's device numbers are logical: index i is the i-th entry of the
parent's visible list. A worker gets its own CUDA_VISIBLE_DEVICES naming that entry as the
parent named it (an index, a GPU-/MIG- UUID), so under CUDA_VISIBLE_DEVICES=2,3 the workers
run on physical GPUs 2 and 3, not 0 and 1.
"""

from __future__ import annotations

import os

from .errors import HarnessError

ENV = "CUDA_VISIBLE_DEVICES"


def visible_list(value: str | None) -> list[str] | None:
    """The parent's visible devices as written (None: the variable is unset, all are visible).

    As the CUDA runtime reads it: entries up to the first empty or invalid one count.
    """
    if value is None:
        return None
    entries = []
    for entry in value.split(","):
        entry = entry.strip()
        if not entry or not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
            break
        entries.append(entry)
    return entries


def worker_device_ids(logical: tuple[int, ...] | list[int] | None, count: int,
                      parent_value: str | None) -> list[str]:
    """CUDA_VISIBLE_DEVICES values for one device worker per logical GPU.

    `logical`: settings.devices (None: every visible GPU); `count`: how many GPUs the parent
    sees; `parent_value`: the parent's CUDA_VISIBLE_DEVICES (None when unset).
    """
    indices = list(range(count)) if logical is None else list(logical)
    visible = visible_list(parent_value)
    out = []
    for index in indices:
        if not 0 <= index < count:
            raise HarnessError(f"harness devices: GPU {index} is not visible (this process "
                               f"sees {count}; {ENV}={parent_value!r}). Use indices 0..{count - 1}.")
        out.append(visible[index] if visible is not None else str(index))
    return out


def visible_count() -> int:
    """How many GPUs this process may use (torch's count, which follows the parent's list)."""
    visible = visible_list(os.environ.get(ENV))
    if visible is not None and not visible:
        return 0
    import torch

    return torch.cuda.device_count()


def nvidia_smi_selector(parent_value: str | None) -> list[str] | None:
    """`-i` arguments that make nvidia-smi describe only the visible GPUs.

    [] when every GPU is visible; None when nvidia-smi cannot select them (MIG instances):
    ask torch instead. Indices in the list follow nvidia-smi's PCI order, which is CUDA's
    order too unless CUDA_DEVICE_ORDER=FASTEST_FIRST ranks unlike GPUs differently; the
    architectures asked about are then still those of visible GPUs whenever all are alike.
    """
    visible = visible_list(parent_value)
    if visible is None:
        return []
    if any(entry.startswith("MIG-") for entry in visible):
        return None
    return ["-i", ",".join(visible)] if visible else None
