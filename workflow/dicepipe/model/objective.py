"""The block-diffusion training objective around a transformers Qwen3ForCausalLM.

`BlockDiffusionLM` runs the stock decoder layers over the doubled [x_t | x_0] row with the
block-diffusion mask and returns sum_i CE_i / p_i over the masked noisy positions (the
output layer sees only those rows). The trainer divides by the micro-batch's trained-token
count (SDAR's normalisation). It is also the root module for FSDP: parallelism, compile
and activation checkpointing are applied to it from outside (train/parallel.py).
"""

from __future__ import annotations

import torch
from torch import nn

from . import attention
from .layout import TrainBatch
from .loss import linear_cross_entropy_sum
from .masks import dense_block_diffusion_mask, flex_block_diffusion_mask


class BlockDiffusionLM(nn.Module):
    def __init__(self, lm, block_size: int, compute_dtype: torch.dtype | None = None):
        super().__init__()
        self.lm = lm
        self.block_size = block_size
        # bf16 activations with fp32 parameters under autocast (as DeepSpeed/FSDP bf16 run);
        # None keeps the parameters' dtype (CPU, fp32 tests).
        self.compute_dtype = compute_dtype
        attention.install(lm)

    def attention_mask(self, doc_ids: torch.Tensor, use_flex: bool):
        if use_flex:
            return flex_block_diffusion_mask(doc_ids, self.block_size)
        return dense_block_diffusion_mask(doc_ids, self.block_size)

    def hidden_states(self, input_ids, position_ids, attention_mask) -> torch.Tensor:
        """Final-norm hidden states (B, L, H) under an arbitrary 4D/BlockMask mask."""
        inner = self.lm.model
        hidden = inner.embed_tokens(input_ids)
        if self.compute_dtype is not None:
            hidden = hidden.to(self.compute_dtype)
        position_embeddings = inner.rotary_emb(hidden, position_ids)
        for layer in inner.layers:
            hidden = layer(hidden, attention_mask=attention_mask, position_ids=position_ids,
                           position_embeddings=position_embeddings)
        hidden = inner.norm(hidden)
        return hidden if self.compute_dtype is None else hidden.to(self.compute_dtype)

    def forward(self, batch: TrainBatch, attention_mask) -> torch.Tensor:
        hidden = self.hidden_states(batch.input_ids, batch.position_ids, attention_mask)
        n = batch.masked.shape[1]
        noisy_masked = hidden[:, :n][batch.masked]
        return linear_cross_entropy_sum(noisy_masked, self.lm.lm_head.weight, batch.targets, batch.weights)

    def noisy_logits(self, batch: TrainBatch, attention_mask) -> torch.Tensor:
        """Full logits of the noisy half (B, n, V); for tests and small models only."""
        hidden = self.hidden_states(batch.input_ids, batch.position_ids, attention_mask)
        return self.lm.lm_head(hidden[:, : batch.masked.shape[1]])
