"""Memory plans of a device job's checks, and whose an out-of-memory error is.

The checks keep copies beside the two programs' own inputs and outputs: a pristine input
set (the mutation check compares against it), the reference's output (every comparison),
the first candidate output while the second call runs (the cached-output check), and the
previous trial's outputs (whether the reference's answer moved between draws, and whether
the candidate's did too). Each plan says where those copies live:

  device   all on the device (the default: no transfer);
  host     in host memory: the device holds one input set, the outputs of the call
           running and the first candidate output; comparisons stream blocks from the host.
           The cached-output check across trials (the same storage returned as the previous
           trial's output) needs that output alive on the device: skipped;
  leanest  as `host`, and the first candidate output is dropped once compared, so the
           device holds one input set and the output of the call running; the cached-output
           check within a trial is skipped too.

An out-of-memory error is classified by where it was raised: in the reference's own draw or
call, in the candidate's own call, or in one of the harness's steps (a copy, a comparison).
Any of them sends the check to the next plan; in the leanest plan the candidate is blamed
only for its own call, and anything else means the reference alone cannot be checked on
this device (trials.HarnessLimited: the task, not the candidate).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MemoryPlan:
    name: str
    keep_on_device: bool  # pristine inputs, the reference's output, the previous outputs
    within_trial_address_check: bool  # the first candidate output alive while the second runs
    cross_trial_address_check: bool  # the previous trial's candidate output alive on the device


PLANS = (
    MemoryPlan("device", True, True, True),
    MemoryPlan("host", False, True, False),
    MemoryPlan("leanest", False, False, False),
)
# KernelBench's own trials keep nothing but the reference's output beside the call.
KERNELBENCH_PLANS = PLANS[:2]

_MESSAGES = ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED",
             "can't allocate memory")


class ReferenceOutOfMemory(Exception):
    """The reference's own draw (`get_inputs`) or call ran out of memory."""


class CandidateOutOfMemory(Exception):
    """The candidate's own call ran out of memory."""


def is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in _MESSAGES)


def short_of_memory(exc: BaseException) -> bool:
    """Any out-of-memory error, classified by `whose` or not yet."""
    return isinstance(exc, (ReferenceOutOfMemory, CandidateOutOfMemory)) or is_out_of_memory(exc)


def whose(exc: BaseException) -> str:
    """"reference", "candidate" or "harness": which step an out-of-memory error came from."""
    if isinstance(exc, ReferenceOutOfMemory):
        return "reference"
    if isinstance(exc, CandidateOutOfMemory):
        return "candidate"
    return "harness"


def guarded_call(who: str, fn, *args):
    """fn(*args), an out-of-memory error in it re-raised as `who`'s."""
    try:
        return fn(*args)
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        kind = ReferenceOutOfMemory if who == "reference" else CandidateOutOfMemory
        raise kind(f"{who}: {str(exc).strip()[:500]}") from None


def free_memory(device: str) -> None:
    """What the abandoned attempt held, given back before the next plan runs."""
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def skipped_checks(plan: MemoryPlan) -> list[str]:
    skipped = []
    if not plan.cross_trial_address_check:
        skipped.append("the cached-output check across trials")
    if not plan.within_trial_address_check:
        skipped.append("the cached-output check within a trial")
    return skipped


def plan_note(plan: MemoryPlan, reasons: list[str]) -> str:
    """What a row says when its strict trials ran in a leaner plan (empty for `device`)."""
    if plan.keep_on_device:
        return ""
    skipped = " and ".join(skipped_checks(plan))
    return (f"[strict trials in memory plan {plan.name!r}, the device being short of room "
            f"({'; '.join(reasons)}): {skipped} skipped]")
