"""Policy updates of the RL stages: the trainable TracePolicy, log-probabilities of traces
in micro-batches, and one pass of PPO-clipped, KL-regularised updates over a step's kept
traces (several optimiser updates per step, as the release's gradient accumulation over its
rollouts; the optimiser's state carries across steps unless the stage resets it).

Micro-batches (`pack_tokens`): 0 = the release's shape, `micro_batch_traces` traces per
micro-batch, one trace per row; N > 0 = an update's traces packed first-fit decreasing into
rows of at most N layout tokens (clean copy + noisy copies; nothing attends across traces
in a row), one row per micro-batch. Packing changes neither the per-trace advantages nor the
loss's normaliser, so a step's loss is the same up to float error. On GPU every row is
padded to a length from a small set (the pack budget, else `bucket_length`), so the
compiled layers see few shapes.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from ..model.trace import (Trace, TraceBatch, TracePolicy, bucket_length, build_trace_batch, pack_rows,
                           trace_length, traces_forward_flops)
from .parallel import DistEnv, all_reduce_sum, parallelize
from .rl_loss import trace_policy_loss

# Compiled layers see one shape per row length and grad mode (old log-probabilities run
# without grad); dynamo's default of 8 recompiles would send the rest to eager.
RECOMPILE_LIMIT = 64


def build_policy(lm, block_size: int, settings: dict, env: DistEnv, trainable: bool = True):
    on_gpu = env.device.type == "cuda"
    bf16 = bool(settings["bf16"]) and on_gpu
    lm = lm.float() if env.distributed else lm.to(env.device).float()
    policy = TracePolicy(lm, block_size, compute_dtype=torch.bfloat16 if bf16 else None,
                         temperature=settings["temperature"])
    policy.train(trainable)
    if not trainable:
        for p in policy.parameters():
            p.requires_grad_(False)
    compile_layers = bool(settings["compile"]) and on_gpu
    if compile_layers:
        import torch._dynamo.config as dynamo_config

        for name in ("recompile_limit", "cache_size_limit"):
            if getattr(dynamo_config, name, RECOMPILE_LIMIT) < RECOMPILE_LIMIT:
                setattr(dynamo_config, name, RECOMPILE_LIMIT)
    parallelize(policy, env, compile_layers=compile_layers,
                activation_checkpointing=trainable and bool(settings["activation_checkpointing"]), bf16=bf16)
    return policy, bf16


def _micro_batches(items: list, settings: dict, block_size: int) -> list[list[list]]:
    """Micro-batches of an update's (rollout, advantage, weight) items, each a list of rows,
    each row a list of items: `micro_batch_traces` one-trace rows (`pack_tokens` 0), or one
    row per micro-batch packed up to `pack_tokens` layout tokens."""
    budget = settings["pack_tokens"]
    if not budget:
        size = settings["micro_batch_traces"]
        return [[[it] for it in items[i : i + size]] for i in range(0, len(items), size)]
    lengths = [trace_length(_trace(r), block_size) for r, _, _ in items]
    return [[[items[i] for i in row]] for row in pack_rows(lengths, budget)]


@dataclass
class Prepared:
    """A micro-batch's layout and mask, on the device; built once, scored by the old,
    reference and updated policies alike."""

    batch: TraceBatch
    mask: object


class TraceScorer:
    """Log-probabilities of micro-batches of traces under one policy module. `bucket`: pad
    every row to a length from a small set (default: on GPU, where layers are compiled per
    shape): the pack budget when the rows fit it, else `bucket_length`."""

    def __init__(self, policy, settings: dict, block_settings, env: DistEnv, bf16: bool,
                 bucket: bool | None = None):
        self.policy, self.env, self.bf16 = policy, env, bf16
        self.block, self.mask_id, self.pad_id = (block_settings.block_size, block_settings.mask_token_id,
                                                 block_settings.pad_token_id)
        choice = settings["attention"]
        self.use_flex = choice == "flex" or (choice == "auto" and env.device.type == "cuda")
        self.bucket = env.device.type == "cuda" if bucket is None else bucket
        self.pack_tokens = settings["pack_tokens"]
        self.row_multiple = 128 if env.device.type == "cuda" else 1  # FlexAttention's tile

    def row_length(self, longest: int) -> int | None:
        """The padded row length for rows of at most `longest` tokens (None: the longest)."""
        if not self.bucket:
            return None if self.row_multiple == 1 else math.ceil(longest / self.row_multiple) * self.row_multiple
        if self.pack_tokens and longest <= self.pack_tokens:
            length = self.pack_tokens
        else:
            length = bucket_length(longest)
        return math.ceil(length / self.row_multiple) * self.row_multiple

    def prepare(self, rows: list[list[Trace]]) -> Prepared:
        longest = max(sum(trace_length(t, self.block) for t in row) for row in rows)
        batch = build_trace_batch(rows, self.block, self.mask_id, self.pad_id,
                                  length=self.row_length(longest)).to(self.env.device)
        return Prepared(batch, self.policy.trace_mask(batch, self.use_flex))

    def score(self, prepared: Prepared) -> torch.Tensor:
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if self.bf16 else contextlib.nullcontext()
        with autocast:
            return self.policy(prepared.batch, prepared.mask)

    def __call__(self, traces: list[Trace]):
        """One trace per row (the release's layout): (log-probabilities, batch)."""
        prepared = self.prepare([[t] for t in traces])
        return self.score(prepared), prepared.batch


def _trace(r) -> Trace:
    return Trace(tuple(r.prompt_ids), tuple(r.token_ids), tuple(r.steps))


def _traces_of(rollouts) -> list[Trace]:
    return [_trace(r) for r in rollouts]


def _items(micro: list[list]) -> list:
    """A micro-batch's items in the layout's trace order (row-major)."""
    return [it for row in micro for it in row]


class EarlyLogprobs:
    """Old (and frozen-reference) log-probabilities of kept traces computed before training,
    while later chunks of the step are still being scored (rl.py hands each chunk's kept
    groups here as its rewards arrive); `train_on_rollouts` then gathers them for its
    micro-batches instead of running those forwards again. They do not depend on any reward,
    only on the traces and the policy before this step's updates, which is the policy here.
    One process only: under FSDP every rank would have to run the same forwards in step."""

    def __init__(self, scorer: TraceScorer, ref_scorer: TraceScorer | None, settings: dict):
        self.scorer, self.ref_scorer, self.settings = scorer, ref_scorer, settings
        self.store: dict[int, tuple] = {}  # id(rollout) -> (old, ref or None) by token order

    @torch.no_grad()
    def add(self, rollouts) -> None:
        items = [(r, 0.0, 1.0) for r in rollouts if id(r) not in self.store]
        for micro in _micro_batches(items, self.settings, self.scorer.block):  # as the update's
            prepared = self.scorer.prepare([_traces_of([r for r, _, _ in row]) for row in micro])
            old = _logprobs(self.scorer, prepared)
            ref = None if self.ref_scorer is None else _logprobs(self.ref_scorer, prepared)
            batch = prepared.batch
            for j, (r, _, _) in enumerate(_items(micro)):
                sel = batch.target_trace == j
                self.store[id(r)] = tuple(
                    None if values is None else
                    values.new_zeros(len(r.token_ids)).index_put_((batch.target_order[sel],), values[sel])
                    for values in (old, ref))

    def gather(self, items: list, batch: TraceBatch):
        """(old, ref) for a micro-batch's targets, or None if any of its traces is missing."""
        stored = [self.store.get(id(r)) for r, _, _ in items]
        if any(s is None for s in stored):
            return None
        lengths = torch.tensor([len(r.token_ids) for r, _, _ in items], device=batch.target_trace.device)
        starts = torch.cumsum(lengths, 0) - lengths
        index = starts[batch.target_trace] + batch.target_order
        old = torch.cat([s[0] for s in stored])[index]
        ref = old if self.ref_scorer is None else torch.cat([s[1] for s in stored])[index]
        return old, ref


def train_on_rollouts(scorer: TraceScorer, ref_scorer: TraceScorer | None, optimizer,
                      kept: list[tuple], fallback, settings: dict, env: DistEnv,
                      early: EarlyLogprobs | None = None) -> dict:
    """One pass over this rank's kept (rollout, advantage) pairs in `updates` optimiser
    updates, the same count on every rank (a rank short of traces runs zero-weight
    micro-batches of `fallback`). Old (and frozen-reference) log-probabilities of every
    trace are computed before the first update, so later updates are off-policy by the
    earlier ones and the clipping acts, as in the release; those `early` already holds
    (computed during scoring) are gathered from it."""
    total = int(all_reduce_sum(torch.tensor(float(len(kept)), device=env.device), env))
    stats = {"updates": 0, "loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "grad_norm": 0.0}
    if total == 0:
        return stats
    updates = math.ceil(total / settings["traces_per_update"])
    plan, old, ref = [], [], []  # old (and reference) log-probabilities: all before the first update
    for u in range(updates):
        chunk = [(r, a, 1.0) for r, a in kept[u::updates]]
        micro = _micro_batches(chunk, settings, scorer.block)
        count = [float(len(micro)), float(len(chunk))]
        if env.distributed:  # (one process: no device round trip, which would wait for the GPU)
            count = torch.tensor(count, device=env.device)
            torch.distributed.all_reduce(count[:1], op=torch.distributed.ReduceOp.MAX)
            torch.distributed.all_reduce(count[1:], op=torch.distributed.ReduceOp.SUM)
        micro += [[[(fallback, 0.0, 0.0)]]] * (int(count[0]) - len(micro))
        # each micro-batch's layout and mask are built while the GPU scores the previous one
        prepared, o, rf = [], [], []
        for m in micro:
            prepared.append(scorer.prepare([_traces_of([r for r, _, _ in row]) for row in m]))
            got = None if early is None else early.gather(_items(m), prepared[-1].batch)
            if got is None:
                old_m = _logprobs(scorer, prepared[-1])
                got = old_m, (old_m if ref_scorer is None else _logprobs(ref_scorer, prepared[-1]))
            o.append(got[0])
            rf.append(got[1])
        plan.append((micro, prepared, float(count[1]) * settings["max_new_tokens"] / env.world_size))
        old.append(o)
        ref.append(rf)
    sums = torch.zeros(4, dtype=torch.float64, device=env.device)  # policy, kl, clipped, tokens
    for (micro, prepared, normaliser), o, rf in zip(plan, old, ref):
        stats["grad_norm"] = _update(scorer, optimizer, micro, prepared, o, rf, settings, env, normaliser, sums)
        stats["updates"] += 1
    sums = all_reduce_sum(sums, env)
    tokens = max(float(sums[3]), 1.0)
    stats.update(loss=float(sums[0] + settings["kl_beta"] * sums[1]) / (total * settings["max_new_tokens"]),
                 kl=float(sums[1]) / tokens, clip_fraction=float(sums[2]) / tokens)
    return stats


@torch.no_grad()
def _logprobs(scorer: TraceScorer, prepared: Prepared) -> torch.Tensor:
    return scorer.score(prepared).detach()


def _update(scorer, optimizer, micro, prepared, old, ref, settings, env, normaliser, sums) -> float:
    optimizer.zero_grad(set_to_none=True)
    policy = scorer.policy
    for i, (m, p, o, rf) in enumerate(zip(micro, prepared, old, ref)):
        if hasattr(policy, "set_requires_gradient_sync"):  # FSDP: reduce once per update
            policy.set_requires_gradient_sync(i == len(micro) - 1)
        items = _items(m)
        logp = scorer.score(p)
        adv = torch.tensor([a for _, a, _ in items], dtype=torch.float32).to(env.device, non_blocking=True)
        adv = adv[p.batch.target_trace]
        terms = trace_policy_loss(logp, o, rf, adv, clip_eps=settings["clip_eps"],
                                  kl_beta=settings["kl_beta"], normaliser=normaliser)
        weight = max(w for _, _, w in items)
        (terms.loss * weight).backward()
        sums += weight * torch.stack([terms.policy_sum.double(), terms.kl_sum.double(),
                                      terms.clipped.double(), torch.tensor(float(terms.tokens),
                                                                           dtype=torch.float64, device=sums.device)])
    grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), settings["max_grad_norm"])
    if hasattr(grad_norm, "full_tensor"):
        grad_norm = grad_norm.full_tensor()
    optimizer.step()
    return float(grad_norm)


def update_flops(rollouts, settings: dict, block_settings, config) -> dict:
    """Exact FLOPs of `train_on_rollouts` over these rollouts (model/flops.py, as SFT's are
    counted; padding excluded, so the figure does not depend on packing): `old` (the
    pre-update log-probabilities, forward only), `ref` (a frozen reference's forward;
    0 with `kl_reference: pre_update`, which reuses `old`), `update` (forward + backward,
    3x the forward) and `recompute` (what is computed twice and not counted in `total`:
    the layers' forward again under activation checkpointing, and the output layer's
    logits, which token_logprobs recomputes in its backward). `total` = old + ref + update
    (model FLOPs, for MFU); `total_with_recompute` adds the recompute."""
    fwd = traces_forward_flops(_traces_of(rollouts), block_settings.block_size, config)
    old = fwd["total"]
    ref = fwd["total"] if settings["kl_reference"] == "frozen" else 0
    update = 3 * fwd["total"]
    layers_fwd = fwd["linear"] + fwd["attention"]
    recompute = fwd["head"] + (layers_fwd if settings["activation_checkpointing"] else 0)
    return {"forward": fwd, "old": old, "ref": ref, "update": update, "recompute": recompute,
            "total": old + ref + update, "total_with_recompute": old + ref + update + recompute}
