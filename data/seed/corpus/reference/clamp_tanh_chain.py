import torch
import torch.nn as nn

BATCH = 512
DIM = 2048
SCALE = 2.0
CLAMP = 1.5


class Model(nn.Module):
    """A chain of small elementwise ops: affine, clamp, tanh, affine, multiply by the input."""

    def __init__(self, scale, clamp):
        super().__init__()
        self.scale = scale
        self.clamp = clamp

    def forward(self, x):
        y = x * self.scale - 1.0
        y = torch.clamp(y, -self.clamp, self.clamp)
        y = torch.tanh(y) * 0.5 + 0.5
        return y * x


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return [SCALE, CLAMP]
