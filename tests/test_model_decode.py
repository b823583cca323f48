"""Decoding against full forwards (CPU, fp32): the KV-cached block loop, the training layout
and the autoregressive path must see exactly what a full forward under the right mask sees."""

from __future__ import annotations

import copy

import pytest
import torch
from dicepipe.model.decode import Decoder, DecodeSettings
from dicepipe.model.layout import build_rows, make_train_batch
from dicepipe.model.masks import block_causal_mask
from dicepipe.model.objective import BlockDiffusionLM
from dicepipe.model.settings import BlockSettings
from dicepipe.model.shapes import qwen3_config, random_qwen3
from dicepipe.model.tokenizer import IGNORE_INDEX, SFTExample

VOCAB = 97
MASK_ID = 96
PAD_ID = 0
STOP_ID = 1
SHAPE = {"hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16}


@pytest.fixture(scope="module")
def lm():
    # Larger init than the default so that logits differ clearly between contexts.
    model = random_qwen3(qwen3_config(SHAPE, vocab_size=VOCAB, initializer_range=0.2), seed=1)
    return model.eval()


def _settings(block_size=4, causal=False) -> BlockSettings:
    return BlockSettings(block_size=block_size, mask_token_id=None if causal else MASK_ID,
                         pad_token_id=PAD_ID, stop_token_ids=(STOP_ID,), causal=causal)


def _full_logits(lm, ids: list[int], block_size: int) -> torch.Tensor:
    """Reference: transformers' own forward (SDPA) of the whole sequence, block-causal mask."""
    tokens = torch.tensor([ids])
    mask = block_causal_mask(torch.zeros(1, dtype=torch.long), 0, len(ids), len(ids), block_size)
    with torch.no_grad():
        out = lm(input_ids=tokens, attention_mask=mask, position_ids=torch.arange(len(ids))[None])
    return out.logits[0]


def _prompts(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(2, MASK_ID, (n,), generator=gen).tolist() for n in lengths]


@pytest.mark.parametrize("fuse_commit", [True, False])
def test_cached_block_decoding_matches_full_forward(lm, fuse_commit):
    settings = _settings()
    prompts = _prompts([9, 6, 12])  # different prompt tails and left padding
    cfg = DecodeSettings(max_new_tokens=11, temperature=0, stop_at_end=False, fuse_commit=fuse_commit)
    result = Decoder(lm, settings).generate(prompts, cfg, record_commit_logits=True)
    assert len(result.commit_logits) == 4  # ceil((max tail 2 + 11) / 4) blocks
    compared = 0
    for row_ids, block, logits in result.commit_logits:
        for i, row in enumerate(row_ids.tolist()):
            prompt, gen = prompts[row], result.generations[row]
            full_ids = prompt + gen.token_ids
            ref = _full_logits(lm, full_ids, 4)
            start = (len(prompt) // 4 + block) * 4
            if start + 4 > len(full_ids):
                continue  # the canvas past max_new_tokens is cut off (bidirectional block)
            compared += 1
            torch.testing.assert_close(logits[i], ref[start : start + 4], atol=2e-4, rtol=2e-4)
    assert compared >= 7


def test_decoding_records_every_token_and_step(lm):
    prompts = _prompts([5, 8])
    cfg = DecodeSettings(max_new_tokens=10, temperature=0, stop_at_end=False)
    result = Decoder(lm, _settings()).generate(prompts, cfg)
    for prompt, gen in zip(prompts, result.generations):
        assert len(gen.token_ids) == 10 and len(gen.unmask_steps) == 10
        assert MASK_ID not in gen.token_ids
        # each block of 4 takes 4 static steps, committing one token per step
        first = 4 - len(prompt) % 4
        later = gen.unmask_steps[first:first + 4]
        assert sorted(later) == list(range(4, 8))
    # warming up (dummy forwards over every shape) leaves no trace in the next generation
    warmed = Decoder(lm, _settings())
    warmed.warm_up(prompts, cfg)
    assert [g.token_ids for g in warmed.generate(prompts, cfg).generations] == [
        g.token_ids for g in result.generations]
    # the matmul attention path for short forwards gives the same tokens
    matmul = Decoder(lm, _settings(), attention="matmul").generate(prompts, cfg)
    assert [g.token_ids for g in matmul.generations] == [g.token_ids for g in result.generations]
    # same seed, same result; fused and unfused commits agree
    again = Decoder(lm, _settings()).generate(prompts, DecodeSettings(
        max_new_tokens=10, temperature=0, stop_at_end=False, fuse_commit=False))
    assert [g.token_ids for g in again.generations] == [g.token_ids for g in result.generations]


@pytest.mark.parametrize("lengths", [[5, 8, 11], [6, 10]])  # mixed tails; equal tails (2)
@pytest.mark.parametrize("strategy", ["static", "sequential"])
def test_fused_projections_and_masked_logits_keep_the_tokens(lm, lengths, strategy):
    """Output layer at the still-masked positions only and fused q|k|v, gate|up weights:
    the same tokens and steps as full logits through the stock layers."""
    prompts = _prompts(lengths, seed=11)
    cfg = DecodeSettings(max_new_tokens=13, temperature=0, strategy=strategy, stop_at_end=False)
    plain = Decoder(lm, _settings(), fuse_projections=False, masked_logits=False).generate(prompts, cfg)
    fast_decoder = Decoder(lm, _settings())
    fast = fast_decoder.generate(prompts, cfg)
    assert fast_decoder.engine.fused is not None
    assert [g.token_ids for g in fast.generations] == [g.token_ids for g in plain.generations]
    assert [g.unmask_steps for g in fast.generations] == [g.unmask_steps for g in plain.generations]
    assert fast_decoder._selected_counts(4, cfg) == [4, 3, 2, 1]


def test_half_batch_phases_match_one_pass(lm):
    """The two-half schedule (streams on CUDA; here the same phases in turn) changes only
    the order of work: the same tokens, steps and commit logits as one pass."""
    prompts = _prompts([5, 8, 11, 3, 9], seed=5)
    cfg = DecodeSettings(max_new_tokens=13, temperature=0, stop_at_end=False)
    one = Decoder(lm, _settings(), overlap_min_tokens=None).generate(prompts, cfg, record_commit_logits=True)
    two = Decoder(lm, _settings(), overlap_min_tokens=0).generate(prompts, cfg, record_commit_logits=True)
    assert [g.token_ids for g in two.generations] == [g.token_ids for g in one.generations]
    assert [g.unmask_steps for g in two.generations] == [g.unmask_steps for g in one.generations]
    assert len(two.commit_logits) == len(one.commit_logits) == 4
    for (rows_a, _, a), (rows_b, _, b) in zip(one.commit_logits, two.commit_logits):
        assert rows_a.tolist() == rows_b.tolist()
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


def test_engine_logits_at_selected_positions_equal_full_logits(lm):
    engine = Decoder(lm, _settings())._engine(2, 16)
    engine.begin(torch.tensor([0, 4]))
    engine.prefill(torch.tensor(_prompts([8, 8], seed=2)))
    block = torch.tensor(_prompts([4, 4], seed=4))
    full = engine.forward(block, 8, 4)
    select = torch.tensor([[0, 3], [1, 2]])
    part = engine.forward(block, 8, 4, select)
    torch.testing.assert_close(part, torch.gather(full, 1, select[:, :, None].expand(-1, -1, full.shape[-1])))


def test_training_layout_matches_inference_for_a_partly_masked_block(lm):
    block_size = 4
    ids = _prompts([16], seed=3)[0]
    labels = [IGNORE_INDEX] * 5 + ids[5:]
    rows = build_rows([[SFTExample(tuple(ids), tuple(labels))]], 16, PAD_ID)
    batch = make_train_batch(rows, MASK_ID, 1e-3, torch.Generator().manual_seed(0))
    # Fix the noise by hand: block 2 (positions 8..11) partly masked, later block fully.
    masked = torch.zeros(1, 16, dtype=torch.bool)
    masked[0, [9, 11, 12, 13, 14, 15]] = True
    noisy = torch.where(masked, torch.full_like(rows.input_ids, MASK_ID), rows.input_ids)
    batch.input_ids = torch.cat([noisy, rows.input_ids], dim=1)
    batch.masked = masked
    objective = BlockDiffusionLM(copy.deepcopy(lm), block_size)
    mask = objective.attention_mask(batch.doc_ids, use_flex=False)
    with torch.no_grad():
        train_logits = objective.noisy_logits(batch, mask)[0]

    decoder = Decoder(lm, _settings(block_size))
    engine = decoder._engine(1, 16)
    engine.begin(torch.zeros(1, dtype=torch.long))
    engine.prefill(rows.input_ids[:, :8])
    infer = engine.forward(noisy[:, 8:12], 8, 4)[0]
    torch.testing.assert_close(train_logits[8:12], infer, atol=2e-4, rtol=2e-4)
    infer_next = engine.forward(torch.cat([rows.input_ids[:, 8:12], noisy[:, 12:16]], 1), 8, 4)[0]
    torch.testing.assert_close(train_logits[12:16], infer_next, atol=2e-4, rtol=2e-4)


def test_autoregressive_path_matches_causal_forward(lm):
    settings = _settings(block_size=1, causal=True)
    prompts = _prompts([7, 3, 5], seed=5)
    cfg = DecodeSettings(max_new_tokens=6, temperature=0, stop_at_end=False)
    result = Decoder(lm, settings).generate(prompts, cfg)
    for prompt, gen in zip(prompts, result.generations):
        ids = list(prompt)
        for _ in range(6):
            with torch.no_grad():
                logits = lm(input_ids=torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
        assert gen.token_ids == ids[len(prompt):]
        assert gen.unmask_steps == list(range(6))


def test_rows_stop_at_the_stop_token_and_leave_the_batch(lm):
    settings = BlockSettings(block_size=4, mask_token_id=MASK_ID, pad_token_id=PAD_ID,
                             stop_token_ids=tuple(range(2, 60)))  # most tokens stop
    prompts = _prompts([6, 9, 4], seed=7)
    cfg = DecodeSettings(max_new_tokens=40, temperature=0)
    result = Decoder(lm, settings).generate(prompts, cfg)
    for gen in result.generations:
        if gen.stopped:
            assert gen.token_ids[-1] in settings.stop_token_ids
            assert not set(gen.token_ids[:-1]) & set(settings.stop_token_ids)
    assert any(g.stopped for g in result.generations)
    # a row that stopped early did not keep the batch going for 10 blocks
    assert result.forwards < 1 + 10 * 4


def test_float8_kv_cache_needs_the_triton_path(lm):
    """On the CPU (SDPA, stock writes) a float8 cache is refused at once, not mis-written."""
    with pytest.raises(ValueError, match="float8"):
        Decoder(lm, _settings(), kv_cache_dtype=torch.float8_e4m3fn)._engine(2, 16)


def test_fp8_linear_is_the_scaled_float8_product():
    """fp8_linear = (per-token float8 x) @ (per-channel float8 w)^T with fp32 accumulation,
    within float8's precision of the plain product."""
    from dicepipe.model.layer_parts import FP8_MAX, fp8_linear, quantize_rows

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 64, generator=gen)
    x[0, 0] = 0.0  # an all-zero row quantizes to zeros, not NaN
    w = torch.randn(32, 64, generator=gen) * 0.02
    w8, w_scale = quantize_rows(w)
    assert w8.dtype == torch.float8_e4m3fn and w_scale.shape == (32, 1)
    assert torch.allclose(w8.float().abs().amax(dim=1), torch.full((32,), FP8_MAX))
    got = fp8_linear(x, (w8, w_scale))
    x8, x_scale = quantize_rows(x.reshape(-1, 64))
    ref = ((x8.float() * x_scale) @ (w8.float() * w_scale).T).to(torch.bfloat16).float().reshape(3, 5, 32)
    assert got.shape == (3, 5, 32) and got.dtype == x.dtype
    assert torch.allclose(got, ref, rtol=1e-2, atol=1e-5)
    assert torch.equal(got[0, 0], torch.zeros(32))
    exact = x @ w.T
    assert 0 < float((got - exact).norm() / exact.norm()) < 0.06


def test_float8_weights_stay_close_and_follow_weight_updates():
    """The float8 engine's logits stay within float8 precision of the model dtype's, and a
    weight change between batches reaches the float8 copies (quantized again, in place)."""
    from dicepipe.model.kv_engine import KVCacheEngine
    from dicepipe.model.layer_parts import quantize_rows

    model = random_qwen3(qwen3_config(SHAPE, vocab_size=VOCAB), seed=1).eval()
    tokens = torch.randint(2, MASK_ID, (2, 12), generator=torch.Generator().manual_seed(3))
    pad = torch.zeros(2, dtype=torch.long)

    def logits(engine):
        engine.begin(pad)
        return engine.prefill(tokens, logits_last=12)

    ref_engine = KVCacheEngine(model, 4, 2, 32)
    fp8 = KVCacheEngine(model, 4, 2, 32, weight_dtype=torch.float8_e4m3fn)
    ref, got = logits(ref_engine), logits(fp8)
    assert 0 < float((got - ref).norm() / ref.norm()) < 0.1
    storage = fp8.fused.down[0][0].data_ptr()
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(-1.0)
    ref, got = logits(ref_engine), logits(fp8)
    assert fp8.fused.down[0][0].data_ptr() == storage  # captured graphs keep reading it
    new = quantize_rows(model.model.layers[0].mlp.down_proj.weight)
    assert torch.equal(fp8.fused.down[0][0].float(), new[0].float()) and torch.equal(fp8.fused.down[0][1], new[1])
    assert float((got - ref).norm() / ref.norm()) < 0.1
    with pytest.raises(ValueError, match="fused projections"):
        KVCacheEngine(model, 4, 2, 32, fuse_projections=False, weight_dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="weight_dtype"):
        KVCacheEngine(model, 4, 2, 32, weight_dtype=torch.float16)
