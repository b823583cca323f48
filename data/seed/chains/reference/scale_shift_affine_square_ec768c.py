import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x1 = x * 1.5
        x2 = x1 - 2.0
        x3 = x2 * 1.5 - 2.0
        x4 = x3 * x3
        return x4


def get_inputs():
    return [torch.randn(256, 1024)]


def get_init_inputs():
    return []
