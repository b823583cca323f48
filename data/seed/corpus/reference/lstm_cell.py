import torch
import torch.nn as nn

BATCH = 4
INPUT = 64
HIDDEN = 64


class Model(nn.Module):
    """One LSTM cell step written out in tensor ops; returns the new hidden state."""

    def __init__(self, input_size, hidden_size):
        super().__init__()
        self.input_map = nn.Linear(input_size, 4 * hidden_size)
        self.hidden_map = nn.Linear(hidden_size, 4 * hidden_size)

    def forward(self, x, h, c):
        gates = self.input_map(x) + self.hidden_map(h)
        i, f, g, o = gates.chunk(4, dim=1)
        i, f, o = torch.sigmoid(i), torch.sigmoid(f), torch.sigmoid(o)
        g = torch.tanh(g)
        c_next = f * c + i * g
        return o * torch.tanh(c_next)


def get_inputs():
    return [torch.randn(BATCH, INPUT), torch.randn(BATCH, HIDDEN), torch.randn(BATCH, HIDDEN)]


def get_init_inputs():
    return [INPUT, HIDDEN]
