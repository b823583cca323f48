import torch
import torch.nn as nn

M = 1024
K = 2048


class ModelNew(nn.Module):
    """Matrix-vector product: [M, K] @ [K, 1]."""

    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, 1)]


def get_init_inputs():
    return []
