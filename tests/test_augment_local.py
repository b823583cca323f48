"""The local author: a clear error without a model, and the generate plumbing on a tiny
randomly initialised model saved to a temporary folder (its answers hold no code)."""

from __future__ import annotations

import copy

import pytest
from dicepipe.augment import generate_tasks
from dicepipe.augment.authors import make_author
from dicepipe.errors import ModelError


def test_missing_model_path_names_the_key(params, tmp_path):
    settings = copy.deepcopy(params["augment"])
    settings["author"] = "local"
    settings["local"]["path"] = str(tmp_path / "nowhere")
    with pytest.raises(ModelError, match="augment.local.path"):
        make_author(settings, "cpu")


def _save_tiny_model(folder):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<eos>": 1, **{chr(c): i + 2 for i, c in enumerate(range(32, 127))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")
    fast.save_pretrained(folder)
    config = GPT2Config(vocab_size=len(vocab), n_positions=16384, n_embd=16, n_layer=1,
                        n_head=2, eos_token_id=1, bos_token_id=1)
    GPT2LMHeadModel(config).save_pretrained(folder)


def test_tiny_local_model_generates_and_reports_no_code(params, tmp_path):
    import torch

    torch.manual_seed(0)
    _save_tiny_model(tmp_path / "author")
    settings = copy.deepcopy(params["augment"])
    settings["author"] = "local"
    settings["local"].update(path=str(tmp_path / "author"), max_new_tokens=8, temperature=0.0)
    author = make_author(settings, "cpu")
    assert author.fingerprint().startswith("local:")
    task = generate_tasks(settings, "cpu")[0]
    draft = author.write(task, 0)
    assert draft.code is None and draft.failure == "author_no_code"
    assert author.write(task, 0) == draft  # greedy decoding: the same answer again


def test_dicepipe_checkpoint_decodes_through_the_block_diffusion_engine(params, tmp_path):
    """A folder written by `save_model` (what `dicepipe sft` leaves) is decoded by the
    model package's Decoder (block diffusion, stop at the end token), not plain generate."""
    from dicepipe.model.loading import build_tiny, save_model
    from dicepipe.model.tokenizer import train_tiny_tokenizer

    texts = [task.reference_code for task in generate_tasks(params["augment"], "cpu")]
    spec = {"kind": "tiny", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
            "vocab_size": 400, "max_position_embeddings": 8192, "block_size": 4, "seed": 0}
    save_model(tmp_path / "author", build_tiny(spec, train_tiny_tokenizer(texts, 400)))
    settings = copy.deepcopy(params["augment"])
    settings["author"] = "local"
    settings["local"].update(path=str(tmp_path / "author"), max_new_tokens=8, temperature=0.0)
    author = make_author(settings, "cpu")
    task = generate_tasks(settings, "cpu")[0]
    draft = author.write(task, 0)
    gen = author.generator
    assert gen.kind == "block" and gen.decoder is not None and not gen.settings.causal
    assert draft.code is None and draft.failure == "author_no_code"
    assert author.write(task, 0) == draft  # greedy: the same answer again
