"""One job inside a device worker: load both programs, check, time, check again.

The flow, with the phase names the orchestrator's per-phase timeouts follow:
  load     execute the reference and the candidate (extensions imported from the cache, or
           built on request by the orchestrator), build both models from the same seed;
  correct  KernelBench's own `kernelbench_trials` trials (kb_trials.py: as-drawn inputs,
           its seeds, the tolerance `allclose` needed per trial), then the strict ones:
           `correct_trials` trials on fresh inputs of varied distributions (trials.py), the
           reference first, then the candidate twice after the free memory is scrubbed;
           every trial runs, and the row records the tolerance they needed. Both retry in
           leaner memory plans after an out-of-memory error (memory_plans.py); a reference
           that cannot be checked even in the leanest is the task's failure (phase
           `reference`, "harness-limited"), and a leaner plan's skipped checks are noted
           in the row's error text;
  timing   (a row correct within `max_tolerance` under the check `timing_gate` names, or
           either) up to `repeats` interleaved measurements on rotating, refilled input buffers,
           stopping once the interval settles; a sample of timed candidate outputs is
           checked (measure.py): an output served from a cache makes the row incorrect and
           its timing is dropped;
  post     one more check on inputs drawn after timing.
An out-of-memory error in timing or post outside the candidate's own call (the phase's own
copies did not fit beside the calls) skips what is left, the verdict standing and the row
saying so; in the candidate's call it fails the row, as any error there does.
Everything returned is plain data for the result row; exceptions from candidate code end the
job with its error, never the worker, except where the CUDA context may be damaged.
"""

from __future__ import annotations

import gc
import threading
import time
import traceback

import torch

from . import memory_plans
from .correctness import cuda_context_broken, within_max_tolerance
from .extensions import BuildFailedError, ExtensionResolver
from .guards import TamperGuard
from .kb_trials import KERNELBENCH_SEED, run_kernelbench_trials
from .loader import CallCounter, exec_module, forget_module, intercept_load_inline
from .measure import TIMING_COLUMNS, run_timing
from .trials import (
    HarnessLimited,
    ReferenceFailed,
    check_correctness,
    post_timing_check,
    probe_reference,
)

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
    apply_backend_settings(msg["settings"])
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
            ref_model, cand_model = _build_models(ref_mod, cand_mod, device)
            tampered += guard.check()
            t1 = time.monotonic()
            ctx.phase("correct", settings["run_timeout_s"])
            kb = row["kb_trial_tolerance"] = []
            try:
                run_kernelbench_trials(ref_mod.get_inputs, ref_model, cand_model,
                                       int(settings["kernelbench_trials"]), device, kb,
                                       _reference_failed)
                row.update(check_correctness(ref_mod.get_inputs, ref_model, cand_model,
                                             msg["seed"], settings, device,
                                             plan=msg.get("variant_plan")))
            except ReferenceFailed as exc:  # HarnessLimited too: the task's, by its reference
                raise JobFailed("reference", str(exc), compiled=True)
            memory_plan = row.pop("memory_plan")
            note = row.pop("memory_note")
            if note:  # which checks a leaner memory plan skipped, and why
                row["error"] = f"{row.get('error') or ''} {note}".strip()
            row["wall_correct_s"] = time.monotonic() - t1
            tampered += guard.check()
            kb_correct = (len(kb) == int(settings["kernelbench_trials"]) > 0
                          and within_max_tolerance(max(kb), settings))
            strict_correct = row["correct"]
            gate = settings.get("timing_gate", "any")
            timed = {"any": strict_correct or kb_correct, "strict": strict_correct,
                     "kernelbench": kb_correct}[gate]
            if timed and msg.get("measure_speed", True):
                t2 = time.monotonic()
                row.update(run_timing(ref_mod.get_inputs, ref_model, cand_model, msg["seed"],
                                      settings, device, counter, ctx))
                row["wall_timing_s"] = time.monotonic() - t2
                tampered += guard.check()
                _judge_timed_outputs(row, settings)
                ctx.phase("post", settings["run_timeout_s"])
                # the post-timing check asks again what was right before timing: varied
                # inputs only of a kernel that passed them (a kernel right only on as-drawn
                # inputs, correct under KernelBench's check, is not flagged for that)
                plan = msg.get("variant_plan")
                row["flag_post_timing_wrong"] = not post_timing_check(
                    ref_mod.get_inputs, ref_model, cand_model, msg["seed"], settings, device,
                    varied=strict_correct and (plan is None or "normal" in plan),
                    memory_plan=memory_plan)
                tampered += guard.check()
    except JobFailed as exc:
        row.update(error=str(exc), error_phase=exc.phase, compiled=exc.compiled)
        if exc.log:
            row["compile_log_tail"] = exc.log
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        phase = ctx.current_phase or ""
        if phase.startswith(("timing", "post")) and _harness_short(exc):
            _skip_for_memory(row, phase, exc)
            return row, tampered
        row.update(error=_format(exc), error_phase=ctx.current_phase)
        if phase.startswith(("timing", "post")):
            # right on the correctness trials, then raised under repeated calls: a kernel
            # that fails when run again is not correct (as a worker timeout there is not)
            row["correct"] = False
            for name, empty in TIMING_COLUMNS.items():
                row[name] = empty() if callable(empty) else empty
    finally:
        for name in names:
            forget_module(name)
    return row, tampered


def run_probe(msg: dict, ctx) -> dict:
    """The reference alone on each strict trial's inputs (trials.probe_reference), from
    trial `len(msg["plan"])` on. A reference that does not load or build gives no plan
    (its jobs then report the reference's failure themselves)."""
    settings, device = msg["settings"], ctx.device
    apply_backend_settings(settings)
    ctx.phase("probe", settings["run_timeout_s"])
    try:
        ref_mod = exec_module(msg["reference_code"], "reference", ctx.job_folder)
        ref_model = _build(ref_mod.Model, _init_inputs(ref_mod), device)
        result = probe_reference(ref_mod.get_inputs, ref_model, msg["seed"],
                                 int(settings["correct_trials"]), device, list(msg["plan"]))
    except Exception as exc:
        result = {"plan": None, "fatal_trial": None, "error": _format(exc)[-1000:]}
    finally:
        forget_module("reference")
    gc.collect()
    fatal = result.get("fatal_trial") is not None or _context_broken(device, None)
    if device == "cuda" and not fatal:
        torch.cuda.empty_cache()
    return {"row": result, "fatal": fatal, "restart": fatal}


def _reference_failed(exc: BaseException) -> ReferenceFailed:
    return ReferenceFailed("reference failed on as-drawn inputs (KernelBench's trial): " +
                           _format(exc)[-2000:])


def apply_backend_settings(settings: dict) -> None:
    """The backend switches a measurement runs under (params.yaml harness: PyTorch's own
    defaults unless set otherwise: cuDNN may use TF32, cuBLAS matmuls may not)."""
    torch.backends.cudnn.allow_tf32 = bool(settings["cudnn_allow_tf32"])
    torch.backends.cuda.matmul.allow_tf32 = bool(settings["matmul_allow_tf32"])


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


def _init_inputs(ref_mod) -> list:
    torch.manual_seed(KERNELBENCH_SEED)
    return ref_mod.get_init_inputs()


def _build(cls, init_inputs: list, device: str):
    """One model under KernelBench's seed, on the CPU first then moved (as KernelBench does):
    the reference and every candidate of a task start from the same weights."""
    torch.manual_seed(KERNELBENCH_SEED)
    return cls(*init_inputs).to(device)


def _build_models(ref_mod, cand_mod, device: str):
    init_inputs = _init_inputs(ref_mod)
    try:
        ref_model = _build(ref_mod.Model, init_inputs, device)
    except BaseException as exc:
        raise JobFailed("reference", "reference model failed to build: " + _format(exc),
                        compiled=True)
    try:
        cand_model = _build(cand_mod.ModelNew, init_inputs, device)
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
    return cuda_context_broken()


def _harness_short(exc: BaseException) -> bool:
    """Out of memory, and not in the candidate's own call: the timing phase's copies (its
    input slots, the checked outputs) or the post-timing check's plans did not fit."""
    if isinstance(exc, HarnessLimited):
        return True
    return memory_plans.short_of_memory(exc) and memory_plans.whose(exc) != "candidate"


def _skip_for_memory(row: dict, phase: str, exc: BaseException) -> None:
    """The correctness verdict stands; what the device had no room for is not measured, and
    the row says so (timing: its columns dropped, so no speedup is claimed)."""
    if phase.startswith("timing"):
        what = "timing and the post-timing check"
        for name, empty in TIMING_COLUMNS.items():
            row[name] = empty() if callable(empty) else empty
    else:
        what = "the post-timing check"
    row["error"] = (f"{row.get('error') or ''} [{what} skipped: the device was short of room "
                    f"for the harness's own copies beside the calls (the "
                    f"{memory_plans.whose(exc)} step)]").strip()


def _judge_timed_outputs(row: dict, settings: dict) -> None:
    """Timed outputs that differ from the reference's for the same values: the candidate
    served them from a cache (or went wrong under load). Either way the row is incorrect and
    what was timed is not reported as a speedup."""
    timed = row.pop("timed_tolerance_needed", None)
    reason = row.pop("timed_check_reason", "")
    if timed is None:
        return
    row["tolerance_needed"] = max(row.get("tolerance_needed") or 0.0, timed)
    if within_max_tolerance(timed, settings):
        return
    row["correct"] = False
    row["error"] = ("timing: a timed output differs from the reference's for the same "
                    f"inputs ({reason}): an output served from a cache (by buffer address, "
                    "say) or a kernel that goes wrong under repeated calls; timing dropped")
    row["error_phase"] = "timing"
    for name, empty in TIMING_COLUMNS.items():
        row[name] = empty() if callable(empty) else empty
