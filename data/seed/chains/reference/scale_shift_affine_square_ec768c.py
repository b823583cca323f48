import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x * 1.5
        x = x - 2.0
        x = x * 1.5 - 2.0
        x = x * x
        return x


def get_inputs():
    return [torch.randn(256, 1024)]


def get_init_inputs():
    return []
