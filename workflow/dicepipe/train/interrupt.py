"""SIGTERM during training: finish the step, save a checkpoint, stop.

A scheduler ends a job at its time limit with SIGTERM and, a grace time later (SLURM's
KillWait, 30 s by default), SIGKILL; `kill <pid>` sends SIGTERM too. The training loops
ask at every step boundary whether the signal came (on any rank: all ranks must save the
same step, so the flag is summed across them), save a checkpoint there and exit with
128 + 15; the stage re-run resumes from it. A step longer than the grace time loses what
it did since the last periodic checkpoint (`save_every_steps`), as a SIGKILL does.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Self

import torch

from .parallel import DistEnv, all_reduce_sum

log = logging.getLogger(__name__)
EXIT_CODE = 128 + signal.SIGTERM


class Terminated(SystemExit):
    """Raised after the checkpoint of a SIGTERM is saved; exits the stage with EXIT_CODE."""

    def __init__(self):
        super().__init__(EXIT_CODE)


class StopOnSigterm:
    """Context for a training loop: while inside, SIGTERM only sets a flag."""

    def __init__(self, env: DistEnv):
        self.env = env
        self.received = False
        self._previous = None

    def _handle(self, signum, frame) -> None:
        if not self.received:
            log.warning("SIGTERM received: the stage saves a checkpoint after this step and stops")
        self.received = True

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)

    def requested(self) -> bool:
        """Whether any rank received SIGTERM (collective when there are several ranks)."""
        if not self.env.distributed:
            return self.received
        flag = torch.tensor([1.0 if self.received else 0.0], device=self.env.device)
        return bool(all_reduce_sum(flag, self.env).item() > 0)

    def stop(self, step: int, work_dir) -> Terminated:
        log.error("stopped by SIGTERM after step %d: checkpoint saved in %s; the stage resumes "
                  "from it when run again", step, work_dir)
        return Terminated()
