import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = torch.abs(x)
        x = torch.relu(x)
        x = x * 3.0 + 1.0
        x = x - 2.0
        return x


def get_inputs():
    return [torch.randn(2048, 4096)]


def get_init_inputs():
    return []
