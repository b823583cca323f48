"""GPU-only checks of the paths CPU tests cannot reach: CUDA-graph decoding, the FlexAttention
training forward/backward, and a short compiled bf16 SFT run."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from dicepipe.model.decode import Decoder, DecodeSettings
from dicepipe.model.layout import build_rows, make_train_batch
from dicepipe.model.objective import BlockDiffusionLM
from dicepipe.model.settings import BlockSettings
from dicepipe.model.shapes import qwen3_config, random_qwen3
from dicepipe.model.tokenizer import IGNORE_INDEX, SFTExample

pytestmark = pytest.mark.gpu

SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16}
SETTINGS = BlockSettings(block_size=4, mask_token_id=96, pad_token_id=0, stop_token_ids=(1,))


def _model(device="cuda"):
    return random_qwen3(qwen3_config(SHAPE, vocab_size=97, initializer_range=0.2), seed=1, device=device)


def _prompts(lengths):
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(2, 96, (n,), generator=gen).tolist() for n in lengths]


@pytest.mark.parametrize("strategy", ["static", "dynamic"])
def test_cuda_graph_decoding_matches_eager(strategy):
    lm = _model()
    prompts = _prompts([9, 30, 17, 4, 12])
    cfg = DecodeSettings(max_new_tokens=150, temperature=0, strategy=strategy, stop_at_end=False)
    eager = Decoder(lm, SETTINGS, cuda_graphs=False).generate(prompts, cfg)
    graphed_decoder = Decoder(lm, SETTINGS, cuda_graphs=True)
    graphed = graphed_decoder.generate(prompts, cfg)
    assert graphed_decoder.engine.graphs  # the graph path really ran
    assert [g.token_ids for g in graphed.generations] == [g.token_ids for g in eager.generations]
    assert [g.unmask_steps for g in graphed.generations] == [g.unmask_steps for g in eager.generations]
    # with stop tokens rows leave the batch (cache compaction under graphs)
    stopping = replace_stops(SETTINGS, range(2, 40))
    cfg_stop = DecodeSettings(max_new_tokens=150, temperature=0, strategy=strategy)
    a = Decoder(lm, stopping, cuda_graphs=False).generate(prompts, cfg_stop)
    b = Decoder(lm, stopping, cuda_graphs=True).generate(prompts, cfg_stop)
    assert [g.token_ids for g in a.generations] == [g.token_ids for g in b.generations]
    c = Decoder(lm, stopping, cuda_graphs=True, overlap_min_tokens=0).generate(prompts, cfg_stop)
    assert [g.token_ids for g in c.generations] == [g.token_ids for g in b.generations]


def replace_stops(settings: BlockSettings, stops) -> BlockSettings:
    return BlockSettings(settings.block_size, settings.mask_token_id, settings.pad_token_id, tuple(stops))


@pytest.mark.parametrize("overlap", [None, 0])
def test_compiled_graph_decoding_matches_eager(overlap):
    """Compiled decode parts (with the MLP + next norm/projection boundary), compiled
    prefill, and optionally the two-stream half batches inside the graphs."""
    lm = _model()
    prompts = _prompts([9, 30, 17])
    cfg = DecodeSettings(max_new_tokens=60, temperature=0, stop_at_end=False)
    eager = Decoder(lm, SETTINGS, cuda_graphs=False, overlap_min_tokens=None).generate(prompts, cfg)
    compiled = Decoder(lm, SETTINGS, cuda_graphs=True, compile_layers=True, overlap_min_tokens=overlap)
    compiled.warm_up(prompts, cfg)
    out = compiled.generate(prompts, cfg)
    assert compiled.engine.compiled_prefill is not None and compiled.engine.fuse_boundary
    assert [g.token_ids for g in out.generations] == [g.token_ids for g in eager.generations]


def _reference_attention(query, keys, values, pad, start, block_size, scale):
    from dicepipe.model.masks import block_causal_mask

    group = query.shape[1] // keys.shape[1]
    end = start + query.shape[2]
    mask = block_causal_mask(pad, start, query.shape[2], end, block_size)
    keys, values = (t[:, :, :end].float().repeat_interleave(group, 1) for t in (keys, values))
    return F.scaled_dot_product_attention(query.float(), keys, values, attn_mask=mask, scale=scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,q_len,block_size", [((4, 2), 4, 4), ((8, 2), 8, 4), ((4, 1), 1, 1), ((2, 2), 8, 4)])
def test_decode_attention_kernel_matches_sdpa(dtype, heads, q_len, block_size):
    """Ragged rows (left padding), queries inside their block, split and unsplit keys."""
    from dicepipe.model import decode_kernels

    gen = torch.Generator(device="cuda").manual_seed(0)
    q_heads, kv_heads = heads
    rows, dim, length = 5, 128, 700
    pads = torch.tensor([0, 4, 28, 160, 12], device="cuda") // block_size * block_size
    for start in (block_size * 2, 164, 517 // block_size * block_size):
        query = torch.randn(rows, q_len, q_heads, dim, generator=gen, device="cuda").to(dtype).transpose(1, 2)
        keys = torch.randn(rows, kv_heads, length, dim, generator=gen, device="cuda").to(dtype)
        values = torch.randn(rows, kv_heads, length, dim, generator=gen, device="cuda").to(dtype)
        ref = _reference_attention(query, keys, values, pads, start, block_size, 0.088)
        for splits in (1, 3):
            config = {"block_n": 64, "splits": splits, "num_warps": 4, "num_stages": 3}
            out = decode_kernels.decode_attention(query, keys, values, pads, torch.tensor(start, device="cuda"),
                                                  block_size, 0.088, 768, config)
            tol = 1e-5 if dtype == torch.float32 else 2e-2
            torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)
    # the default launch parameters too (split for a small batch)
    out = decode_kernels.decode_attention(query, keys, values, pads, torch.tensor(start, device="cuda"),
                                          block_size, 0.088, 768)
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_pick_matches_softmax_max(dtype):
    from dicepipe.model import decode_kernels

    logits = (3 * torch.randn(37, 151936, device="cuda")).to(dtype)
    logits[3, 100] = logits[3, 90_000] = 40.0  # tie: the lower index wins
    tokens, confidence = decode_kernels.greedy_pick(logits)
    ref_conf, ref_tokens = torch.softmax(logits.float(), dim=-1).max(dim=-1)
    assert tokens.tolist() == ref_tokens.tolist() and int(tokens[3]) == 100
    torch.testing.assert_close(confidence, ref_conf, atol=1e-6, rtol=1e-5)


def test_qkv_epilogue_matches_the_stock_layer_in_bf16():
    from dicepipe.model import decode_kernels
    from dicepipe.model.kv_engine import KVCacheEngine
    from dicepipe.model.layer_parts import pre_attention, qkv_projection

    lm = random_qwen3(qwen3_config({**SHAPE, "head_dim": 32}, vocab_size=97), seed=2, device="cuda",
                      dtype=torch.bfloat16)
    engine = KVCacheEngine(lm, 4, 3, 64)
    engine.begin(torch.tensor([0, 4, 8]))
    layer, start = lm.model.layers[1], 12
    hidden = torch.randn(3, 8, SHAPE["hidden_size"], device="cuda", dtype=torch.bfloat16)
    cols = torch.arange(8, device="cuda") + start
    positions = (cols[None] - engine.pad[:3, None]).clamp(min=0)
    query, key, value = pre_attention(layer, hidden, engine.cos[positions][:, None],
                                      engine.sin[positions][:, None], 32, torch.bfloat16)
    qkv = qkv_projection(layer, engine.fused.qkv[1], None, hidden)
    attn = layer.self_attn
    got = decode_kernels.qkv_epilogue(qkv, engine.pad[:3], torch.tensor(start, device="cuda"), engine.cos,
                                      engine.sin, attn.q_norm, attn.k_norm, engine.keys[1][:3],
                                      engine.values[1][:3], 4, 2, 32)
    for a, b in ((got, query), (engine.keys[1][:3, :, start:start + 8], key),
                 (engine.values[1][:3, :, start:start + 8], value)):
        torch.testing.assert_close(a.float(), b.float(), atol=3e-2, rtol=2e-2)
    assert not engine.keys[1][:3, :, : start].any()  # nothing written outside the columns


def test_float8_kv_cache_kernels_match_their_bf16_inputs():
    """float8 caches: the epilogue stores the bf16 keys/values rounded to float8, and the
    attention kernel over them equals attention over their bf16 upcast."""
    from dicepipe.model import decode_kernels
    from dicepipe.model.kv_engine import KVCacheEngine
    from dicepipe.model.layer_parts import qkv_projection

    fp8 = torch.float8_e4m3fn
    lm = random_qwen3(qwen3_config({**SHAPE, "head_dim": 32}, vocab_size=97), seed=2, device="cuda",
                      dtype=torch.bfloat16)
    engines = [KVCacheEngine(lm, 4, 3, 64, kv_dtype=dtype) for dtype in (None, fp8)]
    hidden = torch.randn(3, 8, SHAPE["hidden_size"], device="cuda", dtype=torch.bfloat16)
    start = torch.tensor(12, device="cuda")
    queries = []
    for engine in engines:
        engine.begin(torch.tensor([0, 4, 8]))
        layer = lm.model.layers[1]
        qkv = qkv_projection(layer, engine.fused.qkv[1], None, hidden)
        queries.append(decode_kernels.qkv_epilogue(qkv, engine.pad[:3], start, engine.cos, engine.sin,
                                                   layer.self_attn.q_norm, layer.self_attn.k_norm,
                                                   engine.keys[1][:3], engine.values[1][:3], 4, 2, 32))
    bf16, low = engines
    assert low.keys[1].dtype == fp8 and queries[1].dtype == torch.bfloat16
    assert torch.equal(queries[0], queries[1])
    for a, b in ((low.keys[1], bf16.keys[1]), (low.values[1], bf16.values[1])):
        assert torch.equal(a[:3, :, 12:20].float(), b[:3, :, 12:20].to(fp8).float())
    gen = torch.Generator(device="cuda").manual_seed(0)
    keys = torch.randn(3, 2, 64, 32, generator=gen, device="cuda").to(fp8)
    values = torch.randn(3, 2, 64, 32, generator=gen, device="cuda").to(fp8)
    query = queries[0]
    pad = bf16.pad[:3]
    got = decode_kernels.decode_attention(query, keys, values, pad, start, 4, 0.2, 64)
    ref = decode_kernels.decode_attention(query, keys.to(torch.bfloat16), values.to(torch.bfloat16), pad, start,
                                          4, 0.2, 64)
    torch.testing.assert_close(got.float(), ref.float(), atol=1e-2, rtol=1e-2)


def test_float8_kv_cache_decoding_runs_with_graphs_and_stops():
    lm = random_qwen3(qwen3_config(SHAPE, vocab_size=97, initializer_range=0.2), seed=1, device="cuda",
                      dtype=torch.bfloat16)
    prompts = _prompts([9, 30, 17, 4, 12])
    stopping = replace_stops(SETTINGS, range(2, 40))
    for settings, stop in ((SETTINGS, False), (stopping, True)):
        cfg = DecodeSettings(max_new_tokens=60, temperature=0, stop_at_end=stop)
        decoder = Decoder(lm, settings, kv_cache_dtype=torch.float8_e4m3fn)
        out = decoder.generate(prompts, cfg)
        assert decoder.engine.keys[0].dtype == torch.float8_e4m3fn and decoder.engine.graphs
        assert all(0 < len(g.token_ids) <= 60 for g in out.generations)
        assert all(len(g.token_ids) == 60 for g in out.generations) or stop
        assert all(t < 97 for g in out.generations for t in g.token_ids)


def test_float8_weights_decode_under_graphs_follows_weight_updates():
    """float8 matmuls (torch._scaled_mm, rowwise scales) compiled and under CUDA graphs:
    logits within float8 precision of bf16, and after a weight change the engine, whose
    captured graphs read the float8 copies, decodes as a freshly built one does."""
    from dicepipe.model.kv_engine import KVCacheEngine

    fp8 = torch.float8_e4m3fn
    lm = random_qwen3(qwen3_config(SHAPE, vocab_size=97), seed=2, device="cuda", dtype=torch.bfloat16)
    tokens = torch.randint(2, 96, (3, 24), device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
    logits = []
    for weights in (None, fp8):
        engine = KVCacheEngine(lm, 4, 3, 64, weight_dtype=weights)
        engine.begin(torch.zeros(3, dtype=torch.long))
        logits.append(engine.prefill(tokens, logits_last=24).float())
    assert 0 < float((logits[1] - logits[0]).norm() / logits[0].norm()) < 0.1
    prompts = _prompts([9, 30, 17, 4, 12])
    cfg = DecodeSettings(max_new_tokens=40, temperature=0, stop_at_end=False)
    decoder = Decoder(lm, SETTINGS, compile_layers=True, weight_dtype=fp8)
    first = decoder.generate(prompts, cfg)
    assert decoder.engine.graphs and decoder.engine.fused.fp8
    with torch.no_grad():
        for layer in lm.model.layers:
            layer.mlp.down_proj.weight.mul_(-3.0)
    again = decoder.generate(prompts, cfg)
    fresh = Decoder(lm, SETTINGS, compile_layers=True, weight_dtype=fp8).generate(prompts, cfg)
    assert [g.token_ids for g in again.generations] == [g.token_ids for g in fresh.generations]
    assert [g.token_ids for g in again.generations] != [g.token_ids for g in first.generations]


def test_fast_decode_paths_match_the_plain_engine():
    """Triton attention, fused projections, logits at masked positions only, under CUDA
    graphs (fp32) against SDPA with the stock layers and full logits, eagerly."""
    lm = _model()
    prompts = _prompts([9, 30, 17, 4, 12, 16, 5])
    for strategy in ("static", "sequential"):
        cfg = DecodeSettings(max_new_tokens=90, temperature=0, strategy=strategy, stop_at_end=False)
        plain = Decoder(lm, SETTINGS, cuda_graphs=False, attention="sdpa", fuse_projections=False,
                        masked_logits=False).generate(prompts, cfg)
        for overlap in (None, 0):  # 0: two half-batches on two streams in every forward
            fast_decoder = Decoder(lm, SETTINGS, cuda_graphs=True, overlap_min_tokens=overlap)
            fast = fast_decoder.generate(prompts, cfg)
            assert fast_decoder.engine.attention == "triton" and fast_decoder.engine.epilogue
            assert any(key[-1] for key in fast_decoder.engine.graphs)  # selected-logits graphs ran
            assert [g.token_ids for g in fast.generations] == [g.token_ids for g in plain.generations]
            assert [g.unmask_steps for g in fast.generations] == [g.unmask_steps for g in plain.generations]


def test_sampled_decoding_is_reproducible_with_graphs():
    lm = _model()
    cfg = DecodeSettings(max_new_tokens=40, temperature=1.0, top_k=20, top_p=0.9, seed=3, stop_at_end=False)
    first = Decoder(lm, SETTINGS).generate(_prompts([7, 11]), cfg)
    second = Decoder(lm, SETTINGS).generate(_prompts([7, 11]), cfg)
    assert [g.token_ids for g in first.generations] == [g.token_ids for g in second.generations]


def _batch():
    gen = torch.Generator().manual_seed(0)
    rows = []
    for lengths in ([120, 100, 36], [256]):
        row = []
        for n in lengths:
            ids = torch.randint(2, 96, (n,), generator=gen).tolist()
            row.append(SFTExample(tuple(ids), (IGNORE_INDEX,) * 20 + tuple(ids[20:])))
        rows.append(row)
    packed = build_rows(rows, 256, pad_token_id=0)
    return make_train_batch(packed, 96, 1e-3, gen).to("cuda")


def test_flex_training_loss_and_gradients_match_dense_sdpa():
    batch = _batch()
    results = []
    for use_flex in (True, False):
        objective = BlockDiffusionLM(copy.deepcopy(_model()), 4).cuda()
        loss = objective(batch, objective.attention_mask(batch.doc_ids, use_flex))
        loss.backward()
        grad = objective.lm.model.layers[0].self_attn.q_proj.weight.grad.clone()
        results.append((loss.detach(), grad))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-4, atol=1e-4)
    # two attention kernels in fp32: compare gradients by relative norm (elementwise, a few
    # tiny entries differ by rounding; seen 2 of 4096 at 4e-5 on an H200)
    flex_grad, dense_grad = results[0][1], results[1][1]
    assert float((flex_grad - dense_grad).norm() / dense_grad.norm()) < 1e-4


def test_compiled_bf16_sft_steps_run_and_learn(repo_root, tmp_path):
    import yaml
    from dicepipe.config import stage_settings
    from dicepipe.model.loading import build_tiny
    from dicepipe.model.tokenizer import train_tiny_tokenizer
    from dicepipe.train.data import prepare_sft_data
    from dicepipe.train.parallel import init_distributed
    from dicepipe.train.sft import SFTPaths, run_sft

    params = yaml.safe_load((repo_root / "params.yaml").read_text())  # no jsonschema on GPU hosts
    prompts = [f"kernel for op {i}: y = x * {i}" for i in range(6)]
    responses = [f"```cpp\ny[i] = x[i] * {i};\n```" for i in range(6)]
    tokenizer = train_tiny_tokenizer(prompts + responses, 2048)
    loaded = build_tiny(params["models"]["tiny-init"], tokenizer)
    data = prepare_sft_data(prompts, responses, tokenizer, loaded.settings, 512)
    settings = stage_settings(params, "sft", scale="tiny")
    settings.update(epochs=40, learning_rate=0.01, bf16=True, compile=True, cutoff_len=512,
                    save_every_steps=10_000)
    paths = SFTPaths(tmp_path / "model", tmp_path / "metrics", tmp_path / "work")
    summary = run_sft(loaded, data, settings, paths, init_distributed("cuda"))
    assert summary["loss_final"] < summary["loss_first"] / 2
    assert (tmp_path / "model" / "model.safetensors").is_file()
