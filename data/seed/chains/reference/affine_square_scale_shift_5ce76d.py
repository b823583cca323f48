import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x1 = x * -2.0 - 2.0
        x2 = x1 * x1
        x3 = x2 * -0.5
        x4 = x3 + 0.5
        return x4


def get_inputs():
    return [torch.randn(128, 1024)]


def get_init_inputs():
    return []
