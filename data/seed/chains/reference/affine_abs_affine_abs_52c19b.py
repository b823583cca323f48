import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x * -2.0 - 0.1
        x = torch.abs(x)
        x = x * 3.0 + 0.5
        x = torch.abs(x)
        return x


def get_inputs():
    return [torch.randn(64, 2048)]


def get_init_inputs():
    return []
