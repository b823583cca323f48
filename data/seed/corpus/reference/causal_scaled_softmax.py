import torch
import torch.nn as nn

BATCH = 4
HEADS = 8
SEQ = 128
SCALE = 0.125


class Model(nn.Module):
    """Attention-score softmax: scale, causal mask, softmax over keys."""

    def __init__(self, seq_len, scale):
        super().__init__()
        self.scale = scale
        mask = torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool), diagonal=1)
        self.register_buffer("causal_mask", mask)

    def forward(self, scores):
        scores = scores * self.scale
        scores = scores.masked_fill(self.causal_mask, float("-inf"))
        return torch.softmax(scores, dim=-1)


def get_inputs():
    return [torch.randn(BATCH, HEADS, SEQ, SEQ) * 4.0]


def get_init_inputs():
    return [SEQ, SCALE]
