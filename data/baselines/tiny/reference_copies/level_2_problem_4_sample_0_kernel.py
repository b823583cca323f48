import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 512
DIM = 2048


class ModelNew(nn.Module):
    """Hardswish, residual add, then clamp to [-1, 1]."""

    def __init__(self):
        super().__init__()

    def forward(self, x, residual):
        return torch.clamp(F.hardswish(x) + residual, -1.0, 1.0)


def get_inputs():
    return [torch.randn(BATCH, DIM) * 3.0, torch.randn(BATCH, DIM) * 0.5]


def get_init_inputs():
    return []
