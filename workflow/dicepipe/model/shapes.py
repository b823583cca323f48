"""Qwen3 shapes of the SDAR models, and randomly initialised models of any shape (for
benchmarks and tests that need the architecture, not the weights)."""

from __future__ import annotations

SDAR_VOCAB = 151936
SDAR_MASK_ID = 151669

SHAPES: dict[str, dict] = {
    # SDAR-1.7B: Qwen3-1.7B with an untied output layer (2.03 B parameters).
    "1.7b": {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
                 "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128},
    "4b": {"hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
               "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128},
    "8b": {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
               "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128},
}


def qwen3_config(shape: dict, vocab_size: int = SDAR_VOCAB, **extra):
    from transformers import Qwen3Config

    fields = {"vocab_size": vocab_size, "max_position_embeddings": 32768, "tie_word_embeddings": False,
                  "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
                  "rms_norm_eps": 1e-6, "hidden_act": "silu"}
    fields.update(shape)
    fields.update(extra)
    return Qwen3Config(**fields)


def random_qwen3(config, *, dtype=None, device="cpu", seed: int = 0):
    """A Qwen3ForCausalLM with random weights, initialised directly on `device`."""
    import torch
    from transformers import Qwen3ForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.device(device):
            model = Qwen3ForCausalLM._from_config(config, attn_implementation="sdpa",
                                                  dtype=dtype or torch.float32)
    return model.eval()


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())
