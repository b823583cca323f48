"""The trajectory layout: per-token log-probabilities of a block-diffusion decode, each token
scored in the context that existed when the decoder committed it (TraceRL), in one forward.

A trace is (prompt ids, committed ids, the global denoising step of each committed id), as
the Decoder returns them (`Generation.trace_ids` / `trace_steps`). Blocks count from the
sample's absolute position 0, prompt included: the same grid as SFT (model/masks.py) and
decoding (model/decode.py), so the prompt's tail shares the first response block.

One row holds a clean copy of the whole sequence followed by noisy block copies: for every
response block and every distinct step s at which the decoder committed tokens in it, a
copy of that block in which the tokens committed at step s or later are masks (earlier ones
and prompt tokens stay as they were). The tokens committed at s are read from that copy.
Only blocks that still had work at a step get a copy, so a row holds
n + (sum over blocks of its steps) x block_size tokens (TraceRL rebuilds prompt + response
once per step round instead).

Attention (pure function of per-position metadata, as model/masks.py does by index):
  - clean query: clean keys of blocks not later than its own (the decoder's KV cache);
  - noisy query: clean keys of strictly earlier blocks, and its own noisy copy
    (bidirectional inside the block being denoised);
  - nothing across samples (`doc`); padding is a sample of its own.
Noisy copies reuse their clean positions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..errors import ModelError
from .layout import first_fit_rows as pack_rows  # noqa: F401 (the RL update's packing)
from .objective import BlockDiffusionLM

DEFAULT_CHUNK_ROWS = 2048


@dataclass(frozen=True)
class Trace:
    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]  # every committed token (whole blocks: Generation.trace_ids)
    steps: tuple[int, ...]  # per committed token: the global step that committed it

    def __post_init__(self):
        if len(self.token_ids) != len(self.steps):
            raise ModelError(f"trace has {len(self.token_ids)} tokens but {len(self.steps)} steps")
        if not self.prompt_ids or not self.token_ids:
            raise ModelError("a trace needs a prompt and at least one committed token")
        if min(self.steps) < 0:
            raise ModelError("a trace step is negative: a position was never committed")

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.token_ids)


def noisy_blocks(trace: Trace, block_size: int) -> list[tuple[int, int]]:
    """(block index, step) for every response block and distinct step committed in it, in
    block then step order: one noisy copy each."""
    n = len(trace)
    if n % block_size:
        raise ModelError(f"trace of {len(trace.prompt_ids)} prompt + {len(trace.token_ids)} tokens does "
                         f"not end on a block boundary (block {block_size}); pass the whole last "
                         "block (Generation.trace_ids).")
    start = len(trace.prompt_ids)
    out = []
    for block in range(start // block_size, n // block_size):
        lo, hi = max(block * block_size, start) - start, (block + 1) * block_size - start
        out += [(block, s) for s in sorted(set(trace.steps[lo:hi]))]
    return out


def trace_length(trace: Trace, block_size: int) -> int:
    """Positions of the trace in the layout: its clean copy and its noisy copies."""
    return len(trace) + len(noisy_blocks(trace, block_size)) * block_size


def trace_allowed_pairs(trace: Trace, block_size: int) -> int:
    """Allowed (query, key) pairs of the trace's own positions under `trace_allowed` (the
    same in any row: nothing attends across traces). Clean block b: B queries x (b+1)B
    clean keys; a noisy copy of block b: B queries x (bB clean keys + its own B)."""
    blocks = len(trace) // block_size
    copies = sum(b + 1 for b, _ in noisy_blocks(trace, block_size))
    return block_size * block_size * (blocks * (blocks + 1) // 2 + copies)


def bucket_length(n: int, base: int = 512, per_octave: int = 2) -> int:
    """The smallest of base x 2^k x (1 + j / per_octave), j < per_octave, at least n (base
    512, 2 per octave: 512, 768, 1024, 1536, 2048, 3072, ...): few distinct row lengths for
    compiled layers (a shape each), at most 1 / per_octave of a row padding."""
    size = base
    while True:
        for j in range(per_octave):
            length = size + size * j // per_octave
            if length >= n:
                return length
        size *= 2


@dataclass
class TraceBatch:
    """Rows of traces. Metadata per position: `doc` (sample id, unique across the batch),
    `copy` (0 clean, else the noisy copy's id), `block` (absolute block index)."""

    input_ids: torch.Tensor  # (B, L)
    position_ids: torch.Tensor  # (B, L)
    doc: torch.Tensor  # (B, L)
    copy: torch.Tensor  # (B, L)
    block: torch.Tensor  # (B, L)
    targets: torch.Tensor  # (B, L) bool: positions whose committed token is scored
    target_ids: torch.Tensor  # (M,) the committed tokens, row-major over `targets`
    target_trace: torch.Tensor  # (M,) which trace (index into the list given) each belongs to
    target_order: torch.Tensor  # (M,) index of the token inside its trace's committed ids

    def to(self, device) -> TraceBatch:
        """On a GPU through pinned memory: the copies do not wait for the work already queued."""
        pin = torch.device(device).type == "cuda"
        return TraceBatch(**{k: (v.pin_memory() if pin else v).to(device, non_blocking=True)
                             for k, v in self.__dict__.items()})


def _trace_row(trace: Trace, block_size: int, mask_id: int):
    """(ids, positions, copy, block, target bool, target order) of one trace, as lists;
    a target's committed token is `trace.token_ids[order]`."""
    ids = list(trace.prompt_ids) + list(trace.token_ids)
    n, start = len(ids), len(trace.prompt_ids)
    pos = list(range(n))
    copy = [0] * n
    block = [i // block_size for i in range(n)]
    target = [False] * n
    order = [-1] * n
    for c, (b, step) in enumerate(noisy_blocks(trace, block_size), start=1):
        for i in range(b * block_size, (b + 1) * block_size):
            k = i - start  # index in the committed tokens (negative: prompt tail)
            committed_later = k >= 0 and trace.steps[k] >= step
            ids.append(mask_id if committed_later else ids[i])
            pos.append(i)
            copy.append(c)
            block.append(b)
            target.append(k >= 0 and trace.steps[k] == step)
            order.append(k)
    return ids, pos, copy, block, target, order


def build_trace_batch(rows: Sequence[Sequence[Trace]], block_size: int, mask_id: int, pad_id: int,
                      row_multiple: int = 1, length: int | None = None) -> TraceBatch:
    """Pack traces into rows (each inner list one row), padded to the longest row rounded up
    to `row_multiple`, or to `length` (fixed shapes on GPU; at least the longest row).
    Traces are numbered in row-major order."""
    built = [[_trace_row(t, block_size, mask_id) for t in row] for row in rows]
    longest = max(sum(len(r[0]) for r in row) for row in built)
    if length is None:
        length = math.ceil(longest / row_multiple) * row_multiple
    elif length < longest:
        raise ModelError(f"row length {length} is shorter than the longest row ({longest} tokens)")
    shape = (len(rows), length)
    ids = torch.full(shape, pad_id, dtype=torch.long)
    pos, doc, copy, block = (torch.zeros(shape, dtype=torch.long) for _ in range(4))
    targets = torch.zeros(shape, dtype=torch.bool)
    trace_of = torch.full(shape, -1, dtype=torch.long)
    order = torch.full(shape, -1, dtype=torch.long)
    d = t = 0
    for r, row in enumerate(built):
        at = 0
        for r_ids, r_pos, r_copy, r_block, r_target, r_order in row:
            span = slice(at, at + len(r_ids))
            ids[r, span] = torch.tensor(r_ids)
            pos[r, span] = torch.tensor(r_pos)
            copy[r, span] = torch.tensor(r_copy)
            block[r, span] = torch.tensor(r_block)
            targets[r, span] = torch.tensor(r_target)
            order[r, span] = torch.tensor(r_order)
            trace_of[r, span] = t
            doc[r, span] = d
            at, d, t = at + len(r_ids), d + 1, t + 1
        doc[r, at:] = d  # padding: its own sample, clean, block-causal over itself
        pos[r, at:] = torch.arange(length - at)
        block[r, at:] = torch.arange(length - at) // block_size
        d += 1
    traces = [t for row in rows for t in row]
    trace_of, order = trace_of[targets], order[targets]
    target_ids = torch.tensor([traces[t].token_ids[k] for t, k in zip(trace_of.tolist(), order.tolist())],
                              dtype=torch.long)
    return TraceBatch(ids, pos, doc, copy, block, targets, target_ids, trace_of, order)


def trace_batch_counts(batch: TraceBatch) -> dict:
    """What the batch's real positions cost, padding excluded, from its metadata alone:
    `tokens` (real layout positions), `allowed_pairs` (allowed (query, key) pairs between
    them, exactly as `trace_allowed` decides, without building the L x L mask) and
    `head_tokens` (scored positions: the output layer's rows)."""
    doc, copy, block = (t.reshape(-1).long().cpu() for t in (batch.doc, batch.copy, batch.block))
    real = torch.isin(doc, doc[batch.targets.reshape(-1).cpu()].unique())  # padding scores nothing
    doc, copy, block = doc[real], copy[real], block[real]
    if doc.numel() == 0:
        return {"tokens": 0, "allowed_pairs": 0, "head_tokens": 0}
    clean = copy == 0
    blocks = int(block.max()) + 2
    # clean keys per (doc, block), then per doc cumulated over blocks: keys of blocks <= b
    per_block = torch.bincount(doc[clean] * blocks + block[clean], minlength=(int(doc.max()) + 1) * blocks)
    upto = per_block.view(-1, blocks).cumsum(1).view(-1)
    clean_keys = torch.where(clean, upto[doc * blocks + block],
                             torch.where(block > 0, upto[doc * blocks + (block - 1).clamp(min=0)], 0))
    # a noisy query's own copy: the keys with its (doc, copy)
    copies = int(copy.max()) + 1
    copy_key = doc * copies + copy
    copy_size = torch.bincount(copy_key, minlength=(int(doc.max()) + 1) * copies)
    own = torch.where(clean, 0, copy_size[copy_key])
    return {"tokens": int(real.sum()), "allowed_pairs": int((clean_keys + own).sum()),
            "head_tokens": int(batch.targets.sum())}


def trace_batch_flops(batch: TraceBatch, config) -> dict:
    """Forward FLOPs of one TracePolicy forward of `batch` (model/flops.py's convention:
    decoder matmuls over the real positions, noisy copies included, padding excluded;
    attention over the allowed pairs; the output layer at the scored positions), with the
    counts they come from."""
    from .flops import forward_flops

    counts = trace_batch_counts(batch)
    return {**counts, **forward_flops(config, counts["tokens"], counts["allowed_pairs"], counts["head_tokens"])}


def traces_forward_flops(traces: Sequence[Trace], block_size: int, config) -> dict:
    """The same forward FLOPs as `trace_batch_flops` from the traces themselves (they do not
    depend on how traces are packed into rows)."""
    from .flops import forward_flops

    counts = {"tokens": sum(trace_length(t, block_size) for t in traces),
              "allowed_pairs": sum(trace_allowed_pairs(t, block_size) for t in traces),
              "head_tokens": sum(len(t.token_ids) for t in traces)}
    return {**counts, **forward_flops(config, counts["tokens"], counts["allowed_pairs"], counts["head_tokens"])}


def trace_allowed(q_doc, kv_doc, q_copy, kv_copy, q_block, kv_block):
    """Elementwise rule over broadcast metadata tensors (also usable inside a mask_mod)."""
    q_clean = q_copy == 0
    clean_key_ok = kv_block < q_block + q_clean.to(q_block.dtype)
    noisy_key_ok = (kv_copy == q_copy) & ~q_clean
    return (q_doc == kv_doc) & torch.where(kv_copy == 0, clean_key_ok, noisy_key_ok)


def dense_trace_mask(batch: TraceBatch) -> torch.Tensor:
    """Boolean (B, 1, L, L), True = attend (SDPA; CPU)."""
    d, c, b = batch.doc, batch.copy, batch.block
    allowed = trace_allowed(d[:, :, None], d[:, None, :], c[:, :, None], c[:, None, :],
                            b[:, :, None], b[:, None, :])
    return allowed[:, None]


def flex_trace_mask(batch: TraceBatch):
    """FlexAttention BlockMask of the same rule (GPU; fully masked 128x128 tiles skipped)."""
    from torch.nn.attention.flex_attention import create_block_mask

    d, c, b = batch.doc, batch.copy, batch.block

    def mask_mod(bi, h, q_idx, kv_idx):
        return trace_allowed(d[bi, q_idx], d[bi, kv_idx], c[bi, q_idx], c[bi, kv_idx],
                             b[bi, q_idx], b[bi, kv_idx])

    rows, length = d.shape
    return create_block_mask(mask_mod, B=rows, H=None, Q_LEN=length, KV_LEN=length, device=d.device)


class _TokenLogProbs(torch.autograd.Function):
    """log softmax(hidden @ weight.T / T)[target] per row, in chunks of rows: the
    (rows x vocabulary) logits are never held whole, and backward recomputes them."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, inv_temperature, chunk_rows):
        w = weight.to(hidden.dtype)
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(out)
        for s in range(0, hidden.shape[0], chunk_rows):
            logits = (hidden[s : s + chunk_rows] @ w.T).float() * inv_temperature
            lse[s : s + chunk_rows] = torch.logsumexp(logits, dim=-1)
            out[s : s + chunk_rows] = logits.gather(1, targets[s : s + chunk_rows, None]).squeeze(1) - lse[s : s + chunk_rows]
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.inv_temperature, ctx.chunk_rows = inv_temperature, chunk_rows
        return out

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, targets, lse = ctx.saved_tensors
        w = weight.to(hidden.dtype)
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for s in range(0, hidden.shape[0], ctx.chunk_rows):
            h, g_out = hidden[s : s + ctx.chunk_rows], grad_out[s : s + ctx.chunk_rows].float()
            logits = (h @ w.T).float() * ctx.inv_temperature
            # d logp / d logits = (onehot - softmax) / T
            grad = torch.exp(logits - lse[s : s + ctx.chunk_rows, None]).mul_(-g_out[:, None])
            grad[torch.arange(len(h), device=h.device), targets[s : s + ctx.chunk_rows]] += g_out
            grad = grad.mul_(ctx.inv_temperature).to(hidden.dtype)
            grad_hidden[s : s + ctx.chunk_rows] = grad @ w
            grad_weight += (grad.T @ h).float()
        return grad_hidden, grad_weight.to(weight.dtype), None, None, None


def token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                   temperature: float = 1.0, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> torch.Tensor:
    """(M,) float32 log-probabilities of `targets` under the output layer `weight`."""
    if hidden.shape[0] == 0:  # still depends on the weights, so every rank's backward runs
        return hidden.sum(dim=-1).float() * 0.0 + weight.sum().float() * 0.0
    return _TokenLogProbs.apply(hidden, weight, targets, 1.0 / temperature, chunk_rows)


class TracePolicy(BlockDiffusionLM):
    """The RL root module: the same decoder layers and attention as SFT, whose forward
    returns the per-token log-probabilities of a TraceBatch (M,), float32. FSDP wraps it
    like BlockDiffusionLM (train/parallel.py)."""

    def __init__(self, lm, block_size: int, compute_dtype: torch.dtype | None = None,
                 temperature: float = 1.0):
        super().__init__(lm, block_size, compute_dtype)
        self.temperature = temperature

    def trace_mask(self, batch: TraceBatch, use_flex: bool):
        return flex_trace_mask(batch) if use_flex else dense_trace_mask(batch)

    def forward(self, batch: TraceBatch, attention_mask) -> torch.Tensor:
        hidden = self.hidden_states(batch.input_ids, batch.position_ids, attention_mask)
        return token_logprobs(hidden[batch.targets], self.lm.lm_head.weight, batch.target_ids,
                              self.temperature)
