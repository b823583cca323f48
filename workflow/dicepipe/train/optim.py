"""AdamW and learning-rate schedules (HF semantics: the factor at optimizer step i, counted
from 0, so a warm-up starts at 0)."""

from __future__ import annotations

import math

import torch

SCHEDULES = ("constant_with_warmup", "cosine", "linear")


def lr_factor(step: int, total_steps: int, warmup_steps: int, schedule: str) -> float:
    if step < warmup_steps:
        return step / max(1, warmup_steps)
    if schedule == "constant_with_warmup":
        return 1.0
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    if schedule == "linear":
        return max(0.0, 1.0 - progress)
    raise ValueError(f"unknown lr_schedule {schedule!r}; expected one of {SCHEDULES}")


def warmup_steps(total_steps: int, warmup_ratio: float) -> int:
    return math.ceil(total_steps * warmup_ratio)


def make_adamw(model: torch.nn.Module, learning_rate: float, weight_decay: float,
               fused: bool) -> torch.optim.AdamW:
    params = [p for p in model.parameters() if p.requires_grad]
    kwargs = {"fused": True} if fused else {}
    return torch.optim.AdamW(params, lr=learning_rate, betas=(0.9, 0.999), eps=1e-8,
                             weight_decay=weight_decay, **kwargs)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


@torch.no_grad()
def init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Create AdamW's state with a zero-gradient, zero-lr step, so that a checkpoint's state
    has somewhere to load into (the loaded values then replace it)."""
    saved = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = 0.0
        for p in group["params"]:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    for group, lr in zip(optimizer.param_groups, saved):
        group["lr"] = lr
