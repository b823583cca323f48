"""The `local` author: a language model on local disk.

It sends the same one-shot prompt as the endpoint author and takes the first fenced code
block of the answer. Loading and decoding are `model.generate`'s, the code evaluation uses:
the prompt rendered by the model's own chat template (`prompt_ids`, exactly as SFT and
evaluation render it); a checkpoint written by this project (`dicepipe sft`, block settings
beside the weights) or an SDAR folder decodes through the `Decoder` (block diffusion,
stopping per row at the end token), any other transformers causal LM through `generate`,
stopping at the end of its turn. Each (seed, task, attempt) decodes from its own seed."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from functools import cached_property
from pathlib import Path

from ...data import extract, prompts
from ...errors import ModelError
from ..tasks import Task
from .draft import Draft


class LocalAuthor:
    name = "local"

    def __init__(self, settings: dict, backend: str, seed: int = 0):
        self.path = Path(settings["path"])
        self.max_new_tokens = int(settings["max_new_tokens"])  # schema defaults filled
        self.temperature = float(settings["temperature"])
        self.backend = backend
        self.seed = seed
        if not (self.path / "config.json").is_file():
            raise ModelError(
                f"params.yaml: key 'augment.local.path' is {str(self.path)!r}, which holds no "
                "transformers model (no config.json there). Save a model and its tokenizer "
                "there (save_pretrained), point the key at one, or set augment.author to "
                "'templates' or 'endpoint'."
            )

    def fingerprint(self) -> str:
        config = (self.path / "config.json").read_bytes()
        parts = [str(self.path), hashlib.sha256(config).hexdigest()[:16], self.max_new_tokens,
                 self.temperature, self.backend]
        return "local:" + json.dumps(parts)

    @cached_property
    def settings(self):
        """Evaluation's GenerationSettings for one draft at a time: this author's length and
        temperature, the Decoder's own defaults for the rest, fp32 weights."""
        from ...model.decode import DecodeSettings
        from ...model.generate import GenerationSettings

        decoder = {f.name: f.default for f in dataclasses.fields(DecodeSettings)}
        return GenerationSettings(
            max_new_tokens=self.max_new_tokens, denoising_steps=decoder["denoising_steps"],
            strategy=decoder["strategy"], threshold=decoder["threshold"],
            temperature=self.temperature, top_p=decoder["top_p"], samples=1, batch_size=1,
            dtype="fp32", empty_think=False, compile=False, seed=self.seed)

    @cached_property
    def generator(self):
        """The model, loaded on first use (model.generate.load_generator)."""
        from ...model.generate import load_generator

        return load_generator(str(self.path), "augment.local", self.settings)

    def _prompt_ids(self, tokenizer, text: str) -> list[int]:
        """The ids of one prompt: the one rendering SFT, RL and evaluation use."""
        from ...model.generate import prompt_ids_for

        return prompt_ids_for(tokenizer, [text], self.settings)[0]

    def write(self, task: Task, attempt: int) -> Draft:
        from ...model.generate import decode_batch

        gen = self.generator
        ids = self._prompt_ids(gen.tokenizer, prompts.end_to_end_prompt(task.reference_code, self.backend))
        digest = hashlib.sha256(f"{self.seed}:{task.task_id}:{attempt}".encode()).hexdigest()
        text = decode_batch(gen, [ids], self.settings, seed=int(digest[8:16], 16))[0]["text"]
        code = extract.code_from_text(text, "first")
        if code is None:
            return Draft(failure="author_no_code", detail=text[:300])
        return Draft(code=code)
