"""Packed micro-batches of the RL update (CPU, fp32, a tiny random Qwen3): several traces in
one row score exactly as they do alone; a step's loss and gradients do not depend on the
packing; rows take few distinct lengths; and the exact FLOP count of a trace batch (padding
excluded) is the mask's own allowed pairs."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from dicepipe.model.flops import forward_flops, sft_step_flops
from dicepipe.model.settings import BlockSettings
from dicepipe.model.shapes import SHAPES, qwen3_config, random_qwen3
from dicepipe.model.trace import (Trace, TracePolicy, bucket_length, build_trace_batch, dense_trace_mask,
                                  pack_rows, trace_allowed_pairs, trace_batch_counts, trace_batch_flops,
                                  trace_length, traces_forward_flops)
from dicepipe.train.parallel import init_distributed
from dicepipe.train.rl_update import TraceScorer, train_on_rollouts, update_flops

VOCAB, MASK_ID, PAD_ID = 97, 96, 0  # as tests/test_rl_trace.py
SHAPE = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 8}
BLOCK = 4


def make_trace(gen: torch.Generator, prompt_len: int, blocks: int, max_steps: int = 4) -> Trace:
    """A trace as the Decoder writes them: the response through the end of its last block,
    each block committed over 1..max_steps steps (every step commits at least one token),
    steps counted globally."""
    prompt = torch.randint(2, MASK_ID, (prompt_len,), generator=gen).tolist()
    end = (prompt_len // BLOCK + blocks) * BLOCK
    tokens = torch.randint(2, MASK_ID, (end - prompt_len,), generator=gen).tolist()
    steps, base = [], 0
    for b in range(prompt_len // BLOCK, end // BLOCK):
        count = (b + 1) * BLOCK - max(b * BLOCK, prompt_len)
        k = int(torch.randint(1, min(max_steps, count) + 1, (1,), generator=gen))
        local = torch.randperm(count, generator=gen).tolist()
        order = [min(i, k - 1) if i < k else int(torch.randint(0, k, (1,), generator=gen)) for i in local]
        steps += [base + s for s in order]
        base += k
    return Trace(tuple(prompt), tuple(tokens), tuple(steps))


def _traces(n: int, seed: int = 0, prompt=(3, 11), blocks=(1, 6)) -> list[Trace]:
    gen = torch.Generator().manual_seed(seed)
    return [make_trace(gen, int(torch.randint(*prompt, (1,), generator=gen)),
                       int(torch.randint(*blocks, (1,), generator=gen))) for _ in range(n)]


@pytest.fixture(scope="module")
def lm():
    return random_qwen3(qwen3_config(SHAPE, vocab_size=VOCAB, initializer_range=0.2), seed=4).eval()


def _by_token(batch, logp) -> dict:
    return {(int(t), int(k)): float(v) for t, k, v in zip(batch.target_trace, batch.target_order, logp)}


def test_pack_rows_is_first_fit_decreasing():
    lengths = [7, 3, 12, 5, 5, 2, 9, 20]
    rows = pack_rows(lengths, 12)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert rows[0] == [7] and rows[1] == [2]  # over the budget: alone; then longest first
    assert all(sum(lengths[i] for i in row) <= 12 for row in rows if len(row) > 1)
    assert rows == [[7], [2], [6, 1], [0, 3], [4, 5]]  # 9+3, 7+5, 5+2
    assert pack_rows(lengths, 12) == rows  # deterministic


def test_a_packed_row_scores_its_traces_as_they_score_alone(lm):
    traces = _traces(7, seed=1)
    policy = TracePolicy(copy.deepcopy(lm), BLOCK)
    lengths = [trace_length(t, BLOCK) for t in traces]
    rows = pack_rows(lengths, 2 * max(lengths))
    assert any(len(r) >= 3 for r in rows)  # several traces share a row
    packed_rows = [[traces[i] for i in row] for row in rows]
    packed = build_trace_batch(packed_rows, BLOCK, MASK_ID, PAD_ID, length=2 * max(lengths) + 5)
    alone = build_trace_batch([[t] for t in traces], BLOCK, MASK_ID, PAD_ID)
    with torch.no_grad():
        got = _by_token(packed, policy(packed, dense_trace_mask(packed)))
        want = _by_token(alone, policy(alone, dense_trace_mask(alone)))
    order = [i for row in rows for i in row]  # packed trace j is traces[order[j]]
    got = {(order[t], k): v for (t, k), v in got.items()}
    assert got.keys() == want.keys() and len(got) == sum(len(t.token_ids) for t in traces)
    assert max(abs(got[key] - want[key]) for key in want) < 1e-5


def _rollouts(traces):
    return [SimpleNamespace(prompt_ids=list(t.prompt_ids), token_ids=list(t.token_ids), steps=list(t.steps))
            for t in traces]


class GradRecorder(torch.optim.SGD):
    """SGD that keeps a copy of every gradient it steps with."""

    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.seen = []

    def step(self, closure=None):
        self.seen.append([p.grad.detach().clone() for g in self.param_groups for p in g["params"]])
        return super().step(closure)


def _train(lm, traces, advantages, pack_tokens, traces_per_update, micro_batch_traces=1, bucket=False):
    env = init_distributed("cpu")
    settings = {"attention": "sdpa", "pack_tokens": pack_tokens, "micro_batch_traces": micro_batch_traces,
                "traces_per_update": traces_per_update, "max_new_tokens": 24, "clip_eps": 0.2, "kl_beta": 0.05,
                "max_grad_norm": 1e9}
    block = BlockSettings(block_size=BLOCK, mask_token_id=MASK_ID, pad_token_id=PAD_ID, stop_token_ids=(1,))
    policy = TracePolicy(copy.deepcopy(lm).train(), BLOCK)
    scorer = TraceScorer(policy, settings, block, env, bf16=False, bucket=bucket)
    shapes = []
    prepare = scorer.prepare
    scorer.prepare = lambda rows: shapes.append(tuple(r.__len__() for r in rows)) or prepare(rows)
    optimizer = GradRecorder(policy.parameters(), lr=0.05)
    kept = list(zip(_rollouts(traces), advantages))
    stats = train_on_rollouts(scorer, None, optimizer, kept, kept[0][0], settings, env)
    return stats, optimizer.seen, shapes, policy


@pytest.mark.parametrize("traces_per_update", [12, 5])
def test_a_steps_loss_and_gradients_do_not_depend_on_packing(lm, traces_per_update):
    traces = _traces(12, seed=2)
    advantages = [float(a) for a in torch.linspace(-1.5, 1.2, len(traces))]
    base, base_grads, base_shapes, base_policy = _train(lm, traces, advantages, 0, traces_per_update)
    budget = 3 * max(trace_length(t, BLOCK) for t in traces)
    packed, packed_grads, packed_shapes, packed_policy = _train(lm, traces, advantages, budget, traces_per_update)
    mixed, _, _, _ = _train(lm, traces, advantages, 0, traces_per_update, micro_batch_traces=3, bucket=True)
    assert all(s == (1,) for s in base_shapes)  # today's layout: one trace per row and micro-batch
    assert len(packed_shapes) < len(base_shapes) and max(n for (n,) in packed_shapes) >= 3
    assert base["updates"] == packed["updates"] == -(-12 // traces_per_update)
    for key in ("loss", "kl", "clip_fraction"):
        assert abs(base[key] - packed[key]) < 1e-6 and abs(base[key] - mixed[key]) < 1e-6, key
    assert base["loss"] != 0.0
    # later updates are off-policy by the earlier ones: the clipping acts alike
    for a, b in zip(base_grads, packed_grads, strict=True):
        for ga, gb in zip(a, b):
            assert torch.allclose(ga, gb, atol=1e-6, rtol=1e-4)
    for p, q in zip(base_policy.parameters(), packed_policy.parameters()):
        assert torch.allclose(p, q, atol=1e-6)


def test_rows_take_few_lengths(lm):
    """40 traces of 40 different layout lengths (32-2,212 tokens): one trace per row gives at
    most 6 row lengths (bucket_length, 2 per octave: 512 to 3,072), packing one (the budget)
    while every trace fits it."""
    gen = torch.Generator().manual_seed(3)
    traces = [make_trace(gen, 5 + i, 2 + 4 * i) for i in range(40)]
    lengths = sorted(trace_length(t, BLOCK) for t in traces)
    assert len(set(lengths)) == 40 and lengths[-1] > 2048
    block = BlockSettings(block_size=BLOCK, mask_token_id=MASK_ID, pad_token_id=PAD_ID, stop_token_ids=(1,))
    stub = SimpleNamespace(trace_mask=lambda batch, use_flex: None)
    env = init_distributed("cpu")
    for pack, most in ((0, 6), (4096, 1)):
        scorer = TraceScorer(stub, {"attention": "sdpa", "pack_tokens": pack}, block, env, bf16=False, bucket=True)
        if pack:
            rows = [[traces[i] for i in row] for row in pack_rows([trace_length(t, BLOCK) for t in traces], pack)]
        else:
            rows = [[t] for t in traces]
        shapes = {tuple(scorer.prepare([row]).batch.input_ids.shape) for row in rows}
        assert len(shapes) <= most, sorted(shapes)
    assert [bucket_length(n) for n in (1, 512, 513, 768, 769, 1025, 1537, 5000)] == [
        512, 512, 768, 768, 1024, 1536, 2048, 6144]
    assert all(bucket_length(n) < 1.5 * n + 1 for n in range(512, 20000, 37))  # at most a third padding


def test_trace_batch_flops_count_the_masks_allowed_pairs_without_padding():
    traces = _traces(6, seed=5)
    rows = [traces[:3], traces[3:5], traces[5:]]
    batch = build_trace_batch(rows, BLOCK, MASK_ID, PAD_ID, length=200)
    mask = dense_trace_mask(batch)[:, 0]
    # the real positions: those of docs holding a scored token (each row's padding is a doc of its own)
    real = torch.isin(batch.doc, batch.doc[batch.targets].unique())
    pairs = int((mask & real[:, :, None] & real[:, None, :]).sum())
    assert not (mask & real[:, :, None] & ~real[:, None, :]).any()  # padding is never attended
    counts = trace_batch_counts(batch)
    assert counts == {"tokens": sum(trace_length(t, BLOCK) for t in traces), "allowed_pairs": pairs,
                      "head_tokens": sum(len(t.token_ids) for t in traces)}
    assert pairs == sum(trace_allowed_pairs(t, BLOCK) for t in traces)
    config = qwen3_config(SHAPES["1.7b"])
    assert trace_batch_flops(batch, config) == traces_forward_flops(traces, BLOCK, config)
    # the convention of bench/model_train_mfu.py (its original step_flops, inline)
    h, i, layers, heads, kv, d, v = 2048, 6144, 28, 16, 8, 128, config.vocab_size
    fwd = forward_flops(config, 1000, 5000, 30)
    assert fwd["linear"] == 2 * (2 * h * heads * d + 2 * h * kv * d + 3 * h * i) * layers * 1000
    assert fwd["attention"] == 4 * d * heads * 5000 * layers and fwd["head"] == 2 * h * v * 30
    sft = sft_step_flops(config, SimpleNamespace(input_ids=torch.zeros(2, 500), targets=torch.zeros(30)), 5000)
    assert sft["total"] == 3 * fwd["total"]
    assert sft["head_noisy_half"] == 3 * 2 * h * v * 500


def test_update_flops_do_not_depend_on_packing():
    traces = _traces(5, seed=6)
    block = BlockSettings(block_size=BLOCK, mask_token_id=MASK_ID, pad_token_id=PAD_ID, stop_token_ids=(1,))
    config = qwen3_config(SHAPE, vocab_size=VOCAB)
    fwd = traces_forward_flops(traces, BLOCK, config)
    plain = update_flops(_rollouts(traces), {"kl_reference": "pre_update", "activation_checkpointing": False},
                         block, config)
    assert (plain["old"], plain["ref"], plain["update"]) == (fwd["total"], 0, 3 * fwd["total"])
    assert plain["total"] == 4 * fwd["total"] and plain["recompute"] == fwd["head"]
    frozen = update_flops(_rollouts(traces), {"kl_reference": "frozen", "activation_checkpointing": True},
                          block, config)
    assert frozen["total"] == 5 * fwd["total"] and frozen["recompute"] == fwd["total"]


@pytest.mark.parametrize("pack", [0, 1])
def test_log_probs_computed_early_give_the_same_step(lm, pack):
    """Old log-probabilities computed during scoring (EarlyLogprobs, in other micro-batches:
    here half the traces, in reverse order) give the step the same loss, gradients and weights
    as computing them inside train_on_rollouts; traces it does not hold are computed there."""
    from dicepipe.train.rl_update import EarlyLogprobs

    traces = _traces(10, seed=5)
    advantages = [float(a) for a in torch.linspace(-1.0, 1.3, len(traces))]
    budget = pack * 3 * max(trace_length(t, BLOCK) for t in traces)
    base, base_grads, _, base_policy = _train(lm, traces, advantages, budget, 4)

    env = init_distributed("cpu")
    settings = {"attention": "sdpa", "pack_tokens": budget, "micro_batch_traces": 1, "traces_per_update": 4,
                "max_new_tokens": 24, "clip_eps": 0.2, "kl_beta": 0.05, "max_grad_norm": 1e9}
    block = BlockSettings(block_size=BLOCK, mask_token_id=MASK_ID, pad_token_id=PAD_ID, stop_token_ids=(1,))
    policy = TracePolicy(copy.deepcopy(lm).train(), BLOCK)
    scorer = TraceScorer(policy, settings, block, env, bf16=False, bucket=False)
    rollouts = _rollouts(traces)
    early = EarlyLogprobs(scorer, None, settings)
    early.add(rollouts[::-2])  # half of them, another order and packing than the update's
    assert len(early.store) == 5
    calls = []
    score = scorer.score
    scorer.score = lambda p: calls.append(p) or score(p)
    optimizer = GradRecorder(policy.parameters(), lr=0.05)
    stats = train_on_rollouts(scorer, None, optimizer, list(zip(rollouts, advantages)), rollouts[0],
                              settings, env, early=early)
    assert stats["updates"] == base["updates"] == 3
    for key in ("loss", "kl", "clip_fraction"):
        assert abs(base[key] - stats[key]) < 1e-6, key
    for a, b in zip(base_grads, optimizer.seen, strict=True):
        for ga, gb in zip(a, b):
            assert torch.allclose(ga, gb, atol=1e-6, rtol=1e-4)
    for p, q in zip(base_policy.parameters(), policy.parameters()):
        assert torch.allclose(p, q, atol=1e-6)
    # every update's forward ran; of the old log-probs only those of micro-batches it lacked
    if not pack:
        assert len(calls) == 10 + 5
