"""Structural augmentation: KernelBench-format tasks taken from real LLM blocks (attention,
MLP, normalisation + projection) at shapes of real model configs, and the kernel authors
that write candidate solutions for them (built-in templates, an OpenAI-compatible endpoint,
or a local transformers model). The `augment` stage verifies every candidate with the
harness and keeps the first one per task that is correct and fast enough."""

from .tasks import FAMILIES, Task, generate_tasks

__all__ = ["FAMILIES", "Task", "generate_tasks"]
