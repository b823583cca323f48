import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x1 = x - 1.0
        x2 = x1 * -0.5 - 2.0
        x3 = torch.relu(x2)
        x4 = torch.nn.functional.leaky_relu(x3, 0.01)
        return x4


def get_inputs():
    return [torch.randn(256, 1024)]


def get_init_inputs():
    return []
