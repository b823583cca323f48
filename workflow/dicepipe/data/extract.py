"""Pure functions that pull code out of model text and check its shape.

Extraction follows the released recipe: code is the first fenced block of a response, with
its language tag stripped. A reference program inside a prompt is the last fenced block that
defines `class Model` (a KernelBench one-shot prompt shows an example pair first)."""

from __future__ import annotations

import ast
import hashlib
import re

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[ \t]*\n(.*?)```", re.DOTALL)
_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)


def fenced_blocks(text: str) -> list[str]:
    """Every fenced block's body, in order, language tag dropped."""
    return [m.group(2) for m in _FENCE.finditer(text or "")]


def pick_block(text: str, rule: str = "first") -> str | None:
    blocks = fenced_blocks(text)
    if not blocks:
        return None
    if rule == "first":
        return blocks[0]
    if rule == "last":
        return blocks[-1]
    if rule == "longest":
        return max(blocks, key=len)
    raise ValueError(f"unknown code block rule {rule!r}")


def code_from_text(text: str, rule: str = "first", *, normalise: bool = True) -> str | None:
    """The kernel file a model's answer holds: the fenced block `rule` picks, None when there
    is none or it is blank; normalised (normalise_code) unless asked not to (RL scores the
    block as written, as the release does). The one extractor of generated code: evaluation,
    the augment authors and RL rollouts call it."""
    code = pick_block(text, rule)
    if not code or not code.strip():
        return None
    return normalise_code(code) if normalise else code


def reference_from_prompt(prompt: str) -> str | None:
    """The last fenced block that defines `class Model` but not `class ModelNew`."""
    for block in reversed(fenced_blocks(prompt)):
        if defines_class(block, "Model") and not defines_class(block, "ModelNew"):
            return block
    return None


def reasoning_from_response(response: str) -> str | None:
    match = _THINK.search(response or "")
    return match.group(1).strip() if match else None


def defines_class(code: str, name: str) -> bool:
    return re.search(rf"^class\s+{re.escape(name)}\s*[(:]", code or "", re.MULTILINE) is not None


def is_valid_python(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


def normalise_code(code: str) -> str:
    """Strip trailing whitespace per line and surrounding blank lines; end with one newline."""
    lines = [line.rstrip() for line in (code or "").replace("\r\n", "\n").split("\n")]
    return "\n".join(lines).strip("\n") + "\n"


def sample_id(reference_code: str, candidate_code: str) -> str:
    digest = hashlib.sha256()
    digest.update(normalise_code(reference_code).encode())
    digest.update(b"\0")
    digest.update(normalise_code(candidate_code).encode())
    return digest.hexdigest()[:16]
