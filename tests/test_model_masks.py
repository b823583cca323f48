"""The block-diffusion mask against an independent definition, and FlexAttention's BlockMask
against the dense mask (element for element; on GPU also through the attention itself)."""

from __future__ import annotations

import pytest
import torch
from dicepipe.model.masks import (
    block_causal_mask,
    block_diffusion_mask_mod,
    dense_block_diffusion_mask,
    flex_block_diffusion_mask,
)


def _reference_single(n: int, block_size: int) -> torch.Tensor:
    """BD3-LM's definition for one sample laid out as [x_t (n) | x_0 (n)], written as loops."""
    size = 2 * n
    mask = torch.zeros(size, size, dtype=torch.bool)
    for q in range(size):
        for k in range(size):
            q_clean, k_clean = q >= n, k >= n
            q_blk, k_blk = (q % n) // block_size, (k % n) // block_size
            m_bd = q_blk == k_blk and q_clean == k_clean
            m_obc = (not q_clean) and k_clean and q_blk > k_blk
            m_bc = q_clean and k_clean and q_blk >= k_blk
            mask[q, k] = m_bd or m_obc or m_bc
    return mask


def _reference_packed(lengths: list[int], block_size: int) -> torch.Tensor:
    """Several samples in one row: each sample's own [x_t | x_0] mask, no attention across
    samples, mapped into the row layout [x_t of all samples | x_0 of all samples]."""
    n = sum(lengths)
    mask = torch.zeros(2 * n, 2 * n, dtype=torch.bool)
    offset = 0
    for length in lengths:
        single = _reference_single(length, block_size)
        # sample index i (0..2*length) -> row index
        row_index = [offset + i if i < length else n + offset + i - length for i in range(2 * length)]
        idx = torch.tensor(row_index)
        mask[idx[:, None], idx[None, :]] = single
        offset += length
    return mask


def _doc_ids(lengths: list[int]) -> torch.Tensor:
    return torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])[None]


@pytest.mark.parametrize("lengths,block_size", [([12], 4), ([8, 4, 12], 4), ([6, 10], 2), ([16], 8)])
def test_dense_mask_matches_reference(lengths, block_size):
    dense = dense_block_diffusion_mask(_doc_ids(lengths), block_size)[0, 0]
    assert torch.equal(dense, _reference_packed(lengths, block_size))


def test_every_query_keeps_a_key_and_halves_are_separated():
    lengths = [8, 4, 20]  # the last one plays the row's padding sample
    dense = dense_block_diffusion_mask(_doc_ids(lengths), 4)[0, 0]
    n = sum(lengths)
    assert dense.any(dim=1).all()
    assert not dense[n:, :n].any()  # clean never sees noisy


def _effective_mask(block_mask, mask_mod, batch: int, length: int) -> torch.Tensor:
    """What FlexAttention computes with `block_mask`: full tiles entirely, partial tiles
    through mask_mod, everything else skipped."""
    tile_q, tile_kv = block_mask.BLOCK_SIZE
    out = torch.zeros(batch, length, length, dtype=torch.bool)
    q_idx = torch.arange(length)[:, None]
    kv_idx = torch.arange(length)[None, :]

    def tiles(num, indices, b, qt):
        count = int(num[b, 0, qt])
        return indices[b, 0, qt, :count].tolist()

    for b in range(batch):
        exact = mask_mod(torch.tensor(b), torch.tensor(0), q_idx, kv_idx)
        for qt in range(length // tile_q):
            rows = slice(qt * tile_q, (qt + 1) * tile_q)
            for kt in tiles(block_mask.kv_num_blocks.cpu(), block_mask.kv_indices.cpu(), b, qt):
                cols = slice(kt * tile_kv, (kt + 1) * tile_kv)
                out[b, rows, cols] = exact[rows, cols]
            if block_mask.full_kv_num_blocks is not None:
                for kt in tiles(block_mask.full_kv_num_blocks.cpu(), block_mask.full_kv_indices.cpu(), b, qt):
                    out[b, rows, kt * tile_kv : (kt + 1) * tile_kv] = True
    return out


def _packed_docs(device) -> torch.Tensor:
    # two rows of 256 tokens: different packings, each ending in its padding sample
    row0 = torch.cat([torch.full((100,), 0), torch.full((60,), 1), torch.full((96,), 2)])
    row1 = torch.cat([torch.full((200,), 3), torch.full((56,), 4)])
    return torch.stack([row0, row1]).to(device)


def _check_block_mask(device):
    docs = _packed_docs(device)
    block_mask = flex_block_diffusion_mask(docs, 4)
    mask_mod = block_diffusion_mask_mod(docs.cpu(), 4)
    effective = _effective_mask(block_mask, mask_mod, 2, 512)
    dense = dense_block_diffusion_mask(docs.cpu(), 4)[:, 0]
    assert torch.equal(effective, dense)
    # the point of the BlockMask: about half the tiles are skipped
    assert block_mask.sparsity() > 30


def test_flex_block_mask_matches_dense_on_cpu():
    _check_block_mask("cpu")


@pytest.mark.gpu
def test_flex_block_mask_matches_dense_on_gpu():
    _check_block_mask("cuda")


@pytest.mark.gpu
def test_flex_attention_matches_sdpa_with_dense_mask():
    from dicepipe.model.attention import block_diffusion_attention

    torch.manual_seed(0)
    docs = _packed_docs("cuda")
    q = torch.randn(2, 8, 512, 64, device="cuda")
    k = torch.randn(2, 4, 512, 64, device="cuda")
    v = torch.randn(2, 4, 512, 64, device="cuda")
    flex_out, _ = block_diffusion_attention(None, q, k, v, flex_block_diffusion_mask(docs, 4), scaling=0.125)
    dense = dense_block_diffusion_mask(docs, 4)
    sdpa_out, _ = block_diffusion_attention(None, q, k, v, dense, scaling=0.125)
    torch.testing.assert_close(flex_out, sdpa_out, atol=2e-3, rtol=2e-3)


def test_block_causal_inference_mask():
    pads = torch.tensor([0, 4])
    mask = block_causal_mask(pads, 8, 4, 16, 4)[:, 0]  # queries at columns 8..11
    for r, pad in enumerate(pads.tolist()):
        for i in range(4):
            for j in range(16):
                assert bool(mask[r, i, j]) == (pad <= j < 12), (r, i, j)
    causal = block_causal_mask(torch.tensor([2]), 0, 6, 6, 1)[0, 0]
    for i in range(6):
        for j in range(6):
            expected = (2 <= j <= i) or (i == j)  # padding queries see themselves
            assert bool(causal[i, j]) == expected

