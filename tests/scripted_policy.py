"""A scripted policy for the RL and evaluation end-to-end tests: it writes real C++ kernels for
known references, some right and some wrong inside a group, so the reward, the advantages and
the update see rewards that are nonzero and differ (a random tiny model never writes a kernel).

It takes the Decoder's place (`generate(prompts, cfg) -> DecodeResult`), the interface through
which both the RL rollouts (`RolloutModel.decoder`) and evaluation (`Generator.decoder`) decode;
the stages run unchanged around it. Its Generations look like the Decoder's: the text's tokens
through a stop token, the rest of the last block after them, and a global step per committed
token (`steps_per_block` commits per block), so TraceRL scores them like sampled ones.

Answers (each text names its kind in a line before the code, for the tests to read back):
  RIGHT         the kernel: the shipped corpus's ReLU (data/seed/corpus/kernels/relu.py), or a
                sigmoid made from it (one distinct build each, cached by the harness);
  WRONG_VALUES  the same extension called on -x: it compiles (the same build) and is wrong;
  NO_CODE       prose without a fenced block: nothing to score.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from dicepipe.model.decode import DecodeResult, DecodeSettings, Generation

REPO_ROOT = Path(__file__).resolve().parent.parent
RIGHT, WRONG_VALUES, NO_CODE = "right", "wrong_values", "no_code"
KINDS = (RIGHT, WRONG_VALUES, NO_CODE)


def relu_reference() -> str:
    return (REPO_ROOT / "data/seed/corpus/reference/relu.py").read_text()


def sigmoid_reference() -> str:
    return (REPO_ROOT / "data/seed/benchmark/level1/1_Sigmoid.py").read_text()


def _replaced(text: str, old: str, new: str) -> str:
    if old not in text:
        raise AssertionError(f"the scripted author expected {old!r} in the shipped kernel; "
                             "update tests/scripted_policy.py to match the corpus")
    return text.replace(old, new)


def relu_kernel() -> str:
    return (REPO_ROOT / "data/seed/corpus/kernels/relu.py").read_text()


def sigmoid_kernel() -> str:
    """The corpus ReLU with its element expression swapped: a real kernel for 1_Sigmoid."""
    code = _replaced(relu_kernel(), "#include <torch/extension.h>\n",
                     "#include <torch/extension.h>\n#include <cmath>\n")
    code = _replaced(code, "src[i] > 0.0f ? src[i] : 0.0f", "1.0f / (1.0f + std::exp(-src[i]))")
    return code.replace("relu", "sigmoid")


def wrong_values(kernel: str) -> str:
    """The same extension (the same build) applied to -x: compiles, computes the wrong thing."""
    return _replaced(kernel, "_forward(x)", "_forward(-x)")


def answer_text(kind: str, kernel: str | None) -> str:
    if kind == NO_CODE:
        return f"answer: {kind}\nI would write a kernel for this, but not today.\n"
    code = kernel if kind == RIGHT else wrong_values(kernel)
    return f"answer: {kind}\nHere is the optimised program.\n```python\n{code}```\n"


def answer_kind(text: str) -> str:
    """The kind a scripted text was written as (its first line)."""
    first = text.split("\n", 1)[0]
    if not first.startswith("answer: ") or first[8:] not in KINDS:
        raise AssertionError(f"not a scripted answer: {text[:80]!r}")
    return first[8:]


class ScriptedAuthor:
    """For each known reference: its right kernel and a script of answer kinds; the k-th copy
    of a prompt inside one decode call (the k-th rollout of a group, or the k-th sample of a
    task) gets the script's k-th kind, cyclically. A prompt holding no known reference fails."""

    def __init__(self, scripts: dict[str, tuple[str | None, Sequence[str]]]):
        self.scripts = {ref.strip(): (kernel, list(kinds)) for ref, (kernel, kinds) in scripts.items()}

    def text_for(self, prompt_text: str, occurrence: int) -> str:
        found = [ref for ref in self.scripts if ref in prompt_text]
        if len(found) != 1:
            raise AssertionError(f"the scripted author knows {len(found)} of the references in "
                                 f"this prompt (expected 1): {prompt_text[-300:]!r}")
        kernel, kinds = self.scripts[found[0]]
        return answer_text(kinds[occurrence % len(kinds)], kernel)


class ScriptedDecoder:
    """Stands in for `model.decode.Decoder`: writes the author's texts as generations."""

    def __init__(self, author: ScriptedAuthor, tokenizer, block_settings, steps_per_block: int = 2):
        self.author, self.tokenizer, self.settings = author, tokenizer, block_settings
        self.steps_per_block = steps_per_block
        self.calls = 0

    def generate(self, prompts: list[list[int]], cfg: DecodeSettings,
                 record_commit_logits: bool = False) -> DecodeResult:
        self.calls += 1
        seen: Counter = Counter()
        generations = []
        for ids in prompts:
            key = tuple(ids)
            text = self.author.text_for(self.tokenizer.decode(ids, skip_special_tokens=True), seen[key])
            seen[key] += 1
            generations.append(self._generation(len(ids), text, cfg.max_new_tokens))
        return DecodeResult(generations, forwards=0)

    def _generation(self, prompt_len: int, text: str, max_new_tokens: int) -> Generation:
        size = self.settings.block_size
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.settings.stop_token_ids[0]]
        stopped = len(ids) <= max_new_tokens
        ids = ids[:max_new_tokens]
        tail = [self.settings.pad_token_id] * (-(prompt_len + len(ids)) % size)
        first_block = prompt_len // size
        steps = [((prompt_len + k) // size - first_block) * self.steps_per_block
                 + (prompt_len + k) % size * self.steps_per_block // size
                 for k in range(len(ids) + len(tail))]
        return Generation(ids, steps[:len(ids)], stopped, tail, steps[len(ids):])
