"""Correctness trials of a device job: the reference first, then the candidate twice.

Per trial, fresh inputs are drawn and one distribution variant applied. Which variants the
reference accepts is found before any candidate runs (`probe_reference`, in a worker that a
device-side assert may break and that is then replaced): a variant it rejects (raises, or
answers with non-finite values) is not a valid input of the task, and the trial uses the
as-drawn inputs instead, so the candidate never sees it.
The reference's outputs then stay alive, every free block the allocator holds is scrubbed
(see `correctness.scrub_free_memory`), and the candidate runs twice on fresh clones: a
candidate that allocates an output and leaves it unwritten finds no reference result in it.

Memory: each copy is freed as soon as its checks are done, and the copies the checks keep
live where the trials' memory plan says (memory_plans.py): on the device by default, in host
memory in the leaner plans an out-of-memory error falls back to. Only the candidate's own
call running out in the leanest plan is the candidate's failure.

Every trial runs (no stop at the first mismatch), so the row can carry the smallest
tolerance at which all of them pass (`tolerance_needed`); `correct` is that tolerance being
within `max_tolerance`. Non-floating outputs compare exactly, in the comparison and in the
dynamic checks alike.
"""

from __future__ import annotations

import math
import traceback

import torch

from . import correctness as C
from . import memory_plans as M


class ReferenceFailed(Exception):
    """The reference raised on as-drawn inputs: the task, not the candidate, is broken."""


class HarnessLimited(ReferenceFailed):
    """The reference alone cannot be checked within this device's memory, in the leanest
    plan: the task is left out of every count, as a failing reference is."""


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _draw(get_inputs, seed: int, device: str) -> list:
    try:
        return C.draw_inputs(get_inputs, seed, device)
    except Exception as exc:
        if M.is_out_of_memory(exc):  # the card's limit, not the reference's fault
            raise M.ReferenceOutOfMemory(f"reference's inputs: {str(exc)[:500]}") from None
        # the task's own inputs failing: the reference's failure
        raise ReferenceFailed("reference failed drawing its inputs (get_inputs): " +
                              "".join(traceback.format_exception(exc))[-2000:]) from exc


def _call_inputs(kept: list, device: str, plan: M.MemoryPlan) -> list:
    """A fresh copy of the pristine inputs for one call, on the device."""
    if plan.keep_on_device:
        return C.clone_args(kept)
    return C.device_copy(kept, device)


def _reference_first(get_inputs, ref_model, seed: int, variant: str, call_seed: int,
                     device: str, plan: M.MemoryPlan):
    """(pristine inputs, reference output, the reference's own input copy, variant actually
    run). The inputs are drawn here and the variant applied in place (nothing else holds
    them); a rejected variant falls back to the as-drawn inputs, drawn again (the same
    values: the same seed). In the leaner plans the pristine inputs are kept in host memory
    and the reference runs on a device copy of them."""
    shared = C.module_tensors(get_inputs)
    for name in dict.fromkeys((variant, "as_drawn")):
        base = _draw(get_inputs, seed, device)
        try:
            inputs = C.apply_variant(base, name, seed, in_place=True, shared=shared)
        except Exception as exc:
            if M.is_out_of_memory(exc) or name == "as_drawn":
                raise  # a harness step short of memory: the next plan
            continue
        base = None  # written over (or left for `inputs`): a fallback draws again
        if plan.keep_on_device:
            kept, ref_in = inputs, C.clone_args(inputs)
        else:
            kept = C.to_host(inputs)
            del inputs
            ref_in = C.device_copy(kept, device)
        torch.manual_seed(call_seed)
        try:
            ref = M.guarded_call("reference", ref_model, *ref_in)
            sync(device)
        except M.ReferenceOutOfMemory:
            raise
        except Exception as exc:
            if name == "as_drawn":
                raise ReferenceFailed("reference failed on as-drawn inputs: " +
                                      "".join(traceback.format_exception(exc))[-2000:])
            continue
        if name == "as_drawn" or C.all_finite(ref):
            return kept, ref, ref_in, name
        del ref, ref_in, kept
    raise AssertionError("unreachable: as_drawn always returns")


class TrialMemory:
    """What a trial leaves for the next: the reference's and the candidate's outputs (on the
    device in the `device` plan, else in host memory)."""

    def __init__(self):
        self.ref = None
        self.cand = None


def trial_variant(trial: int) -> str:
    return C.VARIANTS[trial % len(C.VARIANTS)]


def probe_reference(get_inputs, ref_model, seed: int, trials: int, device: str,
                    plan: list[str]) -> dict:
    """Which variant each strict trial can use, found with the reference alone, before any
    candidate runs (device_job.run_probe): the trial's own inputs under its variant, the
    reference's call as the trial makes it; a variant it rejects (raises, or answers with
    non-finite values) becomes "as_drawn" in the plan. Appends to `plan` from its length
    on. A CUDA error that breaks the context (a device-side assert on negative indices, say)
    stops the probe: `fatal_trial` names the trial, and the orchestrator marks it rejected
    and goes on from the next one on a fresh worker, so no candidate's process ever sees
    that error."""
    with torch.no_grad():
        for trial in range(len(plan), trials):
            variant = trial_variant(trial)
            if variant == "as_drawn":
                plan.append(variant)
                continue
            trial_seed = seed + 1 + trial
            short = False
            try:
                inputs = C.apply_variant(C.draw_inputs(get_inputs, trial_seed, device),
                                         variant, trial_seed, in_place=True,
                                         shared=C.module_tensors(get_inputs))
                args = C.clone_args(inputs)  # the reference's call as the trial makes it
                del inputs
                torch.manual_seed(trial_seed * 7 + 3)
                ref = ref_model(*args)
                sync(device)
                ok = C.all_finite(ref)
                del ref, args
            except Exception as exc:
                if device == "cuda" and C.cuda_context_broken():
                    return {"plan": plan, "fatal_trial": trial}
                # short of memory says nothing about the variant: the trials, with their
                # leaner memory plans, find out (a rejection there falls back as it happens)
                ok = short = M.is_out_of_memory(exc)
            if short:
                M.free_memory(device)  # what the failed attempt held (outside its handler)
            plan.append(variant if ok else "as_drawn")
    return {"plan": plan, "fatal_trial": None}


def run_trial(get_inputs, ref_model, cand_model, seed: int, variant: str, device: str,
              plan: M.MemoryPlan = M.PLANS[0], previous: TrialMemory | None = None) -> dict:
    """One strict trial: the reference, then the candidate twice on fresh copies of the same
    inputs. Each copy is compared and freed as soon as its checks are done, so the device
    holds at most two input sets (the pristine one, the call's) and three outputs (the
    reference's and both candidate calls') in the `device` plan, and in the leaner plans one
    input set and two or one outputs (see memory_plans.py). `previous` carries the last
    trial's outputs; the reference's are compared (did its answer move?) right after its
    call and dropped, the candidate's with the first call of this trial."""
    call_seed = seed * 7 + 3
    kept, ref, ref_in, variant = _reference_first(get_inputs, ref_model, seed, variant,
                                                  call_seed, device, plan)
    ref_mutates = not C.same_values(ref_in, kept)
    ref_aliases = C.shares_memory(ref, ref_in)
    del ref_in
    moved = None
    if previous is not None and previous.ref is not None:
        moved = C.outputs_changed(previous.ref, ref)
        previous.ref = None
    if not plan.keep_on_device:
        ref = C.to_host(ref)
    C.scrub_free_memory(device)

    def candidate_call():
        cand_in = _call_inputs(kept, device, plan)
        torch.manual_seed(call_seed)
        cand = M.guarded_call("candidate", cand_model, *cand_in)
        sync(device)
        mutated = not C.same_values(cand_in, kept)
        aliased = C.shares_memory(cand, cand_in)
        del cand_in
        return cand, mutated, aliased, C.compare(ref, cand)

    cand1, mutated1, aliased1, (t1, err1, reason1) = candidate_call()
    across = {"cached": False, "same": False}
    if previous is not None and previous.cand is not None:
        across["cached"] = plan.cross_trial_address_check and C.shares_memory(cand1,
                                                                            previous.cand)
        across["same"] = (not across["cached"] and bool(moved)
                          and C.same_values(previous.cand, cand1))
        previous.cand = None
    if not plan.within_trial_address_check:
        cand1 = None  # compared: only the address check would need it now
    # what the first call's copies left in freed blocks (its inputs: on [0, 1) the answer of
    # an identity-like task) is scrubbed too, as it was kept alive before
    C.scrub_free_memory(device)
    cand2, mutated2, aliased2, (t2, err2, reason2) = candidate_call()
    flags = {
        "flag_input_mutation": not ref_mutates and (mutated1 or mutated2),
        "flag_output_alias": not ref_aliases and (aliased1 or aliased2),
        "flag_output_cached": cand1 is not None and C.shares_memory(cand2, cand1),
    }
    del cand1
    if previous is not None:
        previous.ref = ref
        previous.cand = cand2 if plan.keep_on_device else C.to_host(cand2)
    return {"tolerance": max(t1, t2), "max_err": max(err1, err2),
            "reason": reason1 if t1 >= t2 else reason2, "variant": variant, "flags": flags,
            "ref": ref, "moved": moved, "across": across}


def check_correctness(get_inputs, ref_model, cand_model, seed: int, settings: dict,
                      device: str, plan: list[str] | None = None) -> dict:
    """The strict trials. `plan`: the variant each trial uses, from `probe_reference`
    (variants the reference rejected are "as_drawn" there); without one, each trial's
    variant is tried and a rejection falls back as it happens.

    Memory: the trials run in the `device` memory plan; an out-of-memory error anywhere in
    them starts them again in the next, leaner plan (memory_plans.py; flags already found
    are kept). In the leanest plan an error in the candidate's own call is the candidate's
    failure, and any other means the reference alone cannot be checked here
    (HarnessLimited). The result's `memory_plan` names the plan the trials ran in and
    `memory_note` what that plan skipped (empty for `device`)."""
    found = {"flag_input_mutation": False, "flag_output_alias": False,
             "flag_output_cached": False, "flag_input_insensitive": False}
    reasons: list[str] = []
    for index, memory_plan in enumerate(M.PLANS):
        try:
            result = _strict_trials(get_inputs, ref_model, cand_model, seed, settings, device,
                                    plan, memory_plan, found)
        except Exception as exc:  # noqa: BLE001 - all but running short re-raised
            if not M.short_of_memory(exc):
                raise
            step, text = M.whose(exc), str(exc)[:500]
        else:
            result.update(memory_plan=memory_plan.name,
                          memory_note=M.plan_note(memory_plan, reasons))
            return result
        M.free_memory(device)
        reasons.append(f"{memory_plan.name}: the {_STEP_NAMES[step]} ran short")
        if index == len(M.PLANS) - 1:
            _out_of_plans(step, text)
    raise AssertionError("unreachable: the last plan returns or raises")


_STEP_NAMES = {"reference": "reference's call", "candidate": "candidate's call",
               "harness": "harness's own copies"}


def _out_of_plans(step: str, text: str) -> None:
    """The leanest plan ran out too: whose failure that is."""
    if step == "candidate":
        raise M.CandidateOutOfMemory(
            "the candidate's own call ran out of device memory in the leanest memory plan "
            "(the device held only its inputs and the outputs of the call): " + text)
    raise HarnessLimited(
        "harness-limited: the reference alone cannot be checked within this device's "
        f"memory (the {_STEP_NAMES[step]} ran out in the leanest memory plan, where the "
        "device holds one input set and one output): " + text)


def _strict_trials(get_inputs, ref_model, cand_model, seed: int, settings: dict, device: str,
                   plan: list[str] | None, memory_plan: M.MemoryPlan, flags: dict) -> dict:
    max_tolerance = float(settings["max_tolerance"])
    trials = settings["correct_trials"]
    result = {"correct": False, "correct_trials_passed": 0, "max_abs_error": 0.0,
              "tolerance_needed": 0.0, "variants_run": [], "output_precision": None}
    first_failure = None
    reference_moved = False
    previous = TrialMemory()  # the last trial's outputs, for the checks across trials
    with torch.no_grad():
        for trial in range(trials):
            variant = plan[trial] if plan and trial < len(plan) else trial_variant(trial)
            outcome = run_trial(get_inputs, ref_model, cand_model, seed + 1 + trial, variant,
                                device, memory_plan, previous)
            result["variants_run"].append(outcome["variant"])
            if result["output_precision"] is None:
                result["output_precision"] = C.output_precision(outcome["ref"])
            for name in flags:
                flags[name] |= outcome["flags"].get(name, False)
            if outcome["moved"] is not None:
                if outcome["across"]["cached"]:
                    flags["flag_output_cached"] = True  # (values then say nothing more)
                elif outcome["moved"]:
                    reference_moved = True
                    if outcome["across"]["same"]:
                        flags["flag_input_insensitive"] = True
            result["max_abs_error"] = max(result["max_abs_error"], outcome["max_err"])
            result["tolerance_needed"] = max(result["tolerance_needed"], outcome["tolerance"])
            if C.within_max_tolerance(outcome["tolerance"], settings):
                result["correct_trials_passed"] += 1
            elif first_failure is None:
                first_failure = f"trial {trial} ({outcome['variant']}): {outcome['reason']}"
            outcome = None  # its outputs live on in `previous` only
    result["correct"] = result["correct_trials_passed"] == trials
    # a task whose reference answers the same whatever the draw (`isinf(x).all()` on finite
    # inputs) says nothing about a candidate that does too: a property of the task, no flag
    result["reference_input_insensitive"] = trials > 1 and not reference_moved
    if first_failure is not None:
        result["error"] = (f"{first_failure}; beyond max_tolerance {max_tolerance:g}"
                           if math.isfinite(result["tolerance_needed"]) else first_failure)
        result["error_phase"] = "correct"
    result.update(flags)
    return result


def post_timing_check(get_inputs, ref_model, cand_model, seed: int, settings: dict,
                      device: str, varied: bool = True, memory_plan: str = "device") -> bool:
    """Right again on inputs drawn after timing (a candidate that changes its answer after
    many calls, or that caches by call count, fails here). `varied`: also on the `normal`
    variant (for kernels that passed the varied trials before timing, on references whose
    probe accepted that variant). Runs in the memory plan the strict trials ended in, and
    leaner ones after an out-of-memory error, as they do."""
    checks = ((50_000, "as_drawn"), (50_001, "normal")) if varied else ((50_000, "as_drawn"),)
    start = [p.name for p in M.PLANS].index(memory_plan)
    with torch.no_grad():
        for offset, variant in checks:
            for index in range(start, len(M.PLANS)):
                try:
                    outcome = run_trial(get_inputs, ref_model, cand_model, seed + offset,
                                        variant, device, M.PLANS[index])
                except Exception as exc:  # noqa: BLE001 - all but running short re-raised
                    if not M.short_of_memory(exc):
                        raise
                    step, text = M.whose(exc), str(exc)[:500]
                else:
                    break
                M.free_memory(device)
                if index == len(M.PLANS) - 1:
                    _out_of_plans(step, text)
            start = index
            tolerance = outcome["tolerance"]
            outcome = None
            if not C.within_max_tolerance(tolerance, settings):
                return False
    return True
