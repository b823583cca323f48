"""Batched decoding: block diffusion with a KV cache across blocks, and plain
autoregressive decoding for causal baselines, behind one interface (`Decoder.generate`).

Block diffusion (SDAR's scheme, blocks aligned to each row's position 0): prefill the
prompt's full blocks; the prompt's tail and mask tokens form the first block; each block is
denoised in up to `denoising_steps` forwards over the cached prefix, committing some masked
positions per step (static / dynamic / sequential); the finished block's keys/values are
then written by one more forward, which here is fused with the first step of the next
block (one forward of 2 blocks, the first clean), so a block costs `steps` forwards, not
`steps + 1`. Rows stop at a stop token (checked after each block) and leave the batch.
With static or sequential remasking every row of a fresh block has the same number of
masked positions at each step, known on the host, so the output layer runs at those
positions only (`masked_logits`), in a shape that stays fixed for the CUDA graphs.

Every generated token keeps its id and the global denoising step that committed it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .kv_engine import KVCacheEngine
from .sampling import STRATEGIES, sample_tokens, select_transfers, transfer_schedule
from .settings import BlockSettings


@dataclass(frozen=True)
class DecodeSettings:
    max_new_tokens: int = 512
    denoising_steps: int = 4
    strategy: str = "static"  # static | dynamic | sequential
    threshold: float = 0.9  # dynamic only
    temperature: float = 1.0
    top_k: int = 0  # 0 = off; 1 = greedy
    top_p: float = 1.0
    seed: int = 0
    stop_at_end: bool = True
    fuse_commit: bool = True
    stop_check_every: int = 16  # autoregressive: tokens between stop checks

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy {self.strategy!r}: expected one of {STRATEGIES}")
        if self.max_new_tokens < 1 or self.denoising_steps < 1:
            raise ValueError("max_new_tokens and denoising_steps must be >= 1")


@dataclass
class Generation:
    token_ids: list[int]  # generated ids, through the first stop token if one came
    unmask_steps: list[int]  # per token: the global denoising step that committed it
    stopped: bool  # ended at a stop token (else at max_new_tokens)
    # Block decoding commits whole blocks: the rest of the last block after the text (after
    # the stop token, or past max_new_tokens) was sampled too, and the text's tokens were
    # chosen seeing it. RL scores the policy on every committed token (`trace_ids`).
    tail_ids: list[int] = field(default_factory=list)
    tail_steps: list[int] = field(default_factory=list)

    @property
    def trace_ids(self) -> list[int]:
        """Every token the decoder committed: the text, then the rest of its last block."""
        return self.token_ids + self.tail_ids

    @property
    def trace_steps(self) -> list[int]:
        return self.unmask_steps + self.tail_steps


@dataclass
class DecodeResult:
    generations: list[Generation]
    forwards: int  # model forward passes (prefill chunks count once)
    commit_logits: list = field(default_factory=list)  # (row ids, block, logits): tests only


@dataclass
class _BlockPlan:
    """Canvas layout: rows left-padded so that every row's blocks line up."""

    block_size: int
    lengths: list[int]
    prefix_blocks: int  # full prompt blocks of the longest prefix (prefilled)
    num_blocks: int  # decode blocks

    @classmethod
    def make(cls, prompts, block_size: int, max_new_tokens: int) -> _BlockPlan:
        lengths = [len(p) for p in prompts]
        prefix_blocks = max(n // block_size for n in lengths)
        tail = max(n % block_size for n in lengths)
        return cls(block_size, lengths, prefix_blocks, math.ceil((tail + max_new_tokens) / block_size))

    @property
    def prefix_len(self) -> int:
        return self.prefix_blocks * self.block_size

    @property
    def total_len(self) -> int:
        return self.prefix_len + self.num_blocks * self.block_size

    def tails(self) -> list[int]:
        return [n % self.block_size for n in self.lengths]

    def pad_offsets(self) -> torch.Tensor:
        return torch.tensor([self.prefix_len - (n // self.block_size) * self.block_size for n in self.lengths])

    def prefix_tokens(self, prompts, pad_id: int) -> torch.Tensor:
        tokens = torch.full((len(prompts), self.prefix_len), pad_id, dtype=torch.long)
        for r, (prompt, pad) in enumerate(zip(prompts, self.pad_offsets().tolist())):
            body = prompt[: self.prefix_len - pad]
            tokens[r, pad:] = torch.tensor(body, dtype=torch.long)
        return tokens

    def first_block(self, prompts, mask_id: int) -> torch.Tensor:
        block = torch.full((len(prompts), self.block_size), mask_id, dtype=torch.long)
        for r, (prompt, tail) in enumerate(zip(prompts, self.tails())):
            if tail:
                block[r, :tail] = torch.tensor(prompt[len(prompt) - tail :], dtype=torch.long)
        return block


class Decoder:
    """Decodes with one model; keeps its KV engine (and captured CUDA graphs) between calls."""

    def __init__(self, lm, settings: BlockSettings, *, cuda_graphs: bool | None = None,
                 len_bucket: int = 128, compile_layers: bool = False, attention: str = "auto",
                 fuse_projections: bool = True, masked_logits: bool = True, fuse_boundary: bool = True,
                 compile_prefill: bool = True, overlap_min_tokens: int | None = None,
                 kv_cache_dtype: torch.dtype | None = None, weight_dtype: torch.dtype | None = None):
        """compile_layers: torch.compile the per-token layer parts of the decode forwards
        (and with compile_prefill, of the prefill, for any prompt length); fuse_boundary:
        compile a layer's MLP with the next layer's norm and projection as one graph;
        overlap_min_tokens: forwards of at least this many tokens (rows x positions) run
        as two half-batches on two CUDA streams, one half's attention beside the other's
        matmuls (None: never; off by default: on the H200 at 4B, batch 128 it cost 8%, the
        matmuls take every SM, so the halves do not really run side by side); kv_cache_dtype:
        e.g. torch.float8_e4m3fn for a KV cache of half the bytes (CUDA, Triton attention and
        fused projections only; unscaled, so it changes the numerics: off by default);
        weight_dtype: torch.float8_e4m3fn runs each layer's four matmuls in float8 (weights
        per output channel, activations per token; layer_parts.fp8_linear): +13-15% at 4B,
        batch 128 on the H200, nothing or a loss at small batches; changed numerics, off by
        default (the output layer and attention stay in the model dtype)."""
        self.lm = lm
        self.settings = settings
        self.device = next(lm.parameters()).device
        self.cuda_graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        self.len_bucket = len_bucket
        self.compile_layers = compile_layers
        self.attention = attention
        self.fuse_projections = fuse_projections
        self.masked_logits = masked_logits
        self.fuse_boundary = fuse_boundary
        self.compile_prefill = compile_prefill and compile_layers
        self.overlap_min_tokens = overlap_min_tokens
        self.kv_cache_dtype = kv_cache_dtype
        self.weight_dtype = weight_dtype
        self.engine: KVCacheEngine | None = None

    def _engine(self, rows: int, length: int) -> KVCacheEngine:
        eng = self.engine
        if eng is None or rows > eng.max_batch or length > eng.max_len:
            self.engine = None
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            self.engine = KVCacheEngine(self.lm, self.settings.block_size, rows, length,
                                        cuda_graphs=self.cuda_graphs, len_bucket=self.len_bucket,
                                        compile_layers=self.compile_layers, attention=self.attention,
                                        fuse_projections=self.fuse_projections,
                                        fuse_boundary=self.fuse_boundary, compile_prefill=self.compile_prefill,
                                        overlap_min_tokens=self.overlap_min_tokens,
                                        kv_dtype=self.kv_cache_dtype, weight_dtype=self.weight_dtype)
        self.engine.forwards = 0
        return self.engine

    def warm_up(self, prompts: list[list[int]], cfg: DecodeSettings) -> None:
        """Run (and so capture, or compile) every forward shape that `generate(prompts, cfg)`
        uses, once per key-length bucket, on dummy tokens; a timed generate() then measures
        decoding alone. Harmless: every cache column a generation reads it first writes."""
        size = self.settings.block_size
        if self.settings.causal:
            first, total = max(map(len, prompts)), max(map(len, prompts)) + cfg.max_new_tokens
            shapes = [(1, 1, 0)]
        else:
            plan = _BlockPlan.make(prompts, size, cfg.max_new_tokens)
            first, total = plan.prefix_len, plan.total_len
            shapes = [(size, size, 0), (2 * size, size, 0) if cfg.fuse_commit else (size, 0, 0)]
            shapes += [(size, size, n) for n in self._selected_counts(size, cfg) if n < size]
        eng = self._engine(len(prompts), total)
        eng.begin(torch.zeros(len(prompts), dtype=torch.long))
        if first and eng.compiled_prefill is not None:  # compiles the prefill's parts
            eng.prefill(torch.zeros((len(prompts), first), dtype=torch.long))
        for key_len in range(eng.len_bucket, eng.max_len + 1, eng.len_bucket):
            for q, logits_last, n in shapes:
                start = min(key_len, total) - q
                start -= start % size
                if start >= first and eng._key_len(start + q) == key_len:
                    tokens = torch.zeros((len(prompts), q), dtype=torch.long, device=self.device)
                    select = torch.zeros((len(prompts), n), dtype=torch.long, device=self.device) if n else None
                    eng.forward(tokens, start, logits_last, select)
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def generate(self, prompts: list[list[int]], cfg: DecodeSettings,
                 record_commit_logits: bool = False) -> DecodeResult:
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if self.settings.causal:
            return self._generate_autoregressive(prompts, cfg)
        return self._generate_blocks(prompts, cfg, record_commit_logits)

    # --- block diffusion --------------------------------------------------------------
    def _generate_blocks(self, prompts, cfg: DecodeSettings, record: bool) -> DecodeResult:
        size, pad_id = self.settings.block_size, self.settings.pad_token_id
        plan = _BlockPlan.make(prompts, size, cfg.max_new_tokens)
        eng = self._engine(len(prompts), plan.total_len)
        eng.begin(plan.pad_offsets())
        if plan.prefix_len:
            eng.prefill(plan.prefix_tokens(prompts, pad_id))
        generator = torch.Generator(self.device).manual_seed(cfg.seed)
        out_tokens = torch.full((len(prompts), plan.num_blocks * size), pad_id, device=self.device)
        out_steps = torch.full_like(out_tokens, -1)
        rows = torch.arange(len(prompts), device=self.device)
        rows_host = torch.arange(len(prompts))
        block = plan.first_block(prompts, self.settings.mask_token_id).to(self.device)
        state = _BlockState(prev=None, step=0, record=[] if record else None)
        tails = plan.tails()
        for index in range(plan.num_blocks):
            start = plan.prefix_len + index * size
            if index == 0:  # rows differ in their prompt tails unless all tails are equal
                fresh = size - tails[0] if len(set(tails)) == 1 else None
            else:
                fresh = size
            block, steps = self._denoise_block(eng, block, start, cfg, state, generator, rows, fresh)
            out_tokens[rows, index * size : (index + 1) * size] = block
            out_steps[rows, index * size : (index + 1) * size] = steps
            if index == plan.num_blocks - 1:
                self._record_last(eng, block, start, rows, index, state)
                break
            done = self._rows_done(block, index, plan, rows_host, cfg)
            if bool(done.all()):
                break
            if bool(done.any()):
                keep = (~done).nonzero().flatten()
                eng.keep_rows(keep)
                rows_host = rows_host[keep]
                rows, block = rows[keep.to(self.device)], block[keep.to(self.device)]
            if not cfg.fuse_commit:
                self._commit(eng, block, start, rows, index, state)
            state.prev = (block, rows, index) if cfg.fuse_commit else None
            block = torch.full_like(block, self.settings.mask_token_id)
        gens = _collect(out_tokens, out_steps, plan.tails(), cfg, self.settings.stop_token_ids, size)
        return DecodeResult(gens, eng.forwards, state.record or [])

    def _selected_counts(self, masked: int, cfg: DecodeSettings) -> list[int]:
        """Masked positions before each step of a block with `masked` masked positions in
        every row (static/sequential); [] where the counts are not known on the host."""
        if not self.masked_logits or cfg.strategy not in ("static", "sequential"):
            return []
        steps = min(cfg.denoising_steps, self.settings.block_size)
        schedule = transfer_schedule(torch.tensor([masked]), cfg.denoising_steps)[0].tolist()
        counts, left = [], masked
        for i in range(steps):
            counts.append(left)
            left -= left if i == steps - 1 else schedule[i]
        return counts

    def _denoise_block(self, eng, block, start, cfg, state, generator, rows, fresh: int | None):
        masked = block == self.settings.mask_token_id
        schedule = transfer_schedule(masked.sum(dim=1), cfg.denoising_steps)
        iterations = min(cfg.denoising_steps, self.settings.block_size)
        counts = self._selected_counts(fresh, cfg) if fresh is not None and state.record is None else []
        steps = torch.full_like(block, -1)
        for i in range(iterations):
            select = None
            if counts and 0 < counts[i] < block.shape[1]:
                select = _masked_positions(masked, counts[i])
            logits = self._block_logits(eng, block, start, state if i == 0 else None, rows, select)
            vocab = logits.shape[-1]
            tokens, confidence = sample_tokens(logits.reshape(-1, vocab), cfg.temperature, cfg.top_k,
                                               cfg.top_p, generator)
            if select is None:
                tokens, confidence = tokens.view_as(block), confidence.view_as(block)
            else:  # back to block positions; unselected positions are not masked, never chosen
                tokens = block.scatter(1, select, tokens.view_as(select))
                confidence = torch.zeros(block.shape, dtype=confidence.dtype, device=block.device).scatter_(
                    1, select, confidence.view_as(select))
            last = i == iterations - 1
            count = masked.sum(dim=1) if last else schedule[:, i]
            if cfg.strategy == "dynamic":
                count = torch.where(masked.any(dim=1), count.clamp(min=1), count)
            chosen = select_transfers(masked, confidence, count, cfg.strategy, cfg.threshold)
            block = torch.where(chosen, tokens, block)
            steps = torch.where(chosen, torch.full_like(steps, state.step), steps)
            masked = masked & ~chosen
            state.step += 1
            if cfg.strategy == "dynamic" and not last and not bool(masked.any()):
                break
        return block, steps

    def _block_logits(self, eng, block, start, state, rows, select=None):
        size = self.settings.block_size
        if state is None or state.prev is None:
            return eng.forward(block, start, size, select)
        prev_block, prev_rows, prev_index = state.prev
        recording = state.record is not None
        logits = eng.forward(torch.cat([prev_block, block], dim=1), start - size,
                             2 * size if recording else size)
        if recording:
            state.record.append((prev_rows.cpu(), prev_index, logits[:, :size].float().cpu()))
            logits = logits[:, size:]
        return logits

    def _commit(self, eng, block, start, rows, index, state):
        recording = state.record is not None
        logits = eng.forward(block, start, self.settings.block_size if recording else 0)
        if recording:
            state.record.append((rows.cpu(), index, logits.float().cpu()))

    def _record_last(self, eng, block, start, rows, index, state):
        if state.record is not None:
            self._commit(eng, block, start, rows, index, state)

    def _rows_done(self, block, index, plan, rows_host, cfg) -> torch.Tensor:
        """Rows that hit a stop token in this block or have max_new_tokens; on the host.
        Without stop tokens this needs nothing from the GPU, so the host never waits for it
        and keeps the GPU's queue full across blocks."""
        size = self.settings.block_size
        tails = torch.tensor(plan.tails())[rows_host]
        done = (index + 1) * size - tails >= cfg.max_new_tokens
        if cfg.stop_at_end:
            stops = torch.tensor(self.settings.stop_token_ids, device=self.device)
            col = torch.arange(size, device=self.device)[None, :]
            first = tails.to(self.device)[:, None] if index == 0 else torch.zeros((1, 1), dtype=torch.long, device=self.device)
            done = done | (torch.isin(block, stops) & (col >= first)).any(dim=1).cpu()
        return done

    # --- autoregressive ---------------------------------------------------------------
    def _generate_autoregressive(self, prompts, cfg: DecodeSettings) -> DecodeResult:
        lengths = [len(p) for p in prompts]
        width = max(lengths)
        pad_id = self.settings.pad_token_id
        eng = self._engine(len(prompts), width + cfg.max_new_tokens)
        eng.begin(torch.tensor([width - n for n in lengths]))
        tokens = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        for r, prompt in enumerate(prompts):
            tokens[r, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        logits = eng.prefill(tokens, 1)[:, -1]
        generator = torch.Generator(self.device).manual_seed(cfg.seed)
        out = torch.full((len(prompts), cfg.max_new_tokens), pad_id, device=self.device)
        rows = torch.arange(len(prompts), device=self.device)
        stops = torch.tensor(self.settings.stop_token_ids, device=self.device)
        for t in range(cfg.max_new_tokens):
            token, _ = sample_tokens(logits, cfg.temperature, cfg.top_k, cfg.top_p, generator)
            out[rows, t] = token
            if t == cfg.max_new_tokens - 1:
                break
            if cfg.stop_at_end and (t + 1) % cfg.stop_check_every == 0:
                done = torch.isin(out[rows, : t + 1], stops).any(dim=1).cpu()
                if bool(done.all()):
                    break
                if bool(done.any()):
                    keep = (~done).nonzero().flatten()
                    eng.keep_rows(keep)
                    rows, token = rows[keep.to(self.device)], token[keep.to(self.device)]
            logits = eng.forward(token[:, None], width + t, 1)[:, -1]
        steps = torch.arange(cfg.max_new_tokens, device=self.device).expand_as(out)
        gens = _collect(out, steps, [0] * len(prompts), cfg, self.settings.stop_token_ids)
        return DecodeResult(gens, eng.forwards)


def _masked_positions(masked: torch.Tensor, count: int) -> torch.Tensor:
    """(rows, count) ascending columns of the masked positions; every row has `count`."""
    col = torch.arange(masked.shape[1], device=masked.device).expand_as(masked)
    return torch.where(masked, col, col + masked.shape[1]).sort(dim=1).values[:, :count]


@dataclass
class _BlockState:
    prev: tuple | None  # (clean block, its row ids, its block index) awaiting its KV write
    step: int
    record: list | None


def _collect(out_tokens, out_steps, tails, cfg: DecodeSettings, stop_ids,
             block_size: int = 1) -> list[Generation]:
    """Text = through the first stop token (or max_new_tokens); tail = the rest of the
    text's last block, committed too (empty for autoregressive rows, block_size 1)."""
    tokens, steps = out_tokens.cpu().tolist(), out_steps.cpu().tolist()
    stop_set = set(stop_ids)
    gens = []
    for row_tokens, row_steps, tail in zip(tokens, steps, tails):
        ids = row_tokens[tail : tail + cfg.max_new_tokens]
        end = next((i + 1 for i, tok in enumerate(ids) if tok in stop_set), None) if cfg.stop_at_end else None
        text_len = len(ids) if end is None else end
        block_end = -(-(tail + text_len) // block_size) * block_size
        gens.append(Generation(row_tokens[tail : tail + text_len], row_steps[tail : tail + text_len],
                               end is not None, row_tokens[tail + text_len : block_end],
                               row_steps[tail + text_len : block_end]))
    return gens
