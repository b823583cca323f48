import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 512
HIDDEN = 2048


class Model(nn.Module):
    """SwiGLU gate: split the last dimension in two halves a, b and return silu(a) * b."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        a, b = x.chunk(2, dim=-1)
        return F.silu(a) * b


def get_inputs():
    return [torch.randn(BATCH, 2 * HIDDEN)]


def get_init_inputs():
    return []
