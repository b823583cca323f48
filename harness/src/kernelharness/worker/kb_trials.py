"""KernelBench's own correctness trials, run inside the device worker beside the strict ones.

What KernelBench 423217d's `run_and_check_correctness` does, measured so that any protocol
built on it (`kernelbench`, `kernelbench_v0`, `release_reward`: the pipeline's
dicepipe/judgement.py) can be judged later from the row alone:
- trial seeds: `torch.manual_seed(42)`, then one `torch.randint(0, 2**32 - 1)` per trial;
- per trial: seed, draw `get_inputs()` as the task file draws them (on the CPU), move them to
  the device, run the reference first, then the candidate on the same (uncloned) tensors;
- compare with `torch.allclose(output, output_new, atol=t, rtol=t)`: the row keeps, per
  trial, the smallest t at which that holds (`correctness.allclose_tolerance`), so the
  tolerance is chosen by the protocol, not here;
- a shape mismatch or a candidate that raises ends the trials (KernelBench returns there);
  other mismatches do not.

Where this departs from KernelBench, on purpose (DESIGN.md, "One verdict, protocols as data"):
- inputs keep their dtype: KernelBench casts every input tensor to the run precision
  (fp32), which breaks tasks with integer index inputs; that is its defect, not copied;
- the candidate starts from the trial seed as the reference did: KernelBench hands it the
  RNG state the reference left, so no task that samples (dropout, bernoulli, multinomial)
  can pass there whatever the kernel does;
- a task whose reference raises on its own as-drawn inputs is the task's failure
  (`ReferenceFailed`), not the candidate's.
"""

from __future__ import annotations

import math

import torch

from . import correctness as C
from . import memory_plans as M
from .trials import HarnessLimited
from .trials import sync as _sync

KERNELBENCH_SEED = 42  # eval_kernel_against_ref(seed_num=42): model weights and trial seeds


def trial_seeds(count: int, seed: int = KERNELBENCH_SEED) -> list[int]:
    """KernelBench's per-trial seeds (drawn from the global generator, as it does)."""
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        return [int(torch.randint(0, 2**32 - 1, (1,)).item()) for _ in range(count)]
    finally:
        torch.random.set_rng_state(state)


def run_kernelbench_trials(get_inputs, ref_model, cand_model, count: int, device: str,
                           record: list, on_reference_error) -> None:
    """Append one tolerance per trial to `record` (in place, so a job that dies mid-way
    keeps the trials that ran). `on_reference_error(exc)` is raised when the reference
    fails on its own inputs; a candidate error is the trial's failure (+inf) and ends the
    trials, re-raised only when it may have broken the CUDA context.

    Memory: the trials hold what KernelBench's hold (one input set, the reference's output
    and the candidate's). An out-of-memory error anywhere starts them again with the
    reference's output kept in host memory (memory_plans.KERNELBENCH_PLANS); there, the
    candidate's own call running out is its failure, as any error of its call is, and
    anything else means the reference alone cannot be checked here (HarnessLimited)."""
    for index, plan in enumerate(M.KERNELBENCH_PLANS):
        record.clear()
        try:
            _trials(get_inputs, ref_model, cand_model, count, device, record,
                    on_reference_error, plan, last=index == len(M.KERNELBENCH_PLANS) - 1)
            return
        except Exception as exc:  # noqa: BLE001 - all but running short re-raised
            if not M.short_of_memory(exc):
                raise
            step, text = M.whose(exc), str(exc)[:500]
        M.free_memory(device)
        if index == len(M.KERNELBENCH_PLANS) - 1:
            raise HarnessLimited(
                "harness-limited: the reference alone cannot be checked within this device's "
                f"memory (KernelBench's trials: the {step} step ran out with only the "
                "reference's output kept, in host memory): " + text)


def _trials(get_inputs, ref_model, cand_model, count: int, device: str, record: list,
            on_reference_error, plan: M.MemoryPlan, last: bool) -> None:
    with torch.no_grad():
        for seed in trial_seeds(count):
            torch.manual_seed(seed)
            try:  # the task's own inputs failing is the reference's failure, as its call is
                inputs = C.to_device(list(M.guarded_call("reference", get_inputs)), device)
            except M.ReferenceOutOfMemory:
                raise
            except Exception as exc:
                if M.is_out_of_memory(exc):  # moving them to the device: the card's limit
                    raise M.ReferenceOutOfMemory(f"reference's inputs: {str(exc)[:500]}") from None
                raise on_reference_error(exc) from exc
            torch.manual_seed(seed)
            try:
                ref = M.guarded_call("reference", ref_model, *inputs)
                _sync(device)
            except M.ReferenceOutOfMemory:
                raise
            except Exception as exc:
                raise on_reference_error(exc) from exc
            if not plan.keep_on_device:
                ref = C.to_host(ref)
            torch.manual_seed(seed)
            try:
                cand = M.guarded_call("candidate", cand_model, *inputs)
                _sync(device)
            except M.CandidateOutOfMemory:
                if not last:
                    raise  # a leaner plan may give it the room
                record.append(math.inf)
                return
            except Exception:
                record.append(math.inf)
                if device == "cuda" and C.cuda_context_broken():
                    raise
                return
            record.append(C.allclose_tolerance(ref, cand))
            # KernelBench returns at a shape mismatch (and at an output without a shape,
            # whose `.shape` raises there)
            ended = not (isinstance(ref, torch.Tensor) and isinstance(cand, torch.Tensor)
                         and tuple(ref.shape) == tuple(cand.shape))
            del ref, cand, inputs
            if ended:
                return
