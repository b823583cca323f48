"""Forward passes of a transformers Qwen3ForCausalLM over a preallocated KV cache.

Decoding runs the stock submodules (norms, projections, MLP) of the transformers model;
only attention and the cache are ours: keys/values live in one static buffer per layer,
each forward writes its tokens' keys/values at their canvas columns and attends over the
cache under the block-causal mask (masks.block_causal_mask). Static shapes let a forward be
captured once as a CUDA graph per (batch bucket, query length, key-length bucket) and
replayed: the per-block step is launch-bound otherwise. Finished rows are dropped by moving
the remaining rows to the front of the cache (`keep_rows`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .masks import block_causal_mask

# Bound on (rows x grouped queries x keys) per prefill chunk: the boolean mask, and the
# float mask SDPA may derive from it, stay a few hundred MB.
PREFILL_MASK_ELEMENTS = 1 << 27


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _batch_buckets(max_batch: int) -> list[int]:
    sizes = {max_batch}
    size = 1
    while size < max_batch:
        sizes.add(size)
        size *= 2
    return sorted(sizes)


@dataclass
class _Graph:
    graph: object
    tokens: torch.Tensor
    logits: torch.Tensor | None


class KVCacheEngine:
    def __init__(self, lm, block_size: int, max_batch: int, max_len: int, *,
                 cuda_graphs: bool = False, len_bucket: int = 128, compile_layers: bool = False,
                 attention: str = "sdpa"):
        self.lm = lm
        self.inner = lm.model
        self.block_size = block_size
        self.len_bucket = len_bucket
        self.max_batch = max_batch
        self.max_len = math.ceil(max_len / len_bucket) * len_bucket
        param = next(lm.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.cuda_graphs = cuda_graphs and self.device.type == "cuda"
        config = lm.config
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        shape = (max_batch, config.num_key_value_heads, self.max_len, self.head_dim)
        self.keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.inner.layers]
        self.values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.inner.layers]
        self.pad = torch.zeros(max_batch, dtype=torch.long, device=self.device)
        self.start_col = torch.zeros((), dtype=torch.long, device=self.device)
        self.cos, self.sin = self._rope_tables()
        self.buckets = _batch_buckets(max_batch)
        self.graphs: dict[tuple, _Graph] = {}
        self.pool = torch.cuda.graph_pool_handle() if self.cuda_graphs else None
        self.group = config.num_attention_heads // config.num_key_value_heads
        self.forwards = 0
        self.filled = 0  # columns written so far (for compaction)
        # Optionally the per-token parts of a layer (norms, projections, RoPE, MLP) compiled
        # for the short decode forwards, fusing their many small kernels; prefill stays eager.
        self.compiled_max_query = 2 * block_size
        self.compiled = _compiled_layer_parts() if compile_layers else None
        if attention not in ("sdpa", "matmul"):
            raise ValueError(f"attention {attention!r}: expected 'sdpa' or 'matmul'")
        # "matmul": short (decode) forwards attend with two batched matmuls and a softmax,
        # which read the cache at close to full bandwidth where SDPA's masked kernel may not.
        self.attention = attention

    def _rope_tables(self):
        positions = torch.arange(self.max_len, device=self.device)[None]
        probe = torch.zeros(1, dtype=self.dtype, device=self.device)
        with torch.no_grad():
            cos, sin = self.inner.rotary_emb(probe, positions)
        return cos[0].to(self.dtype), sin[0].to(self.dtype)

    # --- batch management -------------------------------------------------------------
    def begin(self, pad_offsets: torch.Tensor) -> None:
        """Start a new batch; `pad_offsets` (rows,) are each row's left padding."""
        rows = len(pad_offsets)
        if rows > self.max_batch:
            raise ValueError(f"batch {rows} exceeds the engine's max_batch {self.max_batch}")
        self.pad[:rows] = pad_offsets.to(self.device)
        self.filled = 0

    def keep_rows(self, keep: torch.Tensor) -> None:
        """Move rows `keep` (ascending row indices) to the front; others are dropped."""
        keep = keep.to(self.device)
        cols = max(self.filled, 1)
        for cache in (*self.keys, *self.values):
            cache[: len(keep), :, :cols] = cache[keep, :, :cols]
        self.pad[: len(keep)] = self.pad[keep]

    # --- forwards ---------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor, logits_last: int = 0):
        """Forward columns [0, P) of every row (left-padded prompts), in row chunks."""
        rows, length = tokens.shape
        group = self.lm.config.num_attention_heads // self.lm.config.num_key_value_heads
        chunk = max(1, PREFILL_MASK_ELEMENTS // max(1, group * length * self._key_len(length)))
        outputs = []
        for r0 in range(0, rows, chunk):
            part = tokens[r0 : r0 + chunk].to(self.device)
            out = self._run(part, 0, slice(r0, r0 + len(part)), self._key_len(length), logits_last)
            outputs.append(out)
        self.forwards += 1
        self.filled = max(self.filled, length)
        return torch.cat(outputs) if logits_last else None

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, start: int, logits_last: int):
        """Forward `tokens` (rows, q) at columns [start, start+q) for the first `rows` rows;
        returns logits (rows, logits_last, V) of the last positions (None if 0)."""
        rows, q = tokens.shape
        key_len = self._key_len(start + q)
        self.forwards += 1
        self.filled = max(self.filled, start + q)
        if not self.cuda_graphs:
            self.start_col.fill_(start)
            return self._run(tokens, self.start_col, slice(0, rows), key_len, logits_last)
        batch = next(b for b in self.buckets if b >= rows)
        entry = self.graphs.get((batch, q, key_len, logits_last))
        if entry is None:
            entry = self._capture(tokens, start, batch, key_len, logits_last)
        entry.tokens[:rows].copy_(tokens)
        self.start_col.fill_(start)
        entry.graph.replay()
        return None if entry.logits is None else entry.logits[:rows]

    def _key_len(self, end: int) -> int:
        return min(self.max_len, math.ceil(end / self.len_bucket) * self.len_bucket)

    def _capture(self, tokens, start, batch, key_len, logits_last) -> _Graph:
        static_tokens = torch.zeros((batch, tokens.shape[1]), dtype=torch.long, device=self.device)
        static_tokens[: len(tokens)].copy_(tokens)
        self.start_col.fill_(start)
        rows = slice(0, batch)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: kernels pick their algorithms outside capture
            for _ in range(2):
                self._run(static_tokens, self.start_col, rows, key_len, logits_last)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self._run(static_tokens, self.start_col, rows, key_len, logits_last)
        entry = _Graph(graph, static_tokens, logits)
        self.graphs[(batch, tokens.shape[1], key_len, logits_last)] = entry
        return entry

    def _run(self, tokens, start, rows: slice, key_len: int, logits_last: int):
        q = tokens.shape[1]
        pad = self.pad[rows]
        cols = torch.arange(q, device=self.device) + start
        positions = (cols[None, :] - pad[:, None]).clamp_(min=0)
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]
        mask = self._folded_mask(block_causal_mask(pad, start, q, key_len, self.block_size))
        pre, post = _pre_attention, _post_attention
        if self.compiled is not None and q <= self.compiled_max_query:
            pre, post = self.compiled
        hidden = self.inner.embed_tokens(tokens)
        for i, layer in enumerate(self.inner.layers):
            query, key, value = pre(layer, hidden, cos, sin, self.head_dim, self.dtype)
            key_cache, value_cache = self.keys[i][rows], self.values[i][rows]
            key_cache.index_copy_(2, cols, key)
            value_cache.index_copy_(2, cols, value)
            out = self._attend(query, key_cache[:, :, :key_len], value_cache[:, :, :key_len], mask,
                               layer.self_attn.scaling)
            hidden = post(layer, hidden, out)
        if not logits_last:
            return None
        hidden = self.inner.norm(hidden[:, -logits_last:])
        return self.lm.lm_head(hidden)

    def _folded_mask(self, mask: torch.Tensor) -> torch.Tensor:
        """(B, 1, q, k) bool -> additive (B, 1, group*q, k) for queries with the grouped heads
        folded into their length; built once per forward, not per layer."""
        batch, _, q, k = mask.shape
        folded = mask[:, :, None].expand(batch, 1, self.group, q, k).reshape(batch, 1, self.group * q, k)
        return torch.zeros(folded.shape, dtype=self.dtype, device=self.device).masked_fill_(~folded, float("-inf"))

    def _attend(self, query, keys, values, mask, scale):
        """Attention over the cache with the query heads of a group folded into the query
        length: no copy of keys/values for grouped-query attention."""
        batch, heads, q, dim = query.shape
        folded = query.reshape(batch, keys.shape[1], self.group * q, dim)
        if self.attention == "matmul" and q <= self.compiled_max_query:
            scores = torch.matmul(folded, keys.transpose(-1, -2)).float() * scale + mask
            out = torch.matmul(torch.softmax(scores, dim=-1).to(values.dtype), values)
        else:
            out = F.scaled_dot_product_attention(folded, keys, values, attn_mask=mask, scale=scale)
        return out.reshape(batch, heads, q, dim)


def _pre_attention(layer, hidden, cos, sin, head_dim: int, dtype: torch.dtype):
    """Per-token part of a layer before attention: norm, projections, q/k norms, RoPE."""
    attn = layer.self_attn
    x = layer.input_layernorm(hidden)
    shape = (*x.shape[:2], -1, head_dim)
    query = attn.q_norm(attn.q_proj(x).view(shape)).transpose(1, 2)
    key = attn.k_norm(attn.k_proj(x).view(shape)).transpose(1, 2)
    value = attn.v_proj(x).view(shape).transpose(1, 2)
    query = query * cos + _rotate_half(query) * sin
    key = key * cos + _rotate_half(key) * sin
    return query.to(dtype), key.to(dtype), value.to(dtype)


def _post_attention(layer, hidden, attn_out):
    """Per-token part of a layer after attention: output projection, residuals, MLP."""
    batch, heads, q, dim = attn_out.shape
    hidden = hidden + layer.self_attn.o_proj(attn_out.transpose(1, 2).reshape(batch, q, heads * dim))
    return hidden + layer.mlp(layer.post_attention_layernorm(hidden))


@functools.cache
def _compiled_layer_parts():
    """Compiled once per process (plain functions, so engines share the compiled code; the
    guards are on shapes and dtypes)."""
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):  # shapes: batch buckets x query lengths
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), 64))
    return (torch.compile(_pre_attention, dynamic=False), torch.compile(_post_attention, dynamic=False))
