"""Weighted cross-entropy of the output layer at selected positions, without ever holding
the (positions x vocabulary) logits: chunks of rows go through the output layer, and the
gradients are formed in the forward pass (the loss is linear in its weights), so backward
only scales them. Peak extra memory is one chunk of logits plus one weight-sized gradient.
"""

from __future__ import annotations

import torch

DEFAULT_CHUNK_ROWS = 2048


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, weights, chunk_rows):
        needs_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        w = weight.to(hidden.dtype)
        acc = torch.promote_types(hidden.dtype, torch.float32)  # bf16 -> fp32, fp64 stays
        loss = torch.zeros((), dtype=acc, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if needs_grad else None
        grad_weight = torch.zeros(weight.shape, dtype=acc, device=weight.device) if needs_grad else None
        for start in range(0, hidden.shape[0], chunk_rows):
            h = hidden[start : start + chunk_rows]
            tgt = targets[start : start + chunk_rows]
            wt = weights[start : start + chunk_rows].to(acc)
            logits = (h @ w.T).to(acc)
            lse = torch.logsumexp(logits, dim=-1)
            target_logit = logits.gather(1, tgt[:, None]).squeeze(1)
            loss += ((lse - target_logit) * wt).sum()
            if needs_grad:
                # d(sum w*CE)/dlogits = w * (softmax - onehot)
                probs = torch.exp(logits.sub_(lse[:, None]))
                probs[torch.arange(len(tgt), device=tgt.device), tgt] -= 1.0
                grad_logits = probs.mul_(wt[:, None]).to(hidden.dtype)
                grad_hidden[start : start + chunk_rows] = grad_logits @ w
                grad_weight += (grad_logits.T @ h).to(acc)
        if needs_grad:
            ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight = ctx.saved_tensors
        gh = grad_hidden * grad_loss.to(grad_hidden.dtype) if ctx.needs_input_grad[0] else None
        gw = (grad_weight * grad_loss).to(ctx.weight_dtype) if ctx.needs_input_grad[1] else None
        return gh, gw, None, None, None


def linear_cross_entropy_sum(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                             weights: torch.Tensor, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> torch.Tensor:
    """sum_i weights[i] * CE(hidden[i] @ weight.T, targets[i]) as a (at least) float32 scalar.

    hidden (M, H), weight (V, H), targets (M,), weights (M,). With M == 0 the result is a
    zero that still depends on `hidden` (so every rank's backward runs)."""
    if hidden.shape[0] == 0:
        return hidden.sum().float() * 0.0 + weight.sum().float() * 0.0
    return _LinearCrossEntropy.apply(hidden, weight, targets, weights, chunk_rows)
