"""Generation: the one home of loading a model to decode and of decoding prompts, for
evaluation (batched, journaled), the augment `local` author (one draft at a time) and RL
rollouts (`block_decode_settings`; the rollouts keep their own trace-keeping Decoder copy).

Any model loads: a checkpoint this package saved (SFT/RL stage output), a params.yaml model
spec, a hub id or a local transformers folder. Block-diffusion models (a mask token in their
block settings, or an SDAR config) decode through the project's `Decoder`; every other model
is autoregressive and decodes through transformers' `generate`. Prompts are rendered by
`model.tokenizer.prompt_ids`, the one rendering SFT, RL and the augment author use
(`empty_think` adds the template's empty think block, which the release's evaluation does
not write). The release decodes in fp16. Each row stops at the end of its turn.

Evaluation's defaults follow the release's (dice-recipe.md §6): greedy, block 4, 4 denoising
steps, up to 4096 new tokens. The release's greedy `low_confidence_static` takes confidence
after top-k filtering, so every masked position has confidence 1 and the first masked
position wins each step: one token per forward, left to right, which is this decoder's
`sequential` strategy (`static` here ranks by the unfiltered probability instead).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..config import is_hub_id
from ..errors import ConfigError, ModelError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationSettings:
    """How evaluation generates: keys of the resolved evaluate settings (config.stage_settings;
    their defaults live in the schema only, evaluate.defaults)."""

    max_new_tokens: int
    denoising_steps: int
    strategy: str
    threshold: float
    temperature: float
    top_p: float
    samples: int
    batch_size: int
    dtype: str  # on GPU (fp16 as released, bf16, fp32); CPU decodes in fp32
    empty_think: bool  # the chat template's empty think block in the prompt
    compile: bool
    seed: int

    @classmethod
    def from_params(cls, values: dict, source: str) -> GenerationSettings:
        """From resolved evaluate settings (config.stage_settings(params, "evaluate", ...))."""
        known = set(cls.__dataclass_fields__)
        missing = sorted(known - set(values))
        if missing:
            raise ConfigError(f"params.yaml {source}: settings {missing} are missing. Expected "
                              "settings resolved by config.stage_settings (the schema's "
                              "evaluate.defaults fill every key).")
        settings = cls(**{k: v for k, v in values.items() if k in known})
        if settings.samples > 1 and settings.temperature <= 0:
            raise ConfigError(f"params.yaml {source}: samples is {settings.samples} with temperature "
                              f"{settings.temperature}: greedy samples are all the same. Set "
                              "temperature > 0 (e.g. 1.0) for pass@k, or samples: 1.")
        return settings


@dataclass
class Generator:
    """A loaded model and how it decodes (`block`: the project's Decoder; `causal`:
    transformers' generate)."""

    kind: str
    model: Any
    tokenizer: Any
    settings: Any = None  # BlockSettings (block kind)
    decoder: Any = None
    fingerprint: str = ""


_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


def _device_and_dtype(dtype: str):
    import torch

    if dtype not in _DTYPES:
        raise ConfigError(f"params.yaml evaluate dtype {dtype!r}: expected one of {sorted(_DTYPES)}.")
    if torch.cuda.is_available():
        return "cuda", getattr(torch, _DTYPES[dtype])
    return "cpu", torch.float32


def _folder_fingerprint(folder: Path) -> str:
    """Identifies a model folder for resuming: its config and block settings, and each weight
    file's name, size and modification time (hashing 16 GB of weights is not worth it; a
    rewritten checkpoint gets a new time, so at worst a resume regenerates)."""
    h = hashlib.sha256()
    for name in ("config.json", "block_diffusion.json"):
        if (folder / name).is_file():
            h.update((folder / name).read_bytes())
    for weights in sorted([*folder.glob("*.safetensors"), *folder.glob("*.bin")]):
        stat = weights.stat()
        h.update(f"{weights.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def load_generator(model_ref: str | dict, name: str, settings: GenerationSettings,
                   allow_download: bool = False) -> Generator:
    """Load `model_ref`: a folder saved by this package, a model spec (dict with kind sdar /
    qwen3), or a hub id / local folder of any transformers causal LM."""
    from .loading import load_checkpoint, load_saved, resolve_checkpoint
    from .settings import BLOCK_SETTINGS_FILE

    device, dtype = _device_and_dtype(settings.dtype)
    if isinstance(model_ref, dict):
        if model_ref.get("kind") == "tiny":
            raise ConfigError(f"{name}: a `tiny` spec has no weights to evaluate; point at the "
                              "checkpoint a stage saved (models/sft/tiny) instead.")
        loaded = load_checkpoint(model_ref, name, dtype=dtype, device=device,
                                 allow_download=allow_download)
        folder = Path(loaded.settings.source)
    else:
        local = Path(model_ref).expanduser()
        if not local.exists() and not is_hub_id(model_ref):
            raise ModelError(f"{model_ref}: no such model folder. Expected a checkpoint a stage "
                             "saved (models/<stage>/<scale>), a transformers folder or a hub id; "
                             "run the stage that writes it first.")
        folder = resolve_checkpoint({"path": model_ref}, name, allow_download)
        config = json.loads((folder / "config.json").read_text())
        if (folder / BLOCK_SETTINGS_FILE).is_file():
            loaded = load_saved(folder, dtype=dtype, device=device)
        elif config.get("model_type") == "sdar":
            spec = {"kind": "sdar", "path": str(folder), "block_size": int(config.get("block_size", 4)),
                    "mask_token_id": config.get("mask_token_id")}
            loaded = load_checkpoint(spec, name, dtype=dtype, device=device)
        else:
            return _load_transformers(folder, name, device, dtype)
    gen = _from_loaded(loaded, settings)
    gen.fingerprint = _folder_fingerprint(folder)
    return gen


def _from_loaded(loaded, settings: GenerationSettings) -> Generator:
    from .decode import Decoder

    model = loaded.model.eval()
    if loaded.settings.causal:
        return Generator("causal", model, loaded.tokenizer, loaded.settings)
    compile_layers = settings.compile and next(model.parameters()).is_cuda
    return Generator("block", model, loaded.tokenizer, loaded.settings,
                     Decoder(model, loaded.settings, compile_layers=compile_layers))


def _load_transformers(folder: Path, name: str, device: str, dtype) -> Generator:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype)
    except (OSError, ValueError) as exc:
        raise ModelError(f"{folder} ({name}): cannot load it as a transformers causal LM: {exc}") from exc
    return Generator("causal", model.to(device).eval(), tokenizer,
                     fingerprint=_folder_fingerprint(folder))


def _stop_ids(tokenizer) -> tuple[int, ...]:
    from .tokenizer import chat_format, stop_token_ids

    if getattr(tokenizer, "chat_template", None):
        return stop_token_ids(tokenizer, chat_format(tokenizer))
    ids = [i for i in (tokenizer.eos_token_id, tokenizer.pad_token_id) if i is not None]
    return tuple(dict.fromkeys(int(i) for i in ids))


def _batch_seed(seed: int, index: int) -> int:
    return int(hashlib.sha256(f"{seed}:{index}".encode()).hexdigest()[:8], 16)


def generation_key(gen: Generator, prompts: list[str], settings: GenerationSettings) -> str:
    """What a generation depends on: the model, the settings and the prompts (for resuming)."""
    blob = json.dumps({"model": gen.fingerprint, "kind": gen.kind, "settings": asdict(settings),
                       "prompts": prompts}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def prompt_ids_for(tokenizer, prompts: list[str], settings: GenerationSettings) -> list[list[int]]:
    """The ids evaluation decodes from: each user turn in the model's chat template, the
    assistant turn opened (with the template's empty think block only under empty_think)."""
    from .tokenizer import chat_format, encode_prompts

    fmt = chat_format(tokenizer, settings.empty_think) if getattr(tokenizer, "chat_template", None) else None
    return encode_prompts(tokenizer, fmt, prompts)


def generate_texts(gen: Generator, prompts: list[str], settings: GenerationSettings,
                   progress: bool = True, journal: Path | None = None) -> list[list[dict]]:
    """For each prompt, `samples` generations: {text, new_tokens, stopped}. Rows are batched
    by prompt length (less padding); each batch draws from its own seeded generator. With a
    `journal` (key it by `generation_key`), finished batches are appended to it and a
    re-run skips them."""
    ids = prompt_ids_for(gen.tokenizer, prompts, settings)
    rows = [(i, s) for i in range(len(prompts)) for s in range(settings.samples)]
    rows.sort(key=lambda r: (len(ids[r[0]]), r))
    out: list[list[dict | None]] = [[None] * settings.samples for _ in prompts]
    done = _read_journal(journal)
    batches = [rows[i:i + settings.batch_size] for i in range(0, len(rows), settings.batch_size)]
    bar = _progress(len(rows), progress)
    for index, batch in enumerate(batches):
        if all(f"{i}:{s}" in done for i, s in batch):
            results = [done[f"{i}:{s}"] for i, s in batch]
        else:
            batch_ids = [ids[i] for i, _ in batch]
            seed = _batch_seed(settings.seed, index)
            results = decode_batch(gen, batch_ids, settings, seed)
            _append_journal(journal, batch, results)
        for (i, s), result in zip(batch, results):
            out[i][s] = result
        if bar is not None:
            bar.update(len(batch))
    if bar is not None:
        bar.close()
    return out


def _read_journal(journal: Path | None) -> dict[str, dict]:
    done: dict[str, dict] = {}
    if journal is None or not journal.is_file():
        return done
    for line in journal.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue  # the line a kill cut short
        done[entry.pop("row")] = entry
    if done:
        log.info("resuming generation: %d rows already in %s", len(done), journal)
    return done


def _append_journal(journal: Path | None, batch, results) -> None:
    if journal is None:
        return
    journal.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(dict(result, row=f"{i}:{s}")) + "\n" for (i, s), result in zip(batch, results)]
    with open(journal, "a", encoding="utf-8") as fh:
        fh.writelines(lines)


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="generate", unit="sample", mininterval=5.0)


def block_decode_settings(values: dict, *, greedy: bool, seed: int = 0, strategy: str | None = None):
    """The Decoder's settings from sampling settings (max_new_tokens, denoising_steps,
    strategy, threshold, temperature, top_p). Greedy is top-1 sampling; every row stops at
    its end token."""
    from .decode import DecodeSettings

    return DecodeSettings(max_new_tokens=values["max_new_tokens"],
                          denoising_steps=values["denoising_steps"],
                          strategy=strategy or values["strategy"], threshold=values["threshold"],
                          temperature=1.0 if greedy else values["temperature"],
                          top_k=1 if greedy else 0, top_p=values["top_p"], seed=seed,
                          stop_at_end=True)


def decode_batch(gen: Generator, batch_ids, settings: GenerationSettings, seed: int) -> list[dict]:
    """One batch of prompt ids decoded from one seed: {text, new_tokens, stopped} per row."""
    if gen.kind == "block":
        return _decode_block(gen, batch_ids, settings, seed)
    return _decode_causal(gen, batch_ids, settings, seed)


def _decode_block(gen: Generator, batch_ids, settings: GenerationSettings, seed: int) -> list[dict]:
    cfg = block_decode_settings(asdict(settings), greedy=settings.temperature <= 0, seed=seed)
    result = gen.decoder.generate(batch_ids, cfg)
    return [{"text": gen.tokenizer.decode(g.token_ids, skip_special_tokens=True),
             "new_tokens": len(g.token_ids), "stopped": bool(g.stopped)}
            for g in result.generations]


def _decode_causal(gen: Generator, batch_ids, settings: GenerationSettings, seed: int) -> list[dict]:
    import torch

    stops = _stop_ids(gen.tokenizer)
    pad = gen.tokenizer.pad_token_id if gen.tokenizer.pad_token_id is not None else stops[0]
    width = max(map(len, batch_ids))
    device = next(gen.model.parameters()).device
    tokens = torch.full((len(batch_ids), width), pad, dtype=torch.long)
    mask = torch.zeros_like(tokens)
    for r, row in enumerate(batch_ids):  # left padding: every row ends where generation starts
        tokens[r, width - len(row):] = torch.tensor(row)
        mask[r, width - len(row):] = 1
    sampling = settings.temperature > 0
    torch.manual_seed(seed)
    with torch.no_grad():
        output = gen.model.generate(
            tokens.to(device), attention_mask=mask.to(device), max_new_tokens=settings.max_new_tokens,
            do_sample=sampling, temperature=settings.temperature if sampling else None,
            top_p=settings.top_p if sampling else None, top_k=None, eos_token_id=list(stops),
            pad_token_id=pad)
    results = []
    for row in output[:, width:].tolist():
        end = next((i + 1 for i, tok in enumerate(row) if tok in stops), None)
        kept = row[:end] if end else row
        results.append({"text": gen.tokenizer.decode(kept, skip_special_tokens=True),
                        "new_tokens": len(kept), "stopped": end is not None})
    return results
