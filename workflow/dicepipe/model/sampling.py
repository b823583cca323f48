"""Token sampling and the choice of which masked positions to commit at a denoising step.

Confidence is the probability of the sampled token under the temperature-scaled model
distribution before top-k/top-p filtering. (SDAR's reference loop takes it after filtering,
so with top_k=1 every confidence is 1 and "low-confidence" remasking silently becomes
left-to-right; here greedy decoding still commits the most confident position first.)
"""

from __future__ import annotations

import torch

from . import decode_kernels

STRATEGIES = ("static", "dynamic", "sequential")


def sample_tokens(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
                  generator: torch.Generator | None = None):
    """logits (N, V) -> (tokens (N,), confidence (N,)). temperature 0 or top_k 1 is greedy."""
    if temperature <= 0 or top_k == 1:
        if logits.is_cuda and decode_kernels.available():  # one pass over the bf16 logits
            return decode_kernels.greedy_pick(logits)
        confidence, tokens = torch.softmax(logits.float(), dim=-1).max(dim=-1)
        return tokens, confidence
    logits = logits.float()
    scaled = logits / temperature
    full_probs = torch.softmax(scaled, dim=-1)
    filtered = scaled
    if top_k > 0:
        kth = torch.topk(scaled, min(top_k, scaled.shape[-1]), dim=-1).values[:, -1:]
        filtered = filtered.masked_fill(filtered < kth, float("-inf"))
    if top_p < 1.0:
        filtered = _top_p_filter(filtered, top_p)
    probs = torch.softmax(filtered, dim=-1)
    tokens = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    return tokens, full_probs.gather(1, tokens[:, None]).squeeze(1)


def _top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability reaches top_p (at least one)."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    sorted_logits = sorted_logits.masked_fill(mass_before >= top_p, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def transfer_schedule(masked_counts: torch.Tensor, steps: int) -> torch.Tensor:
    """(rows,) masked counts -> (rows, steps) tokens to commit per step, split evenly with
    the remainder on the first steps (SDAR's get_num_transfer_tokens)."""
    base = masked_counts[:, None] // steps
    remainder = masked_counts[:, None] % steps
    step = torch.arange(steps, device=masked_counts.device)[None, :]
    return base + (step < remainder).long()


def select_transfers(masked: torch.Tensor, confidence: torch.Tensor, count: torch.Tensor,
                     strategy: str, threshold: float) -> torch.Tensor:
    """Which masked positions (rows, block) to commit now.

    static: the `count` most confident; sequential: the `count` leftmost; dynamic: every
    position above `threshold` when there are at least `count` of them, else as static."""
    width = masked.shape[1]
    if strategy == "sequential":
        score = -torch.arange(width, device=masked.device, dtype=torch.float32).expand_as(confidence)
    elif strategy in ("static", "dynamic"):
        score = confidence.float()
    else:
        raise ValueError(f"unknown remasking strategy {strategy!r}; expected one of {STRATEGIES}")
    score = score.masked_fill(~masked, float("-inf"))
    order = torch.argsort(score, dim=1, descending=True, stable=True)
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(width, device=masked.device).expand_as(order))
    chosen = (rank < count[:, None]) & masked
    if strategy == "dynamic":
        confident = masked & (confidence > threshold)
        enough = confident.sum(dim=1, keepdim=True) >= count[:, None]
        chosen = torch.where(enough, confident, chosen)
    return chosen
