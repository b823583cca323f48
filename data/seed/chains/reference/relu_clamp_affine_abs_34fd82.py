import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x1 = torch.relu(x)
        x2 = torch.clamp(x1, -3.0, 3.0)
        x3 = x2 * 0.5 - 2.0
        x4 = torch.abs(x3)
        return x4


def get_inputs():
    return [torch.randn(128, 1024)]


def get_init_inputs():
    return []
