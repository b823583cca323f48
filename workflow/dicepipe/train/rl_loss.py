"""The TraceRL policy loss (pure): PPO clipping on per-token ratios plus the k3 KL estimate.

For token i of a trace with advantage A (the trace's group-normalised reward):
  r_i = exp(clamp(logp_new - logp_old, -10, 10))
  l_i = -min(r_i A, clip(r_i, 1 - eps, 1 + eps) A) + beta * (exp(ref - new) - 1 - (ref - new))
The loss is sum_i l_i / (traces x max_new_tokens): a constant normaliser (the release's
padded response length), so long and short traces weigh by their tokens and the value does
not depend on how traces are split into micro-batches or ranks. `ref` is the pre-update
policy's log-probability (= old, the release) or a frozen copy's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOG_RATIO_CLAMP = 10.0


@dataclass
class LossTerms:
    loss: torch.Tensor  # scalar, differentiable
    policy_sum: torch.Tensor  # detached sums over tokens (for metrics)
    kl_sum: torch.Tensor
    clipped: torch.Tensor  # tokens whose clipped term was the one taken
    tokens: int


def k3_kl(logp_new: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(new || ref): exp(ref - new) - 1 - (ref - new) >= 0."""
    diff = logp_ref - logp_new
    return torch.exp(diff) - 1.0 - diff


def trace_policy_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, logp_ref: torch.Tensor,
                      advantages: torch.Tensor, *, clip_eps: float, kl_beta: float,
                      normaliser: float) -> LossTerms:
    """All tensors (M,) per scored token; `advantages` is the token's trace advantage."""
    ratio = torch.exp(torch.clamp(logp_new - logp_old, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    policy = -torch.minimum(unclipped, clipped)
    kl = k3_kl(logp_new, logp_ref)
    total = (policy + kl_beta * kl).sum() / normaliser
    return LossTerms(total, policy.detach().sum(), kl.detach().sum(),
                     (clipped < unclipped).detach().sum(), int(logp_new.numel()))
