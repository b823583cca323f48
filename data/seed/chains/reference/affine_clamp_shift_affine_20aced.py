import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x * 0.25 - 2.0
        x = torch.clamp(x, 0.0, 1.0)
        x = x - 1.0
        x = x * 0.5 - 0.5
        return x


def get_inputs():
    return [torch.randn(64, 2048)]


def get_init_inputs():
    return []
