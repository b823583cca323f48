import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x1 = x * -2.0 - 0.1
        x2 = torch.abs(x1)
        x3 = x2 * 3.0 + 0.5
        x4 = torch.abs(x3)
        return x4


def get_inputs():
    return [torch.randn(64, 2048)]


def get_init_inputs():
    return []
