"""Forward passes of a transformers Qwen3ForCausalLM over a preallocated KV cache.

Decoding runs the stock submodules (norms, MLP) of the transformers model, with the q|k|v
and gate|up projections optionally fused (layer_parts); attention and the cache are ours:
keys/values live in one static buffer per layer, each forward writes its tokens'
keys/values at their canvas columns and attends over the cache under the block-causal mask
(masks.block_causal_mask): on CUDA short forwards use the split-KV Triton kernel
(decode_kernels), which reads each row's visible keys only; prefill and the CPU use SDPA
with the dense mask. The output layer can be restricted to chosen positions (the ones still
masked), with a fixed count per forward so shapes stay static. Static shapes let a forward be
captured once as a CUDA graph per (batch bucket, query length, key-length bucket) and
replayed: the per-block step is launch-bound otherwise. Finished rows are dropped by moving
the remaining rows to the front of the cache (`keep_rows`).

The layer stack runs as a sequence of phases (matmuls, attention, per layer), so that a
forward can optionally run as two half-batches on two CUDA streams, one half's attention
beside the other's matmuls (`overlap_min_tokens`; measured slower on the H200, so off by
default: see bench/README.md).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import decode_kernels
from .layer_parts import (
    FusedWeights,
    compiled_parts,
    post_attention,
    post_attention_fused,
    pre_attention,
    pre_attention_fused,
    qkv_projection,
)
from .masks import block_causal_mask

# Bound on (rows x grouped queries x keys) per prefill chunk: the boolean mask, and the
# float mask SDPA may derive from it, stay a few hundred MB.
PREFILL_MASK_ELEMENTS = 1 << 27
ATTENTION_CHOICES = ("auto", "triton", "sdpa", "matmul")


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
    select: torch.Tensor | None
    logits: torch.Tensor | None


class KVCacheEngine:
    def __init__(self, lm, block_size: int, max_batch: int, max_len: int, *,
                 cuda_graphs: bool = False, len_bucket: int = 128, compile_layers: bool = False,
                 attention: str = "auto", fuse_projections: bool = True, fuse_boundary: bool = True,
                 compile_prefill: bool = False, overlap_min_tokens: int | None = None,
                 kv_dtype: torch.dtype | None = None, weight_dtype: torch.dtype | None = None):
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
        # kv_dtype (e.g. torch.float8_e4m3fn, unscaled): half the bytes the decode attention
        # reads, at a cost in accuracy; only with the Triton kernels (they convert on load).
        self.kv_dtype = kv_dtype or self.dtype
        self.keys = [torch.zeros(shape, dtype=self.kv_dtype, device=self.device) for _ in self.inner.layers]
        self.values = [torch.zeros(shape, dtype=self.kv_dtype, device=self.device) for _ in self.inner.layers]
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
        # weight_dtype float8: the layers' four matmuls in float8 (layer_parts.fp8_linear).
        if weight_dtype is not None and not fuse_projections:
            raise ValueError(f"weight dtype {weight_dtype} needs fused projections")
        self.fused = FusedWeights(self.inner.layers, weight_dtype) if fuse_projections else None
        self.compiled = compiled_parts(self.fused is not None) if compile_layers else None
        # The prefill's per-token parts compiled too: static shapes for the first prompt
        # length seen, then one dynamic-shape compilation for all others.
        self.compiled_prefill = compiled_parts(self.fused is not None, None) if compile_prefill else None
        # Compiled, fused: one layer's MLP and the next layer's norm + q|k|v in one graph.
        self.fuse_boundary = fuse_boundary
        # Two half-batches through the layer stack on two CUDA streams, offset by one phase,
        # so that one half's attention (memory-bound) runs beside the other's matmuls
        # (compute-bound); for short forwards of at least this many tokens (None: never).
        self.overlap_min_tokens = overlap_min_tokens
        self.streams = [torch.cuda.Stream(self.device) for _ in range(2)] if self.device.type == "cuda" else None
        if attention not in ATTENTION_CHOICES:
            raise ValueError(f"attention {attention!r}: expected one of {ATTENTION_CHOICES}")
        if attention == "auto":
            attention = "triton" if self.device.type == "cuda" and decode_kernels.available() else "sdpa"
        if attention == "triton" and self.device.type != "cuda":
            raise ValueError("attention 'triton' needs a CUDA model; use 'sdpa' on the CPU")
        # Short (decode) forwards: "triton" = decode_kernels.decode_attention; "matmul" = two
        # batched matmuls and a softmax over the key bucket; "sdpa" = SDPA's masked kernel.
        self.attention = attention
        # With both: norm + one q|k|v matmul, then one kernel for q/k norms, RoPE and the
        # cache write (decode_kernels.qkv_epilogue).
        self.epilogue = attention == "triton" and self.fused is not None
        if self.kv_dtype != self.dtype and not self.epilogue:
            raise ValueError(f"KV cache dtype {self.kv_dtype} needs attention 'triton' and fused projections")
        self.q_heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads

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
        if self.fused is not None:
            self.fused.refresh()

    def keep_rows(self, keep: torch.Tensor) -> None:
        """Move rows `keep` (ascending row indices) to the front; others are dropped."""
        keep = keep.to(self.device)
        cols = max(self.filled, 1)
        for cache in (*self.keys, *self.values):
            cache = cache.view(torch.uint8) if cache.element_size() == 1 else cache  # float8: no index kernels
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
            self.start_col.fill_(0)  # a tensor: short prompts take the decode attention kernel
            out = self._run(part, self.start_col, slice(r0, r0 + len(part)), self._key_len(length),
                            logits_last, None)
            outputs.append(out)
        self.forwards += 1
        self.filled = max(self.filled, length)
        return torch.cat(outputs) if logits_last else None

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, start: int, logits_last: int,
                select: torch.Tensor | None = None):
        """Forward `tokens` (rows, q) at columns [start, start+q) for the first `rows` rows;
        returns logits (rows, logits_last, V) of the last positions (None if 0), or with
        `select` (rows, n) indices into those last positions, logits (rows, n, V) there."""
        rows, q = tokens.shape
        key_len = self._key_len(start + q)
        self.forwards += 1
        self.filled = max(self.filled, start + q)
        if not self.cuda_graphs:
            self.start_col.fill_(start)
            return self._run(tokens, self.start_col, slice(0, rows), key_len, logits_last, select)
        batch = next(b for b in self.buckets if b >= rows)
        n_select = 0 if select is None else select.shape[1]
        entry = self.graphs.get((batch, q, key_len, logits_last, n_select))
        if entry is None:
            entry = self._capture(tokens, start, batch, key_len, logits_last, select)
        entry.tokens[:rows].copy_(tokens)
        if select is not None:
            entry.select[:rows].copy_(select)
        self.start_col.fill_(start)
        entry.graph.replay()
        return None if entry.logits is None else entry.logits[:rows]

    def _key_len(self, end: int) -> int:
        return min(self.max_len, math.ceil(end / self.len_bucket) * self.len_bucket)

    def _capture(self, tokens, start, batch, key_len, logits_last, select) -> _Graph:
        static_tokens = torch.zeros((batch, tokens.shape[1]), dtype=torch.long, device=self.device)
        static_tokens[: len(tokens)].copy_(tokens)
        static_select = None
        if select is not None:  # rows past the real ones pick position 0: valid, unused
            static_select = torch.zeros((batch, select.shape[1]), dtype=torch.long, device=self.device)
            static_select[: len(select)].copy_(select)
        self.start_col.fill_(start)
        rows = slice(0, batch)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: kernels pick their algorithms outside capture
            for _ in range(2):
                self._run(static_tokens, self.start_col, rows, key_len, logits_last, static_select)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self._run(static_tokens, self.start_col, rows, key_len, logits_last, static_select)
        entry = _Graph(graph, static_tokens, static_select, logits)
        n_select = 0 if select is None else select.shape[1]
        self.graphs[(batch, tokens.shape[1], key_len, logits_last, n_select)] = entry
        return entry

    def _run(self, tokens, start, rows: slice, key_len: int, logits_last: int, select):
        q, n = tokens.shape[1], rows.stop - rows.start
        short = q <= self.compiled_max_query
        kernel = self.attention == "triton" and short
        mask = None if kernel else self._folded_mask(block_causal_mask(self.pad[rows], start, q, key_len,
                                                                        self.block_size))
        hidden = self.inner.embed_tokens(tokens)
        parts = self._layer_parts(short)
        tail = _TailPositions(logits_last, select) if logits_last else None
        if short and n >= 2 and self.overlap_min_tokens is not None and n * q >= self.overlap_min_tokens:
            cut = n // 2
            halves = ((slice(0, cut), slice(rows.start, rows.start + cut)),
                      (slice(cut, n), slice(rows.start + cut, rows.stop)))
            results = [[], []]
            phases = [self._phases(hidden[h], start, r, key_len, kernel, None if mask is None else mask[h],
                                   parts, out, tail and tail.rows(h)) for (h, r), out in zip(halves, results)]
            self._interleave(phases)
            hidden = torch.cat([results[0][0], results[1][0]])
        else:
            result = []
            for _ in self._phases(hidden, start, rows, key_len, kernel, mask, parts, result, tail):
                pass
            hidden = result[0]
        if not logits_last:
            return None
        return self.lm.lm_head(self.inner.norm(hidden))

    def _phases(self, hidden, start, rows: slice, key_len: int, kernel: bool, mask, parts, result: list,
                tail: _TailPositions | None):
        """The layer stack over cache rows `rows`, as a generator that yields after each
        phase: matmuls (the previous layer's output projection and MLP, this layer's norm,
        projections and cache write), then attention, per layer; the final hidden states at
        the positions `tail` keeps go to `result`. Only those positions need the last
        layer's attention output and MLP (the others need its keys/values only); without
        `tail` (no logits wanted: the prefill, a plain commit) neither runs."""
        q = hidden.shape[1]
        pad = self.pad[rows]
        cols = torch.arange(q, device=self.device) + start
        cos = sin = None  # the epilogue kernel reads the tables itself
        if not self.epilogue:
            positions = (cols[None, :] - pad[:, None]).clamp_(min=0)
            cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]
        pre, post, boundary = parts
        layers = self.inner.layers
        out = None
        for i in range(len(layers) + 1):
            if boundary is not None and 0 < i < len(layers):
                hidden, x = boundary(i, hidden, out)
            else:
                if i == len(layers):
                    if tail is not None:
                        hidden = post(i - 1, layers[i - 1], *tail(hidden, out))
                    break
                if i:
                    hidden = post(i - 1, layers[i - 1], hidden, out)
                x = pre(i, layers[i], hidden, cos, sin)
            key_cache, value_cache = self.keys[i][rows], self.values[i][rows]
            attn = layers[i].self_attn
            if self.epilogue:
                query = decode_kernels.qkv_epilogue(x, pad, start, self.cos, self.sin, attn.q_norm, attn.k_norm,
                                                    key_cache, value_cache, self.q_heads, self.kv_heads,
                                                    self.head_dim)
            else:
                query, key, value = x
                key_cache.index_copy_(2, cols, key)
                value_cache.index_copy_(2, cols, value)
            yield
            if tail is None and i == len(layers) - 1:
                out = None
            elif kernel:
                out = decode_kernels.decode_attention(query, key_cache, value_cache, pad, start,
                                                      self.block_size, attn.scaling, key_len)
            else:
                keys, values = key_cache[:, :, :key_len], value_cache[:, :, :key_len]
                if keys.dtype != query.dtype:  # float8 cache: the prefill's SDPA takes the model dtype
                    keys, values = keys.to(query.dtype), values.to(query.dtype)
                out = self._attend(query, keys, values, mask, attn.scaling, q <= self.compiled_max_query)
            yield
        result.append(hidden)

    def _interleave(self, phases) -> None:
        """Run two halves' phase generators, each on its own stream, so that phase k of the
        second half follows phase k of the first and phase k+2 of the first follows phase k
        of the second: the matmul phases alternate between the halves, the attention phases
        too, and each half's attention runs beside the other half's matmuls."""
        streams = self.streams
        if streams is not None:
            origin = torch.cuda.current_stream(self.device)
            for stream in streams:
                stream.wait_stream(origin)
        last = [None, None]  # per phase kind (matmuls, attention): the event of its latest run
        live = list(phases)
        k = 0
        while any(gen is not None for gen in live):
            for h, gen in enumerate(live):
                if gen is None:
                    continue
                with contextlib.nullcontext() if streams is None else torch.cuda.stream(streams[h]):
                    if streams is not None and last[k % 2] is not None:
                        streams[h].wait_event(last[k % 2])
                    if next(gen, StopIteration) is StopIteration:
                        live[h] = None
                    if streams is not None:
                        last[k % 2] = torch.cuda.Event()
                        last[k % 2].record(streams[h])
            k += 1
        if streams is not None:
            for stream in streams:
                origin.wait_stream(stream)

    def _layer_parts(self, short: bool):
        """(pre, post, boundary) taking (layer index, layer, ...): fused or stock, compiled or
        eager; with the epilogue kernel, pre is the norm and q|k|v projection only, and
        boundary(i, hidden, attention output) is post of layer i-1 and pre of layer i in one
        compiled call (None where not compiled)."""
        fused = self.fused
        pre_fn, post_fn = (pre_attention_fused, post_attention_fused) if fused else (pre_attention, post_attention)
        proj_fn, boundary_fn = qkv_projection, None
        compiled = self.compiled if short else self.compiled_prefill
        if compiled is not None:
            pre_fn, post_fn, proj_fn, boundary_fn = compiled
        head_dim, dtype, layers = self.head_dim, self.dtype, self.inner.layers
        if self.epilogue:
            boundary = None
            if boundary_fn is not None and self.fuse_boundary:
                def boundary(i, h, out):
                    return boundary_fn(layers[i - 1], fused.gate_up[i - 1], h, out, layers[i], fused.qkv[i],
                                       fused.qkv_bias[i], fused.o[i - 1], fused.down[i - 1])
            return (lambda i, layer, h, cos, sin: proj_fn(layer, fused.qkv[i], fused.qkv_bias[i], h),
                    lambda i, layer, h, out: post_fn(layer, fused.gate_up[i], h, out, fused.o[i], fused.down[i]),
                    boundary)
        if fused is None:
            return (lambda i, layer, h, cos, sin: pre_fn(layer, h, cos, sin, head_dim, dtype),
                    lambda i, layer, h, out: post_fn(layer, h, out), None)
        return (lambda i, layer, h, cos, sin: pre_fn(layer, fused.qkv[i], fused.qkv_bias[i], fused.sizes,
                                                     h, cos, sin, head_dim, dtype),
                lambda i, layer, h, out: post_fn(layer, fused.gate_up[i], h, out, fused.o[i], fused.down[i]), None)

    def _folded_mask(self, mask: torch.Tensor) -> torch.Tensor:
        """(B, 1, q, k) bool -> additive (B, 1, group*q, k) for queries with the grouped heads
        folded into their length; built once per forward, not per layer."""
        batch, _, q, k = mask.shape
        folded = mask[:, :, None].expand(batch, 1, self.group, q, k).reshape(batch, 1, self.group * q, k)
        return torch.zeros(folded.shape, dtype=self.dtype, device=self.device).masked_fill_(~folded, float("-inf"))

    def _attend(self, query, keys, values, mask, scale, short: bool):
        """Attention over the cache with the query heads of a group folded into the query
        length: no copy of keys/values for grouped-query attention."""
        batch, heads, q, dim = query.shape
        folded = query.reshape(batch, keys.shape[1], self.group * q, dim)
        if self.attention == "matmul" and short:
            scores = torch.matmul(folded, keys.transpose(-1, -2)).float() * scale + mask
            out = torch.matmul(torch.softmax(scores, dim=-1).to(values.dtype), values)
        else:
            out = F.scaled_dot_product_attention(folded, keys, values, attn_mask=mask, scale=scale)
        return out.reshape(batch, heads, q, dim)


class _TailPositions:
    """(hidden (B, q, E), attention output (B, H, q, D)) -> both at the positions whose
    logits a forward returns: the last `last` positions, or `select` (B, n) among them."""

    def __init__(self, last: int, select: torch.Tensor | None):
        self.last, self.select = last, select

    def rows(self, part: slice) -> _TailPositions:
        return _TailPositions(self.last, None if self.select is None else self.select[part])

    def __call__(self, hidden, attn_out):
        hidden, attn_out = hidden[:, -self.last :], attn_out[:, :, -self.last :]
        if self.select is None:
            return hidden, attn_out
        select = self.select
        hidden = torch.gather(hidden, 1, select[:, :, None].expand(-1, -1, hidden.shape[-1]))
        # gathered in the (B, q, H, D) order the attention kernels write, so the output
        # projection's transpose back stays a view
        by_pos = attn_out.transpose(1, 2)
        index = select[:, :, None, None].expand(-1, -1, *by_pos.shape[2:])
        return hidden, torch.gather(by_pos, 1, index).transpose(1, 2)
