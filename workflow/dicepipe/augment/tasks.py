"""The task list: every family at every (model config x batch size x sequence length), with
duplicates (configs whose shapes coincide, as they do after the cpu shrink) removed.

Order and ids are deterministic functions of params.yaml: families interleave round-robin
(so a `max_tasks` limit still covers every family), and within a family the shapes come in
an order shuffled by `augment.seed`, so a small limit still spans configs and sizes."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from .families import FAMILIES, applies, reference_program, relevant_dims
from .shapes import BlockShape, resolve_shape


@dataclass(frozen=True)
class Task:
    task_id: str  # "{family}__{config}__b{batch}_s{seq}"
    family: str
    config: str
    backend: str
    level: int
    shape: BlockShape
    reference_code: str

    @property
    def shape_json(self) -> str:
        return json.dumps(relevant_dims(self.family, self.shape), sort_keys=True)


def _family_tasks(family: str, settings: dict, backend: str) -> list[Task]:
    tasks, seen = [], set()
    for config_name, config in settings["model_configs"].items():
        for batch in settings["batch_sizes"]:
            for seq in settings["seq_lens"]:
                shape = resolve_shape(config, batch, seq, backend, settings["cpu_shrink"])
                if not applies(family, shape):
                    continue
                key = tuple(sorted(relevant_dims(family, shape).items()))
                if key in seen:
                    continue
                seen.add(key)
                tasks.append(Task(
                    task_id=f"{family}__{config_name}__b{shape.batch}_s{shape.seq}",
                    family=family,
                    config=config_name,
                    backend=backend,
                    level=FAMILIES[family].level,
                    shape=shape,
                    reference_code=reference_program(family, shape, config_name),
                ))
    return tasks


def generate_tasks(settings: dict, backend: str) -> list[Task]:
    """All tasks of the `augment` settings for `backend`, in their fixed order, cut to the
    backend's `max_tasks` (0 or absent: no limit)."""
    per_family = []
    for family in settings["families"]:
        tasks = _family_tasks(family, settings, backend)
        random.Random(f"{settings['seed']}:{family}").shuffle(tasks)
        per_family.append(tasks)
    ordered = []
    for rank in range(max((len(t) for t in per_family), default=0)):
        ordered.extend(tasks[rank] for tasks in per_family if rank < len(tasks))
    limit = settings.get("max_tasks", {}).get(backend, 0)
    return ordered[:limit] if limit else ordered
