"""`dicepipe export-sdar`: a model this package saved, as an SDAR-shaped checkpoint folder (a
command, not a pipeline stage).

SDAR's released chat models (JetLM/SDAR-*-Chat) are Qwen3 weights under a config.json of
`model_type: sdar` that carries the block size and the mask token id, with a tokenizer whose
chat template uses Qwen's markers (<|im_start|>, <|im_end|>) and a <|MASK|> token. The
pipeline loads them through `model.loading.load_checkpoint`, mapping the config onto Qwen3's.
This command writes a folder the pipeline saved (a base such as data/base/tiny, or an SFT or
RL output, which carry block_diffusion.json) in that layout: the same weight and tokenizer
files, config.json in SDAR's keys, and no block_diffusion.json, so a `models.<name>` entry of
kind `sdar` pointing at it loads it exactly as it loads SDAR. The debug scale's base
(data/base/debug) is data/base/tiny exported so:

    dicepipe export-sdar --model data/base/tiny --out data/base/debug --link-weights

(`--link-weights`: its model.safetensors is a relative link to the tiny base's, not a second
copy of the same 5 MB in git.)

The folder gets its own MANIFEST.json, and EXPORTED.json records the command and the source's
config and weight digests (no path outside the repository, no time).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

# What SDAR's config.json holds beyond Qwen3's (JetLM/SDAR-8B-Chat), with the values its
# remote code reads; `block_size` and `mask_token_id` come from the model's own settings.
# Its `auto_map` is left out: it names remote-code files this folder does not ship (and
# transformers would stop to ask before loading the tokenizer).
SDAR_KEYS = {
    "architectures": ["SDARForCausalLM"],
    "attn_implementation": "flex_attention",
    "fuse_cross_entropy": True,
    "model_type": "sdar",
}
# Files of a saved folder that are not part of an SDAR checkpoint.
_LEFT_OUT = ("block_diffusion.json", "MANIFEST.json", "MANIFEST.verified.json", "EXPORTED.json")


def add_arguments(parser) -> None:
    parser.add_argument("--model", required=True, help="a folder this package saved (block_diffusion.json in it)")
    parser.add_argument("--out", required=True, help="the SDAR-shaped folder to write (replaced)")
    parser.add_argument("--link-weights", action="store_true",
                        help="link the weight files (a relative symlink) instead of copying them: "
                             "the shipped debug base shares the tiny base's weights so")


def sdar_config(config: dict, block_size: int, mask_token_id: int) -> dict:
    """SDAR's config.json for a saved Qwen3 config: SDAR's keys, its rope spelling
    (rope_theta, rope_scaling) and dtype key (torch_dtype)."""
    out = {k: v for k, v in config.items() if k not in ("rope_parameters", "dtype", "layer_types")}
    rope = config.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        from ..errors import ModelError

        raise ModelError(f"rope_type {rope['rope_type']!r}: only the default RoPE has SDAR's spelling here.")
    out.update(SDAR_KEYS, block_size=int(block_size), mask_token_id=int(mask_token_id),
               rope_theta=rope.get("rope_theta", config.get("rope_theta", 10000.0)), rope_scaling=None,
               torch_dtype=config.get("dtype", config.get("torch_dtype", "float32")))
    return out


def export(model: Path, out: Path, command: str, link_weights: bool = False) -> None:
    from ..errors import ModelError
    from ..model import manifest
    from ..model.settings import BLOCK_SETTINGS_FILE, BlockSettings

    if not (model / BLOCK_SETTINGS_FILE).is_file():
        raise ModelError(f"{model}: no {BLOCK_SETTINGS_FILE}; --model must be a folder this package "
                         "saved (a base made by pretrain-base, or an SFT or RL output).")
    manifest.check_model_folder(model)
    settings = BlockSettings.load(model)
    if settings.causal or settings.mask_token_id is None:
        raise ModelError(f"{model} is a causal model; SDAR's layout is for block-diffusion models.")
    config = json.loads((model / "config.json").read_text())
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in sorted(model.iterdir()):
        if not f.is_file() or f.name in _LEFT_OUT or f.name == "config.json":
            continue
        if link_weights and f.suffix == ".safetensors":  # tmp and out are siblings: one relative path
            (tmp / f.name).symlink_to(os.path.relpath(f, tmp))
        else:
            shutil.copy2(f, tmp / f.name)
    (tmp / "config.json").write_text(json.dumps(
        sdar_config(config, settings.block_size, settings.mask_token_id), indent=2, sort_keys=True) + "\n")
    weights = {f.name: manifest.sha256_file(f) for f in sorted(model.glob("*.safetensors"))}
    (tmp / "EXPORTED.json").write_text(json.dumps(
        {"command": command, "source_weights_sha256": weights,
         "block_size": settings.block_size, "mask_token_id": settings.mask_token_id},
        indent=2, sort_keys=True) + "\n")
    manifest.write_manifest(tmp)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)


def run(args, params) -> int:
    model, out = Path(args.model), Path(args.out)
    export(model, out, "dicepipe " + shlex.join(args.argv), args.link_weights)
    log.info("exported %s as an SDAR-shaped folder: %s", model, out)
    return 0
