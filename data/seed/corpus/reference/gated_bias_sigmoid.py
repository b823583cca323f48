import torch
import torch.nn as nn

BATCH = 512
DIM = 2048


class Model(nn.Module):
    """Sigmoid gate with a learnable bias: sigmoid(x + bias) * y."""

    def __init__(self, dim):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim) * 0.1)

    def forward(self, x, y):
        return torch.sigmoid(x + self.bias) * y


def get_inputs():
    return [torch.randn(BATCH, DIM), torch.randn(BATCH, DIM)]


def get_init_inputs():
    return [DIM]
