"""Policy updates of the RL stages: the trainable TracePolicy, log-probabilities of traces
in micro-batches, and one pass of PPO-clipped, KL-regularised updates over a step's kept
traces (several optimiser updates per step, as the release's gradient accumulation over its
rollouts; the optimiser's state carries across steps unless the stage resets it)."""

from __future__ import annotations

import contextlib
import math

import torch

from ..model.trace import Trace, TracePolicy, build_trace_batch
from .parallel import DistEnv, all_reduce_sum, parallelize
from .rl_loss import trace_policy_loss


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
    parallelize(policy, env, compile_layers=bool(settings["compile"]) and on_gpu,
                activation_checkpointing=trainable and bool(settings["activation_checkpointing"]), bf16=bf16)
    return policy, bf16


def _micro_batches(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


class TraceScorer:
    """Log-probabilities of micro-batches of traces under one policy module."""

    def __init__(self, policy, settings: dict, block_settings, env: DistEnv, bf16: bool):
        self.policy, self.env, self.bf16 = policy, env, bf16
        self.block, self.mask_id, self.pad_id = (block_settings.block_size, block_settings.mask_token_id,
                                                 block_settings.pad_token_id)
        choice = settings["attention"]
        self.use_flex = choice == "flex" or (choice == "auto" and env.device.type == "cuda")
        self.row_multiple = 128 if env.device.type == "cuda" else 1

    def __call__(self, traces: list[Trace]):
        batch = build_trace_batch([[t] for t in traces], self.block, self.mask_id, self.pad_id,
                                  self.row_multiple).to(self.env.device)
        mask = self.policy.trace_mask(batch, self.use_flex)
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if self.bf16 else contextlib.nullcontext()
        with autocast:
            return self.policy(batch, mask), batch


def _traces_of(rollouts) -> list[Trace]:
    return [Trace(tuple(r.prompt_ids), tuple(r.token_ids), tuple(r.steps)) for r in rollouts]


def train_on_rollouts(scorer: TraceScorer, ref_scorer: TraceScorer | None, optimizer,
                      kept: list[tuple], fallback, settings: dict, env: DistEnv) -> dict:
    """One pass over this rank's kept (rollout, advantage) pairs in `updates` optimiser
    updates, the same count on every rank (a rank short of traces runs zero-weight
    micro-batches of `fallback`). Old (and frozen-reference) log-probabilities of every
    trace are computed before the first update, so later updates are off-policy by the
    earlier ones and the clipping acts, as in the release."""
    total = int(all_reduce_sum(torch.tensor(float(len(kept)), device=env.device), env))
    stats = {"updates": 0, "loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "grad_norm": 0.0}
    if total == 0:
        return stats
    updates = math.ceil(total / settings["traces_per_update"])
    plan = []
    for u in range(updates):
        chunk = [(r, a, 1.0) for r, a in kept[u::updates]]
        micro = _micro_batches(chunk, settings["micro_batch_traces"])
        count = torch.tensor([float(len(micro)), float(len(chunk))], device=env.device)
        if env.distributed:
            torch.distributed.all_reduce(count[:1], op=torch.distributed.ReduceOp.MAX)
            torch.distributed.all_reduce(count[1:], op=torch.distributed.ReduceOp.SUM)
        micro += [[(fallback, 0.0, 0.0)]] * (int(count[0]) - len(micro))
        plan.append((micro, float(count[1]) * settings["max_new_tokens"] / env.world_size))
    old = [[_logprobs(scorer, m) for m in micro] for micro, _ in plan]
    ref = old if ref_scorer is None else [[_logprobs(ref_scorer, m) for m in micro] for micro, _ in plan]
    sums = torch.zeros(4, dtype=torch.float64, device=env.device)  # policy, kl, clipped, tokens
    for (micro, normaliser), o, rf in zip(plan, old, ref):
        stats["grad_norm"] = _update(scorer, optimizer, micro, o, rf, settings, env, normaliser, sums)
        stats["updates"] += 1
    sums = all_reduce_sum(sums, env)
    tokens = max(float(sums[3]), 1.0)
    stats.update(loss=float(sums[0] + settings["kl_beta"] * sums[1]) / (total * settings["max_new_tokens"]),
                 kl=float(sums[1]) / tokens, clip_fraction=float(sums[2]) / tokens)
    return stats


@torch.no_grad()
def _logprobs(scorer: TraceScorer, micro) -> torch.Tensor:
    logp, _ = scorer(_traces_of([r for r, _, _ in micro]))
    return logp.detach()


def _update(scorer, optimizer, micro, old, ref, settings, env, normaliser, sums) -> float:
    optimizer.zero_grad(set_to_none=True)
    policy = scorer.policy
    for i, (m, o, rf) in enumerate(zip(micro, old, ref)):
        if hasattr(policy, "set_requires_gradient_sync"):  # FSDP: reduce once per update
            policy.set_requires_gradient_sync(i == len(micro) - 1)
        logp, batch = scorer(_traces_of([r for r, _, _ in m]))
        adv = torch.tensor([a for _, a, _ in m], dtype=torch.float32, device=env.device)[batch.target_trace]
        terms = trace_policy_loss(logp, o, rf, adv, clip_eps=settings["clip_eps"],
                                  kl_beta=settings["kl_beta"], normaliser=normaliser)
        weight = max(w for _, _, w in m)
        (terms.loss * weight).backward()
        sums += weight * torch.tensor([float(terms.policy_sum), float(terms.kl_sum), float(terms.clipped),
                                       float(terms.tokens)], dtype=torch.float64, device=sums.device)
    grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), settings["max_grad_norm"])
    if hasattr(grad_norm, "full_tensor"):
        grad_norm = grad_norm.full_tensor()
    optimizer.step()
    return float(grad_norm)
