"""Rewards and advantages for the RL stages.

A reward is any callable `reward(rollouts) -> list[float]` handed to the trainer from
outside (as trl's GRPO takes reward functions): the stages pass `KernelReward`, tests pass
toy ones. `KernelReward` scores the extracted code through one harness session that lives
for the whole stage: 1 when the kernel compiled and is correct under a tolerance protocol
(robust verdict: a deceptive kernel earns 0), plus an optional bounded latency term.
"""

from __future__ import annotations

import ast
import functools
import math
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import KW_ONLY, dataclass, field

import torch

from kernelharness.static_checks import static_flags
from ..judgement import is_correct
from .rl_tasks import Task


@dataclass
class Rollout:
    task: Task
    group: int  # index of its group within the step
    prompt_ids: list[int]
    token_ids: list[int]  # every committed token (Generation.trace_ids)
    steps: list[int]
    text: str  # decoded text (through the stop token)
    text_len: int  # tokens of the text (the rest of the last block follows)
    stopped: bool
    code: str | None = None  # extracted: the first fenced block
    reward: float = 0.0
    info: dict = field(default_factory=dict)


Reward = Callable[[Sequence[Rollout]], list[float]]


def latency_bonus(speedup_low: float | None, cap_speedup: float) -> float:
    """In [0, 1]: log(speedup_low) / log(cap) clipped, the lower end of the harness's
    speedup interval, so a kernel earns it only when faster with confidence and noise near
    1.0x earns nothing; `cap_speedup` and above earn 1."""
    if speedup_low is None or not math.isfinite(speedup_low) or speedup_low <= 1.0:
        return 0.0
    return min(1.0, math.log(speedup_low) / math.log(cap_speedup))


@dataclass(eq=False)
class KernelReward:
    """1 for compiled and correct (verdict under `protocol`, robust if asked) + latency_weight
    x latency_bonus. Speed is measured only when latency_weight > 0.

    `submit(rollouts)` starts scoring and returns at once (a future of the rewards): the
    rollouts' jobs join the session's stream, so their builds start while the next chunk
    decodes and never wait for an earlier chunk's slowest build. Rejections that need no
    build cost none: no code, a file that does not parse (it cannot load), and, under the
    robust verdict, a static deception flag (the row would carry it, so the verdict is 0
    whatever the run); identical kernels are measured once per session."""

    session: object
    protocol: object
    _: KW_ONLY
    robust: bool
    backend: str
    latency_weight: float
    latency_cap_speedup: float
    calls: int = field(default=0, init=False)
    skipped: int = field(default=0, init=False)  # rollouts rejected before any job

    def __call__(self, rollouts: Sequence[Rollout]) -> list[float]:
        return self.submit(rollouts).result()

    def submit(self, rollouts: Sequence[Rollout]) -> Future:
        from kernelharness import Job

        self.calls += 1
        rollouts = list(rollouts)
        rewards = [0.0] * len(rollouts)
        scored = []
        for i, r in enumerate(rollouts):
            reason = self.rejected_before_build(r.code)
            if reason is None:
                scored.append(i)
            else:
                self.skipped += 1
                r.info = {"compiled": False, "correct": False, "rejected": reason}
        jobs = [Job(f"r{self.calls}-{i}", rollouts[i].task.reference_code, rollouts[i].code, self.backend)
                for i in scored]
        futures = self.session.submit(jobs, measure_speed=self.latency_weight > 0) if jobs else []

        def score(i: int, row: dict) -> None:
            correct = is_correct(row, self.protocol, self.robust)
            bonus = latency_bonus(row.get("speedup_low"), self.latency_cap_speedup) if correct else 0.0
            rewards[i] = float(correct) + self.latency_weight * bonus
            rollouts[i].info = {"compiled": bool(row.get("compiled")), "correct": correct}

        return when_all(dict(zip(scored, futures)), score, lambda: rewards)

    def rejected_before_build(self, code: str | None) -> str | None:
        """Why a rollout earns 0 with no build or run (None: it needs the harness)."""
        if code is None:
            return "no_code"
        try:
            ast.parse(code)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return "not_compiled"
        if self.robust and any(v for k, v in static_flags(code, self.backend).items()
                               if k.startswith("flag_")):
            return "flagged"
        return None


def when_all(futures: dict, each: Callable, result: Callable) -> Future:
    """A future of `result()`, resolved once every one of `futures` ({key: future}) is done
    and `each(key, value)` has run for it, in the thread that finished it; the first error
    (of a future or of `each`) instead, if any."""
    out: Future = Future()
    left = [len(futures)]
    lock = threading.Lock()

    def done(key, future: Future) -> None:
        try:
            each(key, future.result())
        except BaseException as exc:
            with lock:
                if not out.done():
                    out.set_exception(exc)
            return
        with lock:
            left[0] -= 1
            if left[0] == 0 and not out.done():
                out.set_result(result())

    if not futures:
        out.set_result(result())
    for key, future in futures.items():
        future.add_done_callback(functools.partial(done, key))
    return out


def group_advantages(rewards: Sequence[float], group_size: int) -> tuple[list[float], list[bool]]:
    """Per rollout (r - group mean) / group population std, and per group whether it is kept
    (groups whose rewards are all equal carry no signal and are dropped; their advantages 0)."""
    if len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards do not split into groups of {group_size}")
    values = torch.tensor(rewards, dtype=torch.float64).view(-1, group_size)
    mean = values.mean(dim=1, keepdim=True)
    std = values.std(dim=1, unbiased=False, keepdim=True)
    kept = (values.max(dim=1).values > values.min(dim=1).values)
    adv = torch.where(kept[:, None], (values - mean) / std.clamp(min=1e-12), torch.zeros_like(values))
    return adv.flatten().tolist(), kept.tolist()
