import torch
import torch.nn as nn

BATCH = 4
WIDTH = 32
DEPTH = 16


class Model(nn.Module):
    """A deep, narrow stack of Linear + ReLU layers on a small batch."""

    def __init__(self, width, depth):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(width, width) for _ in range(depth)])

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def get_inputs():
    return [torch.randn(BATCH, WIDTH)]


def get_init_inputs():
    return [WIDTH, DEPTH]
