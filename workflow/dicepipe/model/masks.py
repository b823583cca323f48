"""Attention masks as pure functions of (query index, key index), in the manner of BD3-LM.

Training layout of one packed row of n tokens: `[x_t (noisy, n) | x_0 (clean, n)]`, both
halves with the same position ids. Each sample in the row starts on a block boundary (its
tokens are padded to a multiple of the block size), so the block of a token is simply its
index in the row divided by the block size, and blocks count from the sample's position 0.

A query may attend to a key of the same sample when
  - both noisy, same block (bidirectional inside a noisy block), or
  - query noisy, key clean, key's block strictly earlier, or
  - both clean, key's block not later (block-causal over the clean copy).
Clean never sees noisy; samples never see each other. Trailing row padding is a sample of
its own, so every query keeps at least itself.

The same function gives the dense boolean mask for SDPA (CPU training, where FlexAttention
has no backward) and the FlexAttention BlockMask (GPU).
"""

from __future__ import annotations

import torch


def block_diffusion_allowed(q_idx, kv_idx, q_doc, kv_doc, n: int, block_size: int):
    """Elementwise rule; indices are over the doubled row [0, 2n), docs are the sample ids of
    the query's and key's row positions. Works on broadcast tensors and inside mask_mods."""
    q_clean = q_idx >= n
    kv_clean = kv_idx >= n
    q_block = torch.where(q_clean, q_idx - n, q_idx) // block_size
    kv_block = torch.where(kv_clean, kv_idx - n, kv_idx) // block_size
    # clean key: block strictly earlier for a noisy query, not later for a clean one;
    # noisy key: same block, noisy query only
    clean_key_ok = kv_block < q_block + q_clean.to(q_block.dtype)
    noisy_key_ok = (kv_block == q_block) & ~q_clean
    return (q_doc == kv_doc) & torch.where(kv_clean, clean_key_ok, noisy_key_ok)


def dense_block_diffusion_mask(doc_ids: torch.Tensor, block_size: int) -> torch.Tensor:
    """Boolean (batch, 1, 2n, 2n) mask, True = attend. `doc_ids` is (batch, n)."""
    _batch, n = doc_ids.shape
    idx = torch.arange(2 * n, device=doc_ids.device)
    docs = torch.cat([doc_ids, doc_ids], dim=1)
    allowed = block_diffusion_allowed(
        idx[None, :, None], idx[None, None, :], docs[:, :, None], docs[:, None, :], n, block_size
    )
    return allowed[:, None]


def block_diffusion_mask_mod(doc_ids: torch.Tensor, block_size: int):
    """FlexAttention mask_mod over the doubled row for a (batch, n) tensor of sample ids."""
    n = doc_ids.shape[1]

    def mask_mod(b, h, q_idx, kv_idx):
        q_doc = doc_ids[b, torch.where(q_idx >= n, q_idx - n, q_idx)]
        kv_doc = doc_ids[b, torch.where(kv_idx >= n, kv_idx - n, kv_idx)]
        return block_diffusion_allowed(q_idx, kv_idx, q_doc, kv_doc, n, block_size)

    return mask_mod


def flex_block_diffusion_mask(doc_ids: torch.Tensor, block_size: int):
    """BlockMask for FlexAttention (tiles of 128x128; fully masked tiles are skipped)."""
    from torch.nn.attention.flex_attention import create_block_mask

    batch, n = doc_ids.shape
    return create_block_mask(block_diffusion_mask_mod(doc_ids, block_size), B=batch, H=None,
                             Q_LEN=2 * n, KV_LEN=2 * n, device=doc_ids.device)


def block_causal_mask(pad_offsets: torch.Tensor, query_start, query_len: int, key_len: int,
                      block_size: int) -> torch.Tensor:
    """Inference mask (batch, 1, query_len, key_len) over absolute canvas columns.

    Row r's tokens start at column `pad_offsets[r]` (left padding, a multiple of the block
    size), so blocks are aligned to each row's position 0. A query at column i sees keys at
    columns j with pad <= j, block(j) <= block(i), j < query_start + query_len; a padding
    query sees itself only. `query_start` may be a 0-dim tensor (CUDA graphs) or an int.
    With block_size 1 this is the ordinary causal mask (autoregressive decoding).
    """
    device = pad_offsets.device
    kv = torch.arange(key_len, device=device)
    q = torch.arange(query_len, device=device) + query_start
    visible = (kv[None, None, :] >= pad_offsets[:, None, None]) & (
        (kv // block_size)[None, None, :] <= (q // block_size)[None, :, None]
    )
    visible = visible & (kv < query_start + query_len)[None, None, :]
    visible = visible | (kv[None, None, :] == q[None, :, None])
    return visible[:, None]
