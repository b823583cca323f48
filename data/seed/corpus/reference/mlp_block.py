import torch
import torch.nn as nn
import torch.nn.functional as F

TOKENS = 128
DIM = 256
HIDDEN = 1024


class Model(nn.Module):
    """Transformer MLP block with a residual: x + fc2(gelu(fc1(x)))."""

    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(x)))


def get_inputs():
    return [torch.randn(TOKENS, DIM)]


def get_init_inputs():
    return [DIM, HIDDEN]
