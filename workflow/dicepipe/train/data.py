"""SFT data: chat-formatted examples packed into rows, and which rows each optimizer step
and rank takes. The order of an epoch and the noise of a micro-batch are functions of
(seed, epoch, position), so a resumed run takes the same batches."""

from __future__ import annotations

import hashlib
import logging
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..model.layout import PackedRows, TrainBatch, build_rows, make_train_batch, pack_examples
from ..model.settings import BlockSettings
from ..model.tokenizer import SFTExample, chat_format, encode_sft_example

log = logging.getLogger(__name__)


@dataclass
class SFTData:
    examples: list[SFTExample]
    rows: list[list[int]]  # example indices per packed row
    dropped: int  # examples longer than cutoff_len (dropped, as LLaMA-Factory's truncate_mode: drop)

    @property
    def num_tokens(self) -> int:
        return sum(len(ex) for ex in self.examples)


def prepare_sft_data(prompts: Sequence[str], responses: Sequence[str], tokenizer,
                     settings: BlockSettings, cutoff_len: int, pack: bool = True) -> SFTData:
    fmt = chat_format(tokenizer)
    encoded = [encode_sft_example(tokenizer, fmt, p, r, settings.block_size, settings.pad_token_id)
               for p, r in zip(prompts, responses)]
    kept = [ex for ex in encoded if len(ex) <= cutoff_len]
    dropped = len(encoded) - len(kept)
    if dropped:
        log.warning("dropped %d of %d examples longer than cutoff_len %d", dropped, len(encoded), cutoff_len)
    rows = pack_examples([len(ex) for ex in kept], cutoff_len) if pack else [[i] for i in range(len(kept))]
    return SFTData(kept, rows, dropped)


def stable_seed(*parts: int) -> int:
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@dataclass(frozen=True)
class StepPlan:
    """Micro-batches of `batch_size` rows; an optimizer step takes world_size x grad_accum
    of them (the last step of an epoch wraps around to the epoch's first micro-batches)."""

    num_rows: int
    batch_size: int
    grad_accum: int
    world_size: int
    epochs: int
    seed: int

    @property
    def micro_batches_per_epoch(self) -> int:
        return math.ceil(self.num_rows / self.batch_size)

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.micro_batches_per_epoch / (self.grad_accum * self.world_size))

    @property
    def total_steps(self) -> int:
        return self.steps_per_epoch * self.epochs

    def epoch_order(self, epoch: int) -> list[int]:
        order = list(range(self.num_rows))
        random.Random(stable_seed(self.seed, epoch)).shuffle(order)
        return order

    def micro_batches(self, step: int, rank: int) -> list[tuple[int, list[int]]]:
        """(position in epoch, row indices) for each accumulation slot of `rank` at `step`."""
        epoch, in_epoch = divmod(step, self.steps_per_epoch)
        order = self.epoch_order(epoch)
        per_step = self.grad_accum * self.world_size
        out = []
        for slot in range(self.grad_accum):
            position = (in_epoch * per_step + slot * self.world_size + rank) % self.micro_batches_per_epoch
            rows = order[position * self.batch_size : (position + 1) * self.batch_size]
            out.append((position, rows))
        return out


def row_length(rows: Sequence[Sequence[SFTExample]], cutoff_len: int, block_size: int, fixed: bool) -> int:
    """Fixed shapes (GPU: one compiled graph, whole 128-token mask tiles) or the longest row
    rounded to the block size (CPU: no wasted work)."""
    if fixed:
        multiple = math.lcm(128, block_size)
        return math.ceil(cutoff_len / multiple) * multiple
    longest = max(sum(len(ex) for ex in row) for row in rows)
    return math.ceil(longest / block_size) * block_size


def micro_batch(data: SFTData, row_ids: Sequence[int], settings: BlockSettings, noise_eps: float,
                noise_seed: int, cutoff_len: int, fixed_shape: bool) -> TrainBatch:
    rows = [[data.examples[i] for i in data.rows[r]] for r in row_ids]
    length = row_length(rows, cutoff_len, settings.block_size, fixed_shape)
    packed: PackedRows = build_rows(rows, length, settings.pad_token_id)
    generator = torch.Generator().manual_seed(noise_seed)
    return make_train_batch(packed, settings.mask_token_id, noise_eps, generator)
