"""Correctness trials of a device job: the reference first, then the candidate twice.

Per trial, fresh inputs are drawn and one distribution variant applied. Which variants the
reference accepts is found before any candidate runs (`probe_reference`, in a worker that a
device-side assert may break and that is then replaced): a variant it rejects (raises, or
answers with non-finite values) is not a valid input of the task, and the trial uses the
as-drawn inputs instead, so the candidate never sees it.
The reference's outputs then stay alive, every free block the allocator holds is scrubbed
(see `correctness.scrub_free_memory`), and the candidate runs twice on fresh clones: a
candidate that allocates an output and leaves it unwritten finds no reference result in it.

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


class ReferenceFailed(Exception):
    """The reference raised on as-drawn inputs: the task, not the candidate, is broken."""


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _reference_first(ref_model, base: list, seed: int, variant: str, call_seed: int,
                     device: str):
    """(inputs, reference output, the reference's own input copy, variant actually run)."""
    for name in dict.fromkeys((variant, "as_drawn")):
        try:
            inputs = C.apply_variant(base, name, seed)
        except Exception:  # no memory for the transformed copy: the as-drawn inputs then
            if name == "as_drawn":
                raise
            continue
        ref_in = C.clone_args(inputs)
        torch.manual_seed(call_seed)
        try:
            ref = ref_model(*ref_in)
            sync(device)
        except Exception as exc:
            if name == "as_drawn":
                raise ReferenceFailed("reference failed on as-drawn inputs: " +
                                      "".join(traceback.format_exception(exc))[-2000:])
            continue
        if name == "as_drawn" or C.all_finite(ref):
            return inputs, ref, ref_in, name
        del ref, ref_in
    raise AssertionError("unreachable: as_drawn always returns")


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
            try:
                inputs = C.apply_variant(C.draw_inputs(get_inputs, trial_seed, device),
                                         variant, trial_seed)
                torch.manual_seed(trial_seed * 7 + 3)
                ref = ref_model(*C.clone_args(inputs))
                sync(device)
                ok = C.all_finite(ref)
                del ref, inputs
            except Exception:
                if device == "cuda" and C.cuda_context_broken():
                    return {"plan": plan, "fatal_trial": trial}
                ok = False
            plan.append(variant if ok else "as_drawn")
    return {"plan": plan, "fatal_trial": None}


def run_trial(get_inputs, ref_model, cand_model, seed: int, variant: str, device: str) -> dict:
    try:
        base = C.draw_inputs(get_inputs, seed, device)
    except torch.cuda.OutOfMemoryError:
        raise  # the card's limit, not the reference's fault
    except Exception as exc:  # the task's own inputs failing: the reference's failure
        raise ReferenceFailed("reference failed drawing its inputs (get_inputs): " +
                              "".join(traceback.format_exception(exc))[-2000:]) from exc
    call_seed = seed * 7 + 3
    inputs, ref, ref_in, variant = _reference_first(ref_model, base, seed, variant, call_seed,
                                                    device)
    del base
    C.scrub_free_memory(device)
    cand_in1 = C.clone_args(inputs)
    torch.manual_seed(call_seed)
    cand1 = cand_model(*cand_in1)
    sync(device)
    cand_in2 = C.clone_args(inputs)
    torch.manual_seed(call_seed)
    cand2 = cand_model(*cand_in2)
    sync(device)
    ref_mutates = not C.same_values(ref_in, inputs)
    ref_aliases = C.shares_memory(ref, ref_in)
    flags = {
        "flag_input_mutation": not ref_mutates and not (C.same_values(cand_in1, inputs) and
                                                        C.same_values(cand_in2, inputs)),
        "flag_output_alias": not ref_aliases and (C.shares_memory(cand1, cand_in1) or
                                                  C.shares_memory(cand2, cand_in2)),
        "flag_output_cached": C.shares_memory(cand2, cand1),
    }
    t1, err1, reason1 = C.compare(ref, cand1)
    t2, err2, reason2 = C.compare(ref, cand2)
    return {"tolerance": max(t1, t2), "max_err": max(err1, err2),
            "reason": reason1 if t1 >= t2 else reason2, "variant": variant, "flags": flags,
            "ref": ref, "cand": cand2}


def check_correctness(get_inputs, ref_model, cand_model, seed: int, settings: dict,
                      device: str, plan: list[str] | None = None) -> dict:
    """The strict trials. `plan`: the variant each trial uses, from `probe_reference`
    (variants the reference rejected are "as_drawn" there); without one, each trial's
    variant is tried and a rejection falls back as it happens."""
    flags = {"flag_input_mutation": False, "flag_output_alias": False,
             "flag_output_cached": False, "flag_input_insensitive": False}
    max_tolerance = float(settings["max_tolerance"])
    trials = settings["correct_trials"]
    result = {"correct": False, "correct_trials_passed": 0, "max_abs_error": 0.0,
              "tolerance_needed": 0.0, "variants_run": [], "output_precision": None}
    first_failure = None
    reference_moved = False
    previous = None  # (reference output, candidate output) of the last trial, kept alive
    with torch.no_grad():
        for trial in range(trials):
            variant = plan[trial] if plan and trial < len(plan) else trial_variant(trial)
            outcome = run_trial(get_inputs, ref_model, cand_model, seed + 1 + trial, variant,
                                device)
            result["variants_run"].append(outcome["variant"])
            if result["output_precision"] is None:
                result["output_precision"] = C.output_precision(outcome["ref"])
            for name in flags:
                flags[name] |= outcome["flags"].get(name, False)
            if previous is not None:
                if C.shares_memory(outcome["cand"], previous[1]):
                    flags["flag_output_cached"] = True  # (values then say nothing more)
                elif C.outputs_changed(previous[0], outcome["ref"]):
                    reference_moved = True
                    if C.same_values(previous[1], outcome["cand"]):
                        flags["flag_input_insensitive"] = True
            result["max_abs_error"] = max(result["max_abs_error"], outcome["max_err"])
            result["tolerance_needed"] = max(result["tolerance_needed"], outcome["tolerance"])
            if C.within_max_tolerance(outcome["tolerance"], settings):
                result["correct_trials_passed"] += 1
            elif first_failure is None:
                first_failure = f"trial {trial} ({outcome['variant']}): {outcome['reason']}"
            previous = (outcome["ref"], outcome["cand"])
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
                      device: str, varied: bool = True) -> bool:
    """Right again on inputs drawn after timing (a candidate that changes its answer after
    many calls, or that caches by call count, fails here). `varied`: also on the `normal`
    variant (for kernels that passed the varied trials before timing, on references whose
    probe accepted that variant)."""
    checks = ((50_000, "as_drawn"), (50_001, "normal")) if varied else ((50_000, "as_drawn"),)
    with torch.no_grad():
        for offset, variant in checks:
            outcome = run_trial(get_inputs, ref_model, cand_model, seed + offset, variant,
                                device)
            if not C.within_max_tolerance(outcome["tolerance"], settings):
                return False
    return True
