"""The `local` author: a language model on local disk.

It sends the same one-shot prompt as the endpoint author, rendered by
`model.tokenizer.prompt_ids` (the model's own chat template, exactly as SFT and evaluation
render it), and takes the first fenced code block of the answer. A checkpoint written by this project (`dicepipe sft`, block settings beside the weights) decodes through
the model package's `Decoder`: block diffusion for SDAR-style models, stopping per row at
the end token, or its autoregressive path for causal ones. Any other transformers causal LM
falls back to a plain `generate`."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from ...data import extract, prompts
from ...errors import ModelError
from ...model.settings import BLOCK_SETTINGS_FILE
from ..tasks import Task
from . import Draft

log = logging.getLogger(__name__)


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
        self._model = None
        self._tokenizer = None
        self._decoder = None

    def fingerprint(self) -> str:
        config = (self.path / "config.json").read_bytes()
        parts = [str(self.path), hashlib.sha256(config).hexdigest()[:16], self.max_new_tokens,
                 self.temperature, self.backend]
        return "local:" + json.dumps(parts)

    def _load(self):
        if self._model is None and (self.path / BLOCK_SETTINGS_FILE).is_file():
            import torch

            from ...model.decode import Decoder
            from ...model.loading import load_saved

            device = "cuda" if torch.cuda.is_available() else "cpu"
            log.info("loading the local author model from %s (dicepipe checkpoint)", self.path)
            loaded = load_saved(self.path, device=device)
            self._model, self._tokenizer = loaded.model.eval(), loaded.tokenizer
            self._decoder = Decoder(self._model, loaded.settings)
        if self._model is None:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            log.info("loading the local author model from %s", self.path)
            try:
                self._tokenizer = AutoTokenizer.from_pretrained(self.path)
                self._model = AutoModelForCausalLM.from_pretrained(self.path)
            except (OSError, ValueError) as exc:
                raise ModelError(f"{self.path}: cannot load the local author model: {exc}") from exc
            device = "cuda" if torch.cuda.is_available() else "cpu"
            self._model.to(device).eval()
        return self._model, self._tokenizer

    def _prompt_ids(self, tokenizer, text: str):
        """(1, n) ids: the one rendering SFT, RL and evaluation use (model.tokenizer.prompt_ids)."""
        import torch

        from ...model.tokenizer import prompt_ids

        return torch.tensor([prompt_ids(tokenizer, text)], dtype=torch.long)

    def write(self, task: Task, attempt: int) -> Draft:
        import torch

        model, tokenizer = self._load()
        ids = self._prompt_ids(tokenizer, prompts.end_to_end_prompt(task.reference_code, self.backend))
        ids = ids.to(model.device)
        digest = hashlib.sha256(f"{self.seed}:{task.task_id}:{attempt}".encode()).hexdigest()
        torch.manual_seed(int(digest[:8], 16))
        if self._decoder is not None:
            text = self._decode_with_engine(ids[0].tolist(), tokenizer, digest)
        else:
            text = self._plain_generate(model, tokenizer, ids)
        code = extract.code_from_text(text, "first")
        if code is None:
            return Draft(failure="author_no_code", detail=text[:300])
        return Draft(code=code)

    def _decode_with_engine(self, prompt: list[int], tokenizer, digest: str) -> str:
        from ...model.decode import DecodeSettings

        greedy = self.temperature <= 0
        cfg = DecodeSettings(max_new_tokens=self.max_new_tokens,
                             temperature=1.0 if greedy else self.temperature,
                             top_k=1 if greedy else 0, seed=int(digest[8:16], 16))
        generation = self._decoder.generate([prompt], cfg).generations[0]
        return tokenizer.decode(generation.token_ids, skip_special_tokens=True)

    def _plain_generate(self, model, tokenizer, ids) -> str:
        import torch

        sampling = self.temperature > 0
        with torch.no_grad():
            output = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=self.max_new_tokens,
                do_sample=sampling, temperature=self.temperature if sampling else None,
                top_p=None, top_k=None,
                pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                else tokenizer.eos_token_id)
        return tokenizer.decode(output[0, ids.shape[1]:], skip_special_tokens=True)
