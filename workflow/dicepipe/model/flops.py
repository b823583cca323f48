"""Exact model FLOPs of the decoder's work (pure counting; bench/model_train_mfu.py, the RL
update in train/rl_update.py and bench/rl_train_mfu.py count with these).

Convention (bench/README.md, "Model SFT step"): a multiply-add is 2 FLOPs; per token and layer the
q, k, v, o projections and the three MLP matmuls; attention over the mask's allowed
(query, key) pairs only (QK^T and PV: 4 x head_dim x heads per pair and layer); the output
layer over the positions actually computed. Forward + backward is 3x the forward. Norms,
rotary embeddings, softmax and the embedding lookup are not counted.
"""

from __future__ import annotations


def linear_flops_per_token(config) -> int:
    """Forward FLOPs of one token through one decoder layer's matmuls."""
    hidden, inter = config.hidden_size, config.intermediate_size
    heads, kv_heads, dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    return 2 * (2 * hidden * heads * dim + 2 * hidden * kv_heads * dim + 3 * hidden * inter)


def attention_flops_per_pair(config) -> int:
    """Forward FLOPs of one allowed (query, key) pair in one layer (all heads)."""
    return 4 * config.head_dim * config.num_attention_heads


def head_flops_per_token(config) -> int:
    """Forward FLOPs of the output layer at one position."""
    return 2 * config.hidden_size * config.vocab_size


def forward_flops(config, tokens: int, allowed_pairs: int, head_tokens: int) -> dict:
    """Forward FLOPs of `tokens` positions through every layer, `allowed_pairs` attention
    pairs per layer, and the output layer at `head_tokens` positions."""
    layers = config.num_hidden_layers
    linear = linear_flops_per_token(config) * layers * tokens
    attention = attention_flops_per_pair(config) * layers * allowed_pairs
    head = head_flops_per_token(config) * head_tokens
    return {"linear": linear, "attention": attention, "head": head, "total": linear + attention + head}


def sft_step_flops(config, batch, allowed_pairs: int) -> dict:
    """One SFT step (forward + backward, x3) of a TrainBatch over the doubled row: the output
    layer at the masked positions (`head_masked`) or, the issue's convention, the whole noisy
    half (`head_noisy_half`)."""
    tokens = batch.input_ids.numel()
    fwd = forward_flops(config, tokens, allowed_pairs, int(batch.targets.numel()))
    head_noisy_half = 3 * head_flops_per_token(config) * (tokens // 2)
    linear, attention, head_masked = 3 * fwd["linear"], 3 * fwd["attention"], 3 * fwd["head"]
    return {"linear": linear, "attention": attention, "head_masked": head_masked,
            "head_noisy_half": head_noisy_half, "total": linear + attention + head_masked,
            "total_issue_convention": linear + attention + head_noisy_half}
