import math

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 2
SEQ = 64
EMBED = 128
HEADS = 4
HIDDEN = 512


class ModelNew(nn.Module):
    """Pre-norm transformer block: x + attn(ln1(x)), then + mlp(ln2(x)), causal attention."""

    def __init__(self, embed_dim, num_heads, hidden):
        super().__init__()
        self.num_heads = num_heads
        self.ln1 = nn.LayerNorm(embed_dim)
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.out = nn.Linear(embed_dim, embed_dim)
        self.ln2 = nn.LayerNorm(embed_dim)
        self.fc1 = nn.Linear(embed_dim, hidden)
        self.fc2 = nn.Linear(hidden, embed_dim)

    def attention(self, x):
        batch, seq, embed = x.shape
        head_dim = embed // self.num_heads
        q, k, v = self.qkv(x).split(embed, dim=-1)
        q, k, v = (t.view(batch, seq, self.num_heads, head_dim).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(head_dim)
        mask = torch.ones(seq, seq, dtype=torch.bool, device=x.device).triu(1)
        weights = scores.masked_fill(mask, float("-inf")).softmax(dim=-1)
        return self.out((weights @ v).transpose(1, 2).reshape(batch, seq, embed))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def get_inputs():
    return [torch.randn(BATCH, SEQ, EMBED)]


def get_init_inputs():
    return [EMBED, HEADS, HIDDEN]
