"""Block shapes from real model configs, and the shrink that makes them laptop-sized on cpu.

On the cpu backend widths (hidden, intermediate) and sequence lengths are divided by
`cpu_shrink`; head counts and head_dim each by about its square root, so that
heads * head_dim shrinks like the hidden size and the grouped-query ratio survives."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class BlockShape:
    batch: int
    seq: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def _shrink_heads(heads: int, kv_heads: int, factor: int) -> tuple[int, int]:
    kv = max(1, kv_heads // factor)
    # keep heads a multiple of kv so every query head still maps to one kv head
    heads = max(kv, (heads // factor) // kv * kv)
    return heads, kv


def resolve_shape(config: dict, batch: int, seq: int, backend: str, cpu_shrink: int) -> BlockShape:
    """The shape a task is built at: the config's dims, shrunk on cpu."""
    if backend != "cpu" or cpu_shrink <= 1:
        return BlockShape(batch, seq, config["hidden_size"], config["intermediate_size"],
                          config["num_attention_heads"], config["num_key_value_heads"],
                          config["head_dim"])
    head_factor = max(1, round(math.sqrt(cpu_shrink)))
    dim_factor = max(1, cpu_shrink // head_factor)
    heads, kv_heads = _shrink_heads(config["num_attention_heads"], config["num_key_value_heads"],
                                    head_factor)
    return BlockShape(
        batch=batch,
        seq=max(1, seq // cpu_shrink),
        hidden=max(1, config["hidden_size"] // cpu_shrink),
        intermediate=max(1, config["intermediate_size"] // cpu_shrink),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=max(1, config["head_dim"] // dim_factor),
    )
