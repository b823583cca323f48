import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x1 = x - 0.5
        x2 = torch.nn.functional.leaky_relu(x1, 0.2)
        x3 = x2 * 0.5 + 0.1
        x4 = torch.relu(x3)
        return x4


def get_inputs():
    return [torch.randn(256, 1024)]


def get_init_inputs():
    return []
