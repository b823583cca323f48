import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 512
DIM = 2048
ALPHA = 0.7


class Model(nn.Module):
    """ELU with a configurable alpha."""

    def __init__(self, alpha):
        super().__init__()
        self.alpha = alpha

    def forward(self, x):
        return F.elu(x, alpha=self.alpha)


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return [ALPHA]
