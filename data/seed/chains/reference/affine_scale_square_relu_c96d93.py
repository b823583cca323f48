import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x1 = x * 2.0 - 0.5
        x2 = x1 * -0.5
        x3 = x2 * x2
        x4 = torch.relu(x3)
        return x4


def get_inputs():
    return [torch.randn(256, 1024)]


def get_init_inputs():
    return []
