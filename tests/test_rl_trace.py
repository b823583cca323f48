"""The trajectory log-probability (CPU, fp32): one forward of the trace layout gives, for
every committed token, the probability the decoder saw when it committed it; the decoder's
generations carry exactly the tokens those log-probabilities cover."""

from __future__ import annotations

import copy

import pytest
import torch
from dicepipe.model.decode import Decoder, DecodeSettings
from dicepipe.model.masks import block_causal_mask
from dicepipe.model.settings import BlockSettings
from dicepipe.model.shapes import qwen3_config, random_qwen3
from dicepipe.model.trace import (Trace, TracePolicy, build_trace_batch, dense_trace_mask,
                                  noisy_blocks, token_logprobs, trace_allowed)

VOCAB, MASK_ID, PAD_ID, STOP_ID = 97, 96, 0, 1
SHAPE = {"hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16}
BLOCK = 4


@pytest.fixture(scope="module")
def lm():
    return random_qwen3(qwen3_config(SHAPE, vocab_size=VOCAB, initializer_range=0.2), seed=3).eval()


def _settings() -> BlockSettings:
    return BlockSettings(block_size=BLOCK, mask_token_id=MASK_ID, pad_token_id=PAD_ID,
                         stop_token_ids=(STOP_ID,))


def _prompts(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(2, MASK_ID, (n,), generator=gen).tolist() for n in lengths]


def _direct_logprobs(lm, trace: Trace) -> dict[int, float]:
    """Decode step by step without a cache: for each committed token, the canvas as it was
    just before its step (earlier blocks clean, its block with the tokens of that step and
    later masked) through the plain model under the inference mask; read its probability."""
    prompt, tokens, steps = list(trace.prompt_ids), list(trace.token_ids), list(trace.steps)
    out = {}
    for block, step in noisy_blocks(trace, BLOCK):
        end = (block + 1) * BLOCK
        canvas = (prompt + tokens)[:end]
        for i in range(max(block * BLOCK, len(prompt)), end):
            if steps[i - len(prompt)] >= step:
                canvas[i] = MASK_ID
        mask = block_causal_mask(torch.zeros(1, dtype=torch.long), 0, end, end, BLOCK)
        with torch.no_grad():
            logits = lm(input_ids=torch.tensor([canvas]), attention_mask=mask,
                        position_ids=torch.arange(end)[None]).logits[0]
        logp = torch.log_softmax(logits.double(), dim=-1)
        for i in range(max(block * BLOCK, len(prompt)), end):
            if steps[i - len(prompt)] == step:
                out[i - len(prompt)] = float(logp[i, tokens[i - len(prompt)]])
    return out


@pytest.mark.parametrize("strategy", ["dynamic", "static"])
def test_trace_logprobs_match_step_by_step_decoding(lm, strategy):
    prompts = _prompts([5, 9, 12, 3])
    cfg = DecodeSettings(max_new_tokens=14, strategy=strategy, threshold=0.05, seed=7)
    result = Decoder(lm, _settings(), cuda_graphs=False).generate(prompts, cfg)
    traces = [Trace(tuple(p), tuple(g.trace_ids), tuple(g.trace_steps))
              for p, g in zip(prompts, result.generations)]
    assert any(len(set(t.steps[:4])) < 4 for t in traces) or strategy == "static"
    policy = TracePolicy(copy.deepcopy(lm), BLOCK)
    # two traces packed in one row, two in another: packing must not leak between samples
    batch = build_trace_batch([traces[:2], traces[2:]], BLOCK, MASK_ID, PAD_ID)
    with torch.no_grad():
        logp = policy(batch, dense_trace_mask(batch))
    assert len(logp) == sum(len(t.token_ids) for t in traces)  # every committed token, once
    for t, trace in enumerate(traces):
        direct = _direct_logprobs(lm, trace)
        mine = {int(k): float(v) for k, v, tr in zip(batch.target_order, logp, batch.target_trace) if tr == t}
        assert mine.keys() == direct.keys() == set(range(len(trace.token_ids)))
        for k in direct:
            assert abs(mine[k] - direct[k]) < 1e-5, (t, k, mine[k], direct[k])


def test_generations_keep_the_whole_last_block(lm):
    prompts = _prompts([6, 7])
    cfg = DecodeSettings(max_new_tokens=9, strategy="static", seed=1)
    for gen, prompt in zip(Decoder(lm, _settings()).generate(prompts, cfg).generations, prompts):
        assert len(gen.token_ids) <= 9
        assert (len(prompt) + len(gen.trace_ids)) % BLOCK == 0  # through the end of its block
        assert gen.trace_ids[: len(gen.token_ids)] == gen.token_ids
        assert len(gen.trace_steps) == len(gen.trace_ids) and min(gen.trace_steps) >= 0
    # a stop token mid-block: the text ends there, the rest of the block stays in the trace
    stop_lm = copy.deepcopy(lm)
    with torch.no_grad():
        stop_lm.lm_head.bias = None
        stop_lm.lm_head.weight.zero_()
        stop_lm.lm_head.weight[STOP_ID] = 1.0
        stop_lm.lm_head.weight[5] = 0.5
    gens = Decoder(stop_lm, _settings()).generate(_prompts([6]), DecodeSettings(
        max_new_tokens=20, strategy="sequential", temperature=0)).generations
    assert gens[0].stopped and gens[0].token_ids[-1] == STOP_ID
    assert (6 + len(gens[0].trace_ids)) % BLOCK == 0


def test_trace_mask_rule_by_hand():
    # prompt 2 tokens, 6 committed (blocks 0 and 1); block 0 committed in steps 0 and 1
    trace = Trace((10, 11), (20, 21, 22, 23, 24, 25), (1, 0, 2, 2, 3, 2))
    assert noisy_blocks(trace, BLOCK) == [(0, 0), (0, 1), (1, 2), (1, 3)]
    batch = build_trace_batch([[trace]], BLOCK, MASK_ID, PAD_ID)
    assert batch.input_ids[0, :8].tolist() == [10, 11, 20, 21, 22, 23, 24, 25]
    assert batch.input_ids[0, 8:12].tolist() == [10, 11, MASK_ID, MASK_ID]  # step 0: both later
    assert batch.input_ids[0, 12:16].tolist() == [10, 11, MASK_ID, 21]  # step 1: token 21 done
    assert batch.input_ids[0, 16:20].tolist() == [MASK_ID] * 4
    assert batch.input_ids[0, 20:24].tolist() == [22, 23, MASK_ID, 25]
    assert batch.position_ids[0, 8:24].tolist() == [0, 1, 2, 3] * 2 + [4, 5, 6, 7] * 2
    mask = dense_trace_mask(batch)[0, 0]
    assert mask[0, :4].all() and not mask[0, 4:].any()  # clean block 0: itself only
    assert mask[4, :8].all() and not mask[4, 8:].any()  # clean block 1: blocks 0, 1
    assert not mask[8, :8].any() and mask[8, 8:12].all() and not mask[8, 12:].any()
    assert mask[16, :4].all() and not mask[16, 4:16].any() and mask[16, 16:20].all()
    assert not mask[16, 20:].any()  # noisy copies of one block at different steps: apart
    assert batch.target_order.tolist() == [1, 0, 2, 3, 5, 4]
    assert trace_allowed(torch.tensor(0), torch.tensor(1), torch.tensor(0), torch.tensor(0),
                         torch.tensor(1), torch.tensor(0)).item() is False


def test_token_logprobs_gradient_matches_autograd():
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = torch.randn(11, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    targets = torch.randint(0, 11, (7,), generator=gen)
    coeff = torch.randn(7, dtype=torch.float64, generator=gen)
    mine = token_logprobs(hidden, weight, targets, temperature=0.7, chunk_rows=3)
    (mine.double() * coeff).sum().backward()
    g_h, g_w = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    ref = torch.log_softmax(hidden @ weight.T / 0.7, dim=-1).gather(1, targets[:, None]).squeeze(1)
    assert torch.allclose(mine.double(), ref, atol=1e-6)
    (ref * coeff).sum().backward()
    assert torch.allclose(g_h, hidden.grad, atol=1e-6) and torch.allclose(g_w, weight.grad, atol=1e-6)
