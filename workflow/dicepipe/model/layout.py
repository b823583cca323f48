"""Training layout: packing examples into rows, the noise, the doubled [x_t | x_0] row.

Pure tensor transforms on CPU with an explicit torch.Generator, so a micro-batch is the same
on every run and after a resume; the trainer moves the result to its device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .tokenizer import IGNORE_INDEX, SFTExample

MAX_NOISE_RETRIES = 10


def first_fit_rows(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """First-fit decreasing: indices of `lengths` in rows of at most `capacity`, longest
    first (ties by index), each row's indices in the order they were placed; an item longer
    than `capacity` gets a row of its own (deterministic)."""
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        for r, room in enumerate(free):
            if lengths[i] <= room:
                rows[r].append(i)
                free[r] -= lengths[i]
                break
        else:
            rows.append([i])
            free.append(capacity - lengths[i])
    return rows


def pack_examples(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """First-fit decreasing: indices of examples per row, no row over `capacity` tokens.
    Deterministic (ties broken by index); examples longer than `capacity` are left out."""
    return [sorted(row) for row in first_fit_rows(lengths, capacity) if lengths[row[0]] <= capacity]


@dataclass
class PackedRows:
    """(rows, row_len) tensors; `doc_ids` unique per sample across the whole batch, row
    padding is a sample of its own (untrained, positions counting on from 0)."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    doc_ids: torch.Tensor
    position_ids: torch.Tensor


def build_rows(rows: Sequence[Sequence[SFTExample]], row_len: int, pad_token_id: int) -> PackedRows:
    shape = (len(rows), row_len)
    ids = torch.full(shape, pad_token_id, dtype=torch.long)
    labels = torch.full(shape, IGNORE_INDEX, dtype=torch.long)
    docs = torch.zeros(shape, dtype=torch.long)
    pos = torch.zeros(shape, dtype=torch.long)
    doc = 0
    for r, examples in enumerate(rows):
        at = 0
        for ex in examples:
            n = len(ex)
            ids[r, at : at + n] = torch.tensor(ex.input_ids)
            labels[r, at : at + n] = torch.tensor(ex.labels)
            docs[r, at : at + n] = doc
            pos[r, at : at + n] = torch.arange(n)
            at, doc = at + n, doc + 1
        if at > row_len:
            raise ValueError(f"row {r} holds {at} tokens, more than row_len {row_len}")
        docs[r, at:] = doc
        pos[r, at:] = torch.arange(row_len - at)
        doc += 1
    return PackedRows(ids, labels, docs, pos)


def sample_noise(rows: PackedRows, noise_eps: float, generator: torch.Generator):
    """One noise level per sample: t ~ U(0,1), p = (1-eps) t + eps; each trained token is
    masked with probability p (redrawn up to 10 times until at least one is, else one is
    forced). Returns (masked bool, p per token)."""
    trainable = rows.labels != IGNORE_INDEX
    num_docs = int(rows.doc_ids.max()) + 1
    t = torch.rand(num_docs, generator=generator, dtype=torch.float64)
    p_doc = (1.0 - noise_eps) * t + noise_eps
    p_tok = p_doc[rows.doc_ids]
    masked = (torch.rand(rows.labels.shape, generator=generator, dtype=torch.float64) < p_tok) & trainable
    for doc in _docs_without_masks(rows.doc_ids, trainable, masked):
        in_doc = (rows.doc_ids == doc) & trainable
        for _ in range(MAX_NOISE_RETRIES):
            draw = (torch.rand(rows.labels.shape, generator=generator, dtype=torch.float64) < p_tok) & in_doc
            if draw.any():
                break
        else:
            draw = torch.zeros_like(in_doc)
            positions = in_doc.flatten().nonzero().flatten()
            pick = torch.randint(len(positions), (1,), generator=generator)
            draw.view(-1)[positions[pick]] = True
        masked |= draw
    return masked, p_tok


def _docs_without_masks(doc_ids, trainable, masked) -> list[int]:
    has_labels = torch.zeros(int(doc_ids.max()) + 1, dtype=torch.bool)
    has_masks = has_labels.clone()
    has_labels[doc_ids[trainable]] = True
    has_masks[doc_ids[masked]] = True
    return (has_labels & ~has_masks).nonzero().flatten().tolist()


@dataclass
class TrainBatch:
    input_ids: torch.Tensor  # (B, 2n): [x_t | x_0]
    position_ids: torch.Tensor  # (B, 2n): the same positions for both halves
    doc_ids: torch.Tensor  # (B, n)
    masked: torch.Tensor  # (B, n) bool: noisy positions that carry a loss
    targets: torch.Tensor  # (M,) clean tokens at masked positions
    weights: torch.Tensor  # (M,) 1/p at masked positions
    num_label_tokens: int  # trained tokens in the micro-batch (the loss denominator)
    num_tokens: int  # non-padding tokens in the micro-batch

    def to(self, device) -> TrainBatch:
        moved = {k: (v.to(device, non_blocking=True) if torch.is_tensor(v) else v)
                 for k, v in self.__dict__.items()}
        return TrainBatch(**moved)


def make_train_batch(rows: PackedRows, mask_token_id: int, noise_eps: float,
                     generator: torch.Generator) -> TrainBatch:
    masked, p_tok = sample_noise(rows, noise_eps, generator)
    noisy = torch.where(masked, torch.full_like(rows.input_ids, mask_token_id), rows.input_ids)
    trainable = rows.labels != IGNORE_INDEX
    return TrainBatch(
        input_ids=torch.cat([noisy, rows.input_ids], dim=1),
        position_ids=torch.cat([rows.position_ids, rows.position_ids], dim=1),
        doc_ids=rows.doc_ids,
        masked=masked,
        targets=rows.input_ids[masked],
        weights=(1.0 / p_tok[masked]).to(torch.float32),
        num_label_tokens=int(trainable.sum()),
        num_tokens=int((~_is_row_tail(rows)).sum()),
    )


def _is_row_tail(rows: PackedRows) -> torch.Tensor:
    """True on the trailing padding sample of each row (which holds no trained tokens)."""
    last_doc = rows.doc_ids[:, -1:]
    tail = rows.doc_ids == last_doc
    tail_has_labels = ((rows.labels != IGNORE_INDEX) & tail).any(dim=1, keepdim=True)
    return tail & ~tail_has_labels
