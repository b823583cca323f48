import torch
import torch.nn as nn

BATCH = 64
WIDTH = 256
BLOCKS = 3


class ModelNew(nn.Module):
    """A stack of residual blocks, each x + linear(relu(layernorm(x))), then a final LayerNorm."""

    def __init__(self, width, blocks):
        super().__init__()
        self.norms = nn.ModuleList([nn.LayerNorm(width) for _ in range(blocks)])
        self.linears = nn.ModuleList([nn.Linear(width, width) for _ in range(blocks)])
        self.final_norm = nn.LayerNorm(width)

    def forward(self, x):
        for norm, linear in zip(self.norms, self.linears):
            x = x + linear(torch.relu(norm(x)))
        return self.final_norm(x)


def get_inputs():
    return [torch.randn(BATCH, WIDTH)]


def get_init_inputs():
    return [WIDTH, BLOCKS]
