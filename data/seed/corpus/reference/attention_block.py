import math

import torch
import torch.nn as nn

BATCH = 2
SEQ = 128
EMBED = 256
HEADS = 4


class Model(nn.Module):
    """Multi-head self-attention: fused QKV projection, softmax attention, output projection."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x):
        batch, seq, embed = x.shape
        head_dim = embed // self.num_heads
        qkv = self.qkv(x).reshape(batch, seq, 3, self.num_heads, head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(head_dim))
        weights = torch.softmax(scores, dim=-1)
        out = (weights @ v).transpose(1, 2).reshape(batch, seq, embed)
        return self.proj(out)


def get_inputs():
    return [torch.randn(BATCH, SEQ, EMBED)]


def get_init_inputs():
    return [EMBED, HEADS]
