import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x1 = torch.abs(x)
        x2 = x1 * 0.5 - 0.5
        x3 = x2 * -2.0
        x4 = x3 * -2.0 - 2.0
        return x4


def get_inputs():
    return [torch.randn(128, 2048)]


def get_init_inputs():
    return []
