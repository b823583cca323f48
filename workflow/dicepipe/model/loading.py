"""A model spec from params.yaml -> a transformers Qwen3ForCausalLM, its tokenizer and its
block settings. No remote code: SDAR's config (`model_type: sdar`) is mapped onto Qwen3's,
whose weight names SDAR shares exactly.

Kinds: `tiny` (random init from the spec, tokenizer trained by the caller), `sdar` (hub id or
local folder), `qwen3` (a plain Qwen3-family checkpoint: causal unless the spec names a
mask token), and a folder this package saved (see `save_model`).
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import is_hub_id
from ..errors import CheckpointError, ModelError
from .manifest import check_model_folder, rebuild_hint
from .settings import BLOCK_SETTINGS_FILE, BlockSettings
from .tokenizer import chat_format, stop_token_ids

log = logging.getLogger(__name__)

# SDAR config keys that Qwen3Config does not know (the remote-code class reads them).
_SDAR_ONLY_KEYS = ("model_type", "architectures", "auto_map", "attn_implementation",
                   "fuse_cross_entropy", "block_size", "mask_token_id", "transformers_version")
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "tokenizer*", "*.model"]


@dataclass
class LoadedModel:
    model: Any  # transformers Qwen3ForCausalLM
    tokenizer: Any
    settings: BlockSettings


def resolve_checkpoint(spec: dict, name: str, allow_download: bool = False) -> Path:
    """The local folder of a checkpoint spec; raise ModelError at once if it is not there."""
    path = spec.get("path")
    if not path:
        raise ModelError(f"params.yaml: key 'models.{name}.path' is missing. Set it to a hub id "
                         "or a local checkpoint folder.")
    local = Path(path).expanduser()
    if local.exists() or not is_hub_id(path):
        _check_folder(local, f"models.{name}.path")
        return local
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(path, revision=spec.get("revision"), allow_patterns=_HUB_PATTERNS,
                                   local_files_only=not allow_download)
    except Exception as exc:  # the hub client raises many types for "not available"
        hint = ("" if allow_download else
                f" Download it first (`hf download {path}`, or `huggingface-cli download {path}`), "
                "or pass --download to let the stage fetch it,")
        raise ModelError(
            f"checkpoint {path!r} (params.yaml key 'models.{name}.path') is not available locally."
            f"{hint} or set 'models.{name}.path' to a local folder. ({type(exc).__name__})"
        ) from exc
    _check_folder(Path(folder), f"models.{name}.path")
    return Path(folder)


def _check_folder(folder: Path, key: str) -> None:
    if not folder.is_dir():
        raise ModelError(f"checkpoint folder {folder} (params.yaml key '{key}') does not exist. "
                         "Download the checkpoint there or point the key at a checkpoint folder.")
    if not (folder / "config.json").is_file():
        raise ModelError(f"{folder}: no config.json; not a transformers checkpoint folder ({key}).")
    if not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
        raise ModelError(f"{folder}: no weight files (*.safetensors); the download is incomplete ({key}).")
    check_model_folder(folder)


def qwen3_config_from_checkpoint(config_dict: dict):
    """Qwen3Config for a Qwen3 or SDAR config.json (SDAR-only keys dropped)."""
    from transformers import Qwen3Config

    model_type = config_dict.get("model_type")
    if model_type not in ("qwen3", "sdar"):
        raise ModelError(f"expected a Qwen3 or SDAR checkpoint, found model_type {model_type!r}.")
    if config_dict.get("use_sliding_window"):
        raise ModelError("sliding-window attention is not supported by the block-diffusion layout.")
    kwargs = {k: v for k, v in config_dict.items() if k not in _SDAR_ONLY_KEYS}
    if "torch_dtype" in kwargs:
        kwargs["dtype"] = kwargs.pop("torch_dtype")
    return Qwen3Config(**kwargs)


def _load_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except Exception as exc:
        raise ModelError(f"{folder}: cannot load the tokenizer ({exc}).") from exc


def _load_weights(folder: Path, config, dtype, device):
    from safetensors import SafetensorError
    from transformers import Qwen3ForCausalLM

    try:
        model = Qwen3ForCausalLM.from_pretrained(str(folder), config=config, dtype=dtype,
                                                 attn_implementation="sdpa")
    except (SafetensorError, OSError, EOFError) as exc:  # damage the manifest check cannot see
        raise CheckpointError(f"cannot read the weights of {folder} ({type(exc).__name__}: {exc}); "
                              f"the folder is damaged. {rebuild_hint(folder)}") from exc
    return model.to(device).eval()


def load_checkpoint(spec: dict, name: str, *, dtype=None, device="cpu",
                    allow_download: bool = False) -> LoadedModel:
    """Load an `sdar` or `qwen3` spec (or a folder saved by `save_model`)."""
    folder = resolve_checkpoint(spec, name, allow_download)
    if (folder / BLOCK_SETTINGS_FILE).is_file():
        return load_saved(folder, dtype=dtype, device=device)
    config_dict = json.loads((folder / "config.json").read_text())
    config = qwen3_config_from_checkpoint(config_dict)
    tokenizer = _load_tokenizer(folder)
    mask_id = spec.get("mask_token_id", config_dict.get("mask_token_id"))
    causal = spec["kind"] == "qwen3" and mask_id is None
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    settings = BlockSettings(
        block_size=1 if causal else int(spec["block_size"]),
        mask_token_id=None if mask_id is None else int(mask_id),
        pad_token_id=int(pad_id),
        stop_token_ids=stop_token_ids(tokenizer, chat_format(tokenizer)),
        causal=causal,
        source=str(folder),
    )
    if mask_id is not None and mask_id >= config.vocab_size:
        raise ModelError(f"models.{name}.mask_token_id {mask_id} is outside the vocabulary "
                         f"({config.vocab_size} rows).")
    return LoadedModel(_load_weights(folder, config, dtype, device), tokenizer, settings)


def load_saved(folder: str | Path, *, dtype=None, device="cpu") -> LoadedModel:
    """A folder written by `save_model` (SFT or RL output)."""
    folder = Path(folder)
    _check_folder(folder, str(folder))
    settings = BlockSettings.load(folder)
    config = qwen3_config_from_checkpoint(json.loads((folder / "config.json").read_text()))
    return LoadedModel(_load_weights(folder, config, dtype, device), _load_tokenizer(folder), settings)


def build_tiny(spec: dict, tokenizer, *, device="cpu") -> LoadedModel:
    """Random init from the `tiny` spec (seeded), around a tokenizer already trained."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if len(tokenizer) > spec["vocab_size"]:
        raise ModelError(f"tokenizer has {len(tokenizer)} tokens but models.tiny.vocab_size is "
                         f"{spec['vocab_size']}; raise vocab_size.")
    config = Qwen3Config(
        vocab_size=spec["vocab_size"], hidden_size=spec["hidden_size"],
        intermediate_size=spec["intermediate_size"], num_hidden_layers=spec["num_hidden_layers"],
        num_attention_heads=spec["num_attention_heads"],
        num_key_value_heads=spec["num_key_value_heads"], head_dim=spec["head_dim"],
        max_position_embeddings=spec["max_position_embeddings"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec["seed"])  # models.<m>.seed (schema default filled in)
        model = Qwen3ForCausalLM._from_config(config, attn_implementation="sdpa",
                                              dtype=torch.float32)
    settings = BlockSettings(
        block_size=int(spec["block_size"]), mask_token_id=int(tokenizer.mask_token_id),
        pad_token_id=int(tokenizer.pad_token_id),
        stop_token_ids=stop_token_ids(tokenizer, chat_format(tokenizer)), source="tiny",
    )
    return LoadedModel(model.to(device), tokenizer, settings)


def save_model(folder: str | Path, loaded: LoadedModel, state_dict: dict | None = None,
               dtype=None) -> None:
    """save_pretrained (weights, config, tokenizer) + block settings + MANIFEST.json (last),
    atomically: written to a sibling temporary folder, then renamed over `folder`. A disk
    without room for it stops before anything is written (CheckpointError)."""
    from . import manifest

    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if state_dict is None:
        state_dict = loaded.model.state_dict()
    if dtype is not None:
        state_dict = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state_dict.items()}
    needed = manifest.space_needed(manifest.tensor_bytes(state_dict))
    manifest.ensure_space(folder.parent, manifest.tensor_bytes(state_dict), "model folder")
    tmp.mkdir(parents=True)
    try:
        loaded.model.save_pretrained(str(tmp), state_dict=state_dict)
        loaded.tokenizer.save_pretrained(str(tmp))
        loaded.settings.save(tmp)
        _normalise_config(tmp / "config.json", dtype)
        files = manifest.write_manifest(tmp)["files"]
    except Exception as exc:
        full = manifest.is_out_of_space(exc, folder.parent, needed)  # before the space is freed
        shutil.rmtree(tmp, ignore_errors=True)
        if full:
            raise manifest.no_space_error(folder, needed, manifest.free_bytes(folder), "model folder") from exc
        raise
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)
    if sum(r["bytes"] for r in files.values()) > manifest.HASH_EVERY_READ_BYTES:
        manifest.stamp_verified(folder, files)  # just hashed: the next stage need not again


def _normalise_config(path: Path, dtype) -> None:
    """Record the saved dtype and drop fields that vary between runs of the same training."""
    data = json.loads(path.read_text())
    if dtype is not None:
        data["dtype"] = str(dtype).removeprefix("torch.")
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def load_model(spec: dict, name: str, *, tokenizer=None, dtype=None, device="cpu",
               allow_download: bool = False) -> LoadedModel:
    """Dispatch on spec['kind']; `tiny` needs the trained `tokenizer`."""
    if spec["kind"] == "tiny":
        if tokenizer is None:
            raise ModelError("the tiny model needs a tokenizer trained on the corpus first.")
        return build_tiny(spec, tokenizer, device=device)
    return load_checkpoint(spec, name, dtype=dtype, device=device, allow_download=allow_download)
