import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x1 = torch.relu(x)
        x2 = x1 * -2.0 - 2.0
        x3 = torch.relu(x2)
        x4 = torch.nn.functional.leaky_relu(x3, 0.01)
        return x4


def get_inputs():
    return [torch.randn(64, 2048)]


def get_init_inputs():
    return []
