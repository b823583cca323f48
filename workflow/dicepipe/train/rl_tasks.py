"""RL tasks: where they come from, which ones a step takes, and their prompt ids.

Sources: the assembled splits (`rl_infill`, `rl_e2e`, `val`: parquet), or the released
stage-2 prompt file (`end_to_end_kernel_generation_4000.json`: idx, level, pytorch_code,
empty cuda_code, a `\\boxed{n}` difficulty label), whose references get the end-to-end
prompt in the wording `rl.released_prompt` names (`release`: the release rollout's own
text, chat markers included, so the task is `rendered` and tokenised as is). The reward only
needs a task's reference program.

Curriculum ("single operators first, whole models last"): tasks sorted by level, then by
the size of their reference, then id. `ramp_steps` 0 takes them in that order and wraps
around (the release's sequential_select); with ramp_steps R, step t draws from the easiest
ceil(N * (t+1) / R) tasks (at least a step's worth), least-used first, so harder tasks enter
over R steps and every task is seen about equally often afterwards. A step's tasks are a
pure function of (tasks, step, settings): a resumed run takes the same ones.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import StageInputError

PROMPT_KINDS = ("infill", "e2e")
_BOXED = re.compile(r"\\boxed\{\s*(\d+)\s*\}")


@dataclass(frozen=True)
class Task:
    task_id: str
    level: int
    reference_code: str
    prompt: str  # the user turn (rendered: the whole prompt text, chat markers included)
    rendered: bool = False

    @property
    def size(self) -> int:
        """Curriculum size proxy: non-blank lines of the reference program."""
        return sum(1 for line in self.reference_code.splitlines() if line.strip())


def curriculum_order(tasks: Sequence[Task]) -> list[Task]:
    return sorted(tasks, key=lambda t: (t.level, t.size, t.task_id))


def _tie(seed: int, step: int, task: int) -> str:
    return hashlib.sha256(f"{seed}:{step}:{task}".encode()).hexdigest()


def task_schedule(num_tasks: int, steps: int, per_step: int, ramp_steps: int, seed: int) -> list[list[int]]:
    """Indices into the curriculum order for every step (see the module docstring)."""
    if num_tasks == 0:
        return [[] for _ in range(steps)]
    if ramp_steps <= 0:
        return [[(s * per_step + i) % num_tasks for i in range(per_step)] for s in range(steps)]
    uses = [0] * num_tasks
    out = []
    for step in range(steps):
        pool = min(num_tasks, max(per_step, math.ceil(num_tasks * (step + 1) / ramp_steps)))
        ranked = sorted(range(pool), key=lambda i: (uses[i], _tie(seed, step, i)))
        chosen = [ranked[i % pool] for i in range(per_step)]
        for i in chosen:
            uses[i] += 1
        out.append(sorted(chosen))
    return out


def tasks_from_split(rows: list[dict], kind: str, backend: str) -> list[Task]:
    """Tasks from an assembled split's rows. `kind` picks the prompt: `e2e` reads `prompt`,
    `infill` reads `infill_prompt` when the rows carry one (val), else `prompt`."""
    from ..data.assemble import estimate_level

    if kind not in PROMPT_KINDS:
        raise StageInputError(f"prompt kind {kind!r}: expected one of {PROMPT_KINDS}")
    tasks = []
    for row in rows:
        prompt = row.get("infill_prompt") if kind == "infill" and "infill_prompt" in row else row["prompt"]
        if not prompt:
            continue  # a held-out reference without an infilling split
        level = row.get("level")
        tasks.append(Task(row["sample_id"], int(level) if level else estimate_level(row["reference_code"]),
                          row["reference_code"], prompt))
    return tasks


def tasks_from_released_json(path: str | Path, backend: str, wording: str = "dicepipe",
                             params: dict | None = None) -> list[Task]:
    """The released stage-2 file: a JSON list of {idx, level, pytorch_code, cuda_code,
    raw_answer}; level is the file's, the end-to-end prompt in `wording`
    (data/prompt_sources.WORDINGS; `params` names the prompt sources)."""
    from ..data.prompt_sources import released_task_prompt

    path = Path(path)
    try:
        items = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise StageInputError(f"{path}: cannot read the released prompt file ({exc}).") from exc
    if not isinstance(items, list):
        raise StageInputError(f"{path}: expected a JSON list of tasks, got {type(items).__name__}.")
    tasks = []
    for n, item in enumerate(items):
        missing = [k for k in ("idx", "level", "pytorch_code") if k not in item]
        if missing:
            raise StageInputError(f"{path}: task #{n} lacks {missing}; expected idx, level, pytorch_code "
                                  "(end_to_end_kernel_generation_4000.json format).")
        prompt, rendered = released_task_prompt(wording, params or {}, item["pytorch_code"], backend)
        tasks.append(Task(f"released-{item['idx']}", int(item["level"]), item["pytorch_code"],
                          prompt, rendered))
    return tasks


def released_difficulty(raw_answer: str) -> int | None:
    """The `\\boxed{n}` difficulty label of a released task (None if absent)."""
    match = _BOXED.search(raw_answer or "")
    return int(match.group(1)) if match else None


@dataclass
class EncodedTasks:
    tasks: list[Task]  # curriculum order, prompts within the limit
    prompt_ids: list[list[int]]
    dropped: int  # prompts longer than max_prompt_tokens


def encode_tasks(tasks: Sequence[Task], tokenizer, max_prompt_tokens: int) -> EncodedTasks:
    """Render each task's prompt to ids (the project's one chat rendering; a `rendered` prompt
    is tokenised as is, as the release's rollout engine does), drop those over
    `max_prompt_tokens` (counted, as the release drops them), curriculum order."""
    from ..model.tokenizer import encode_prompts, encode_text

    ordered = curriculum_order(tasks)
    chat = encode_prompts(tokenizer, None, [t.prompt for t in ordered if not t.rendered])[::-1]
    ids = [encode_text(tokenizer, t.prompt) if t.rendered else chat.pop() for t in ordered]
    kept = [(t, i) for t, i in zip(ordered, ids) if len(i) <= max_prompt_tokens]
    return EncodedTasks([t for t, _ in kept], [i for _, i in kept], len(ordered) - len(kept))
