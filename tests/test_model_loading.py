"""Loading: the tiny tokenizer, SDAR-format checkpoints without remote code, saved folders,
and early, clear failures for missing checkpoints."""

from __future__ import annotations

import json
import time

import pytest
import torch
from dicepipe.errors import ModelError
from dicepipe.model.loading import (
    build_tiny,
    load_model,
    load_saved,
    resolve_checkpoint,
    save_model,
)
from dicepipe.model.shapes import qwen3_config, random_qwen3
from dicepipe.model.tokenizer import (
    IGNORE_INDEX,
    chat_format,
    encode_sft_example,
    stop_token_ids,
    train_tiny_tokenizer,
)

TEXTS = [f"def forward(self, x):\n    return torch.relu(x) * {i}\n" for i in range(40)]
TINY_SPEC = {"kind": "tiny", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 400,
                 "max_position_embeddings": 512, "block_size": 4, "seed": 0}


@pytest.fixture(scope="module")
def tokenizer():
    return train_tiny_tokenizer(TEXTS, 400)


def test_tiny_tokenizer_is_deterministic_with_chat_tokens(tokenizer, tmp_path):
    again = train_tiny_tokenizer(TEXTS, 400)
    tokenizer.save_pretrained(tmp_path / "a")
    again.save_pretrained(tmp_path / "b")
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (tmp_path / "b" / "tokenizer.json").read_bytes()
    for token in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>"):
        ids = tokenizer(token, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1, token
    fmt = chat_format(tokenizer)
    assert fmt.prompt_text("hi") == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert fmt.turn_end == "<|im_end|>\n"
    im_end, eot = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert stop_token_ids(tokenizer, fmt) == (im_end, eot)
    text = "return x"
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text


def test_sft_example_is_block_padded_with_trained_pad_tokens(tokenizer):
    fmt = chat_format(tokenizer)
    pad = tokenizer.pad_token_id
    ex = encode_sft_example(tokenizer, fmt, "add one", "return x + 1", 4, pad)
    assert len(ex) % 4 == 0
    prompt_len = len(tokenizer(fmt.prompt_text("add one"), add_special_tokens=False)["input_ids"])
    assert ex.labels[:prompt_len] == (IGNORE_INDEX,) * prompt_len
    assert all(label != IGNORE_INDEX for label in ex.labels[prompt_len:])
    response_ids = tokenizer("return x + 1<|im_end|>\n", add_special_tokens=False)["input_ids"]
    assert list(ex.input_ids[prompt_len : prompt_len + len(response_ids)]) == response_ids
    tail = ex.input_ids[prompt_len + len(response_ids) :]
    assert len(tail) < 4 and set(tail) <= {pad}
    assert ex.labels[len(ex) - len(tail) :] == tail  # the block padding is trained


def _write_sdar_checkpoint(folder, model, tokenizer, mask_id):
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="sdar", architectures=["SDARForCausalLM"], block_size=4,
                  mask_token_id=mask_id, attn_implementation="flex_attention",
                  fuse_cross_entropy=True,
                  auto_map={"AutoConfig": "configuration_sdar.SDARConfig",
                            "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"})
    (folder / "config.json").write_text(json.dumps(config))


def test_sdar_checkpoint_loads_as_qwen3_with_same_logits(tokenizer, tmp_path):
    shape = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "head_dim": 8}
    source = random_qwen3(qwen3_config(shape, vocab_size=400), seed=3)
    mask_id = tokenizer.mask_token_id
    _write_sdar_checkpoint(tmp_path / "sdar", source, tokenizer, mask_id)
    spec = {"kind": "sdar", "path": str(tmp_path / "sdar"), "block_size": 4, "mask_token_id": mask_id}
    loaded = load_model(spec, "sdar-test", dtype=torch.float32)
    assert type(loaded.model).__name__ == "Qwen3ForCausalLM"
    assert loaded.settings.block_size == 4 and loaded.settings.mask_token_id == mask_id
    assert not loaded.settings.causal and not loaded.model.config.tie_word_embeddings
    ids = torch.randint(0, 400, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(input_ids=ids).logits, source(input_ids=ids).logits)


def test_missing_checkpoints_fail_at_once_with_the_key_to_set(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(ModelError, match=r"models\.sdar-x\.path.*"):
        resolve_checkpoint({"kind": "sdar", "path": "JetLM/SDAR-Does-Not-Exist"}, "sdar-x")
    with pytest.raises(ModelError, match="download"):
        resolve_checkpoint({"kind": "sdar", "path": "JetLM/SDAR-Does-Not-Exist"}, "sdar-x")
    with pytest.raises(ModelError, match="does not exist"):
        resolve_checkpoint({"kind": "qwen3", "path": str(tmp_path / "nowhere")}, "base")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(ModelError, match="no weight files"):
        resolve_checkpoint({"kind": "qwen3", "path": str(tmp_path / "empty")}, "base")
    assert time.monotonic() - t0 < 30  # no network waits (HF_HUB_OFFLINE is set in conftest)


def test_saved_folder_round_trips_deterministically(tokenizer, tmp_path):
    loaded = build_tiny(TINY_SPEC, tokenizer)
    save_model(tmp_path / "a", loaded)
    save_model(tmp_path / "b", build_tiny(TINY_SPEC, tokenizer))
    for name in ("model.safetensors", "config.json", "tokenizer.json", "block_diffusion.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert str(tmp_path) not in (tmp_path / "a" / "config.json").read_text()
    back = load_saved(tmp_path / "a")
    assert back.settings == loaded.settings
    ids = torch.arange(10)[None]
    with torch.no_grad():
        torch.testing.assert_close(back.model(input_ids=ids).logits, loaded.model(input_ids=ids).logits)
