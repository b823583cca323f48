"""One job inside a device worker: load both programs, check, time, check again.

The flow, with the phase names the orchestrator's per-phase timeouts follow:
  load     execute the reference and the candidate (extensions imported from the cache, or
           built on request by the orchestrator), build both models from the same seed;
  correct  `correct_trials` trials on fresh inputs of varied distributions; per trial the
           candidate runs first, then the reference, then the candidate again (a candidate
           that reads the reference's freed output finds nothing the first time);
  timing   up to `repeats` interleaved measurements, stopping once the interval settles;
  post     one more check on inputs drawn after timing.
Everything returned is plain data for the result row; exceptions from candidate code end the
job with its error, never the worker, except where the CUDA context may be damaged.
"""

from __future__ import annotations

import gc
import threading
import time
import traceback

import torch

from . import correctness as C
from .guards import TamperGuard
from .loader import CallCounter, exec_module, forget_module, intercept_load_inline
from .measure import run_timing
from .worker_ext import BuildFailedError, ExtensionResolver

CUDA_FATAL = ("CUDA error", "illegal memory access", "device-side assert", "CUBLAS_STATUS",
              "unspecified launch failure", "misaligned address", "an illegal instruction")


class JobFailed(Exception):
    def __init__(self, phase: str, message: str, compiled: bool, log: str | None = None):
        super().__init__(message)
        self.phase, self.compiled, self.log = phase, compiled, log


def run_job(msg: dict, ctx) -> dict:
    """Evaluate one job; returns the partial row plus worker hints (fatal, restart)."""
    counter = CallCounter()
    resolver = ExtensionResolver(ctx, counter)
    guard = TamperGuard()
    threads_before = ctx.thread_watch.started
    t0 = time.monotonic()
    row, tampered = _evaluate(msg, ctx, counter, resolver, guard)
    row["flag_runtime_tampered"] = bool(tampered)
    if tampered:
        row["error"] = ((row.get("error") or "") +
                        f" [changed at run time: {', '.join(tampered[:8])}]").strip()
    new_threads = ctx.thread_watch.started - threads_before
    row["flag_threads_dynamic"] = new_threads > 0
    row["used_keys"], row["requested_keys"] = resolver.used, resolver.requested
    if resolver.log_tail and not row.get("compile_log_tail"):
        row["compile_log_tail"] = resolver.log_tail
    row["wall_device_s"] = time.monotonic() - t0
    gc.collect()
    fatal = _context_broken(ctx.device, row.get("error"))
    if ctx.device == "cuda" and not fatal:
        torch.cuda.empty_cache()
    restart = (fatal or bool(tampered) or new_threads > 0
               or threading.active_count() > ctx.base_threads)
    return {"row": row, "fatal": fatal, "restart": restart}


def _evaluate(msg: dict, ctx, counter, resolver, guard) -> tuple[dict, list[str]]:
    settings, device = msg["settings"], ctx.device
    row: dict = {"compiled": False, "correct": False}
    tampered: list[str] = []
    names = ("reference", "candidate")  # fixed: tracebacks read the same in every run
    try:
        with intercept_load_inline(resolver.load):
            ref_mod, cand_mod = _load_programs(msg, ctx, names)
            row["compiled"] = True
            ref_model, cand_model = _build_models(ref_mod, cand_mod, msg["seed"], device)
            tampered += guard.check()
            t1 = time.monotonic()
            ctx.phase("correct", settings["run_timeout_s"])
            row.update(check_correctness(ref_mod.get_inputs, ref_model, cand_model, msg["seed"],
                                         settings, device))
            row["wall_correct_s"] = time.monotonic() - t1
            tampered += guard.check()
            if row["correct"]:
                t2 = time.monotonic()
                row.update(run_timing(ref_mod.get_inputs, ref_model, cand_model, msg["seed"],
                                      settings, device, counter, ctx))
                row["wall_timing_s"] = time.monotonic() - t2
                tampered += guard.check()
                ctx.phase("post", settings["run_timeout_s"])
                row["flag_post_timing_wrong"] = not post_timing_check(
                    ref_mod.get_inputs, ref_model, cand_model, msg["seed"], settings, device)
                tampered += guard.check()
    except JobFailed as exc:
        row.update(error=str(exc), error_phase=exc.phase, compiled=exc.compiled)
        if exc.log:
            row["compile_log_tail"] = exc.log
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        row.update(error=_format(exc), error_phase=ctx.current_phase)
    finally:
        for name in names:
            forget_module(name)
    return row, tampered


def _format(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))[-3000:]


def _load_programs(msg: dict, ctx, names: tuple[str, str]):
    ctx.phase("load", msg["settings"]["run_timeout_s"])
    try:
        ref_mod = exec_module(msg["reference_code"], names[0], ctx.job_folder)
    except BaseException as exc:
        raise JobFailed("reference", "reference program failed: " + _format(exc), compiled=False)
    for attr in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(ref_mod, attr):
            raise JobFailed("reference", f"reference program defines no {attr}", compiled=False)
    try:
        cand_mod = exec_module(msg["candidate_code"], names[1], ctx.job_folder)
    except BuildFailedError as exc:
        raise JobFailed("build", str(exc), compiled=False, log=exc.log)
    except BaseException as exc:
        raise JobFailed("load", "candidate failed to load: " + _format(exc), compiled=False)
    if not hasattr(cand_mod, "ModelNew"):
        raise JobFailed("load", "candidate defines no ModelNew", compiled=False)
    return ref_mod, cand_mod


def _build_models(ref_mod, cand_mod, seed: int, device: str):
    """Both models from the same seed, on the CPU first then moved (as KernelBench does)."""
    torch.manual_seed(seed)
    init_inputs = ref_mod.get_init_inputs()
    torch.manual_seed(seed)
    try:
        ref_model = ref_mod.Model(*init_inputs).to(device)
    except BaseException as exc:
        raise JobFailed("reference", "reference model failed to build: " + _format(exc),
                        compiled=True)
    torch.manual_seed(seed)
    try:
        cand_model = cand_mod.ModelNew(*init_inputs).to(device)
    except BuildFailedError as exc:
        raise JobFailed("build", str(exc), compiled=False, log=exc.log)
    except BaseException as exc:
        raise JobFailed("load", "ModelNew failed to build: " + _format(exc), compiled=True)
    return ref_model, cand_model


def _context_broken(device: str, error: str | None) -> bool:
    if device != "cuda":
        return False
    if error and any(marker in error for marker in CUDA_FATAL):
        return True
    try:
        torch.cuda.synchronize()
        probe = torch.ones(16, device="cuda")
        return float(probe.sum()) != 16.0
    except Exception:
        return True


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def check_correctness(get_inputs, ref_model, cand_model, seed: int, settings: dict,
                      device: str) -> dict:
    flags = {"flag_input_mutation": False, "flag_output_alias": False,
             "flag_output_cached": False, "flag_input_insensitive": False}
    result = {"correct": False, "correct_trials_passed": 0, "max_abs_error": 0.0}
    previous = None  # (reference output, candidate output) of the last trial, kept alive
    with torch.no_grad():
        for trial in range(settings["correct_trials"]):
            variant = C.VARIANTS[trial % len(C.VARIANTS)]
            outcome = run_trial(get_inputs, ref_model, cand_model, seed + 1 + trial, variant,
                                settings, device)
            for name in flags:
                flags[name] |= outcome["flags"].get(name, False)
            if previous is not None:
                if C.shares_memory(outcome["cand"], previous[1]):
                    flags["flag_output_cached"] = True  # (values then say nothing more)
                elif (C.max_relative_change(previous[0], outcome["ref"]) > 1e-5
                      and C.same_values(previous[1], outcome["cand"])):
                    flags["flag_input_insensitive"] = True
            result["max_abs_error"] = max(result["max_abs_error"], outcome["max_err"])
            if not outcome["ok"]:
                result["error"] = f"trial {trial} ({outcome['variant']}): {outcome['reason']}"
                result["error_phase"] = "correct"
                break
            result["correct_trials_passed"] += 1
            previous = (outcome["ref"], outcome["cand"])
    result["correct"] = result["correct_trials_passed"] == settings["correct_trials"]
    result.update(flags)
    return result


def run_trial(get_inputs, ref_model, cand_model, seed: int, variant: str, settings: dict,
              device: str) -> dict:
    base = C.draw_inputs(get_inputs, seed, device)
    inputs = C.apply_variant(base, variant, seed)
    call_seed = seed * 7 + 3
    cand_in1 = C.clone_args(inputs)
    torch.manual_seed(call_seed)
    cand1 = cand_model(*cand_in1)
    _sync(device)
    ref_in = C.clone_args(inputs)
    torch.manual_seed(call_seed)
    try:
        ref = ref_model(*ref_in)
        _sync(device)
        usable = C.all_finite(ref)
    except Exception:
        if variant == "as_drawn":
            raise
        usable = False
    if not usable and variant != "as_drawn":
        del cand1, cand_in1
        return run_trial(get_inputs, ref_model, cand_model, seed, "as_drawn", settings, device)
    cand_in2 = C.clone_args(inputs)
    torch.manual_seed(call_seed)
    cand2 = cand_model(*cand_in2)
    _sync(device)
    ref_mutates = not C.same_values(ref_in, inputs)
    ref_aliases = C.shares_memory(ref, ref_in)
    flags = {
        "flag_input_mutation": not ref_mutates and not (C.same_values(cand_in1, inputs) and
                                                        C.same_values(cand_in2, inputs)),
        "flag_output_alias": not ref_aliases and (C.shares_memory(cand1, cand_in1) or
                                                  C.shares_memory(cand2, cand_in2)),
        "flag_output_cached": C.shares_memory(cand2, cand1),
    }
    ok1, err1, reason1 = C.compare(ref, cand1, settings)
    ok2, err2, reason2 = C.compare(ref, cand2, settings)
    return {"ok": ok1 and ok2, "max_err": max(err1, err2), "reason": reason1 or reason2,
            "variant": variant, "flags": flags, "ref": ref, "cand": cand2}


def post_timing_check(get_inputs, ref_model, cand_model, seed: int, settings: dict,
                      device: str) -> bool:
    """Right again on inputs drawn after timing (a candidate that changes its answer after
    many calls, or that caches by call count, fails here)."""
    with torch.no_grad():
        for offset, variant in ((50_000, "as_drawn"), (50_001, "normal")):
            outcome = run_trial(get_inputs, ref_model, cand_model, seed + offset, variant,
                                settings, device)
            if not outcome["ok"]:
                return False
    return True
