"""The timing phase of a device job: input slots, output checks, repeats, extension calls.

Honest timing inputs: a candidate that serves its output from a cache (keyed by the input's
address, or by a few of its values) would time near zero if timed calls reused the same
input. So each repeat times on several input slots (distinct buffers, 2..8 as memory
allows), used in rounds (each slot once per round), and between rounds every slot's values
are redrawn in place from fresh seeds (through the task's own `get_inputs`, so they stay
valid inputs): no call ever sees values an earlier call saw, and a buffer's address says
nothing about its contents. The draws come in a batch between rounds rather than one before
each reuse: on the CPU a draw just before every trial cost the verdict its power (DESIGN.md,
"Timing"); now one trial per round follows draws. A sample of the timed candidate calls is
checked against the reference's output for the same values (computed first, on a copy, under
the same seed; the reference's timed output is kept alive and, on cuda, the free memory
scrubbed before the candidate's call), so a cached output is caught in the plain verdict,
not only by a flag. The reference is timed on the same slots, so the comparison stays fair.
"""

from __future__ import annotations

import math
import random

import torch

from ..stats import run_repeats
from . import correctness as C
from . import memory_plans as M
from .loader import CallCounter
from .timing import Clock, measure_graphs, measure_interleaved, measure_kernelbench_style

MAX_INPUT_SETS = 8
MIN_INPUT_SETS = 2
CHECK_EVERY = 8  # about one timed candidate call in this many is checked (at least 2)
MIN_CHECKS = 2
# What a row's timing columns read when timing is dropped (and before it ran).
TIMING_COLUMNS = {
    "ref_runtime_ms": list, "cand_runtime_ms": list, "ref_runtime_iqr_ms": list,
    "cand_runtime_iqr_ms": list, "speedup_repeats": list, "speedup_low_repeats": list,
    "speedup_high_repeats": list, "speedup_median": None, "speedup_low": None,
    "speedup_high": None, "num_repeats": 0, "timing_mode": None, "kb_speedup": None,
    "launch_bound": False,
}


def num_input_sets(per_set_bytes: int, free_bytes: int) -> int:
    """As many input slots as fit in a quarter of the free memory, MIN..MAX (pure).

    A slot costs its inputs plus, while it is checked, a copy and the reference's output:
    counted as three times the input bytes. Fewer than MIN_INPUT_SETS would let a cache
    keyed by address see the same buffer every call, so MIN is kept even past the budget.
    """
    per_slot = 3 * max(int(per_set_bytes), 1)
    return int(max(MIN_INPUT_SETS, min(MAX_INPUT_SETS, (free_bytes // 4) // per_slot)))


def checked_calls(first_call: int, trials: int, slots: int, seed: int) -> set[int]:
    """Which timed calls (numbered from 0 with the warm-up) get their output checked: a
    seeded sample of those that reuse a slot (where a cache by address would answer)."""
    eligible = [c for c in range(first_call, first_call + trials) if c >= slots]
    if not eligible:
        eligible = list(range(first_call, first_call + trials))
    count = min(len(eligible), max(MIN_CHECKS, math.ceil(trials / CHECK_EVERY)))
    return set(random.Random(seed).sample(eligible, count))


def _refill(dst, src) -> bool:
    """Copy src's values into dst's tensors in place; False where the structure differs."""
    if isinstance(dst, torch.Tensor):
        if not isinstance(src, torch.Tensor) or src.shape != dst.shape or src.dtype != dst.dtype:
            return False
        dst.copy_(src)
        return True
    if isinstance(dst, (list, tuple)):
        return (isinstance(src, (list, tuple)) and len(src) == len(dst)
                and all(_refill(d, s) for d, s in zip(dst, src)))
    return dst == src


class RotatingInputs:
    """Input slots used in rounds; between rounds every slot's values are redrawn in place."""

    def __init__(self, get_inputs, seed: int, count: int, device: str):
        self.get_inputs, self.seed, self.device = get_inputs, seed, device
        self.slots = [C.draw_inputs(get_inputs, seed + k, device) for k in range(count)]
        self.calls = 0

    def slot_of(self, call: int) -> int:
        return call % len(self.slots)

    def redraw(self, k: int, salt: int, replace: bool = False) -> bool:
        """New values into slot k's buffers in place. False if the task's shapes vary; then
        `replace` puts the fresh inputs in the slot instead (new buffers)."""
        fresh = C.draw_inputs(self.get_inputs, self.seed + salt, self.device)
        if _refill(self.slots[k], fresh):
            return True
        if replace:
            self.slots[k] = fresh
        return False

    def next(self) -> tuple[int, list]:
        call = self.calls
        self.calls += 1
        k = self.slot_of(call)
        if call >= len(self.slots) and k == 0:  # a new round: fresh values for every slot
            for j in range(len(self.slots)):
                # seeded by the call that will use them: every call's values are its own
                self.redraw(j, call + j, replace=True)
        return call, self.slots[k]


class OutputCheck:
    """Compares chosen timed candidate outputs with the reference's for the same values."""

    def __init__(self, ref_model, device: str, calls: set[int], seed: int):
        self.ref_model, self.device, self.calls, self.seed = ref_model, device, calls, seed
        self.expected = None
        self.worst = 0.0
        self.reason = ""
        self.checked = 0

    def wants(self, call: int) -> bool:
        return call in self.calls

    def _call_seed(self, call: int) -> int:
        return self.seed * 7 + 3 + call

    def expect(self, call: int, args) -> None:
        copy = C.clone_args(args)
        torch.manual_seed(self._call_seed(call))
        self.expected = self.ref_model(*copy)
        del copy

    def before_candidate(self, call: int) -> None:
        # The reference's output of this trial is kept alive; its freed intermediates are
        # scrubbed on cuda (a fill: no cost carried into the timed call). Not on cpu, where
        # the scrub hands pages back to the kernel and the candidate's next allocations
        # would pay page faults inside its timed call.
        if self.device == "cuda":
            C.scrub_free_memory(self.device)
        torch.manual_seed(self._call_seed(call))

    def candidate_output(self, call: int, out) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()
        needed, _err, reason = C.compare(self.expected, out)
        self.checked += 1
        if needed > self.worst:
            self.worst, self.reason = needed, f"timed call {call}: {reason}"
        self.expected = None


class _CountedCalls:
    """Wraps a model so each timed call can be checked for extension calls.

    The reference is timed through the same wrapper (with a counter of its own): the extra
    Python call costs the same on both sides then, not a bias against the candidate (timed
    alone on the candidate it made unchanged programs read ~0.7% slower on CPU). An
    out-of-memory error in the call is re-raised as `who`'s (memory_plans.py), so the job
    tells the candidate's own call running out from the timing phase's copies running out.
    """

    def __init__(self, model, counter, who: str):
        self.model, self.counter, self.who = model, counter, who
        self.calls = 0
        self.without_extension = 0

    def __call__(self, *args):
        before = self.counter.calls
        try:  # (no cost on the timed path unless it raises)
            out = self.model(*args)
        except Exception as exc:
            if not M.is_out_of_memory(exc):
                raise
            kind = M.CandidateOutOfMemory if self.who == "candidate" else M.ReferenceOutOfMemory
            raise kind(f"{self.who} (timed call): {str(exc).strip()[:500]}") from None
        self.calls += 1
        if self.counter.calls == before:
            self.without_extension += 1
        return out


def _free_bytes(device: str, settings: dict) -> int:
    if device == "cuda":
        free, _total = torch.cuda.mem_get_info()
        return int(free)
    return int(settings["memory_limit_mb"]) * 2**20


def run_timing(get_inputs, ref_model, cand_model, seed: int, settings: dict, device: str,
               counter, ctx) -> dict:
    clock = Clock(device, settings["cpu_clock"])
    trials = settings["timing_trials_cpu" if device == "cpu" else "timing_trials"]
    warmup = settings["warmup_trials"]
    sample = C.draw_inputs(get_inputs, seed + 90_000, device)
    n_sets = num_input_sets(C.input_bytes(sample), _free_bytes(device, settings))
    del sample
    cand = _CountedCalls(cand_model, counter, "candidate")
    ref = _CountedCalls(ref_model, CallCounter(), "reference")
    mode = {"value": "eager"}
    checks: list[OutputCheck] = []

    def measure(repeat: int):
        ctx.phase(f"timing:{repeat + 1}", settings["run_timeout_s"])
        base = seed + 100_000 + 1_000 * repeat
        inputs = RotatingInputs(get_inputs, base, n_sets, device)
        check = OutputCheck(ref_model, device, checked_calls(warmup, trials, n_sets, base), base)
        checks.append(check)
        with torch.no_grad():
            if device == "cuda" and settings["cuda_graphs"]:
                before = counter.calls
                timed = measure_graphs(ref_model, cand_model, inputs, warmup, trials, clock,
                                       base, check)
                if timed is not None:
                    mode["value"] = "cuda_graphs"
                    if counter.calls == before:
                        cand.without_extension += 1
                    return timed
                inputs = RotatingInputs(get_inputs, base, n_sets, device)  # calls restart
            return measure_interleaved(ref, cand, inputs, warmup, trials, clock, base, check)

    noise_floor = settings["timing_noise_floor_cpu" if device == "cpu" else "timing_noise_floor"]
    records, pooled = run_repeats(measure, settings["repeats"], settings["decision_thresholds"],
                                  settings["interval_confidence"], noise_floor)
    out = {
        "ref_runtime_ms": [r["ref_ms"] for r in records],
        "cand_runtime_ms": [r["cand_ms"] for r in records],
        "ref_runtime_iqr_ms": [r["ref_iqr_ms"] for r in records],
        "cand_runtime_iqr_ms": [r["cand_iqr_ms"] for r in records],
        "speedup_repeats": [r["speedup"] for r in records],
        "speedup_low_repeats": [r["low"] for r in records],
        "speedup_high_repeats": [r["high"] for r in records],
        "speedup_median": pooled.speedup,
        "speedup_low": pooled.low,
        "speedup_high": pooled.high,
        "num_repeats": len(records),
        "timing_mode": mode["value"],
        "flag_ext_not_called": cand.without_extension > 0 or counter.modules == 0,
        "timed_outputs_checked": sum(c.checked for c in checks),
    }
    worst = max(checks, key=lambda c: c.worst)
    out["timed_tolerance_needed"], out["timed_check_reason"] = worst.worst, worst.reason
    ref_medians = sorted(out["ref_runtime_ms"])
    out["launch_bound"] = ref_medians[len(ref_medians) // 2] < settings["launch_bound_floor_ms"]
    if settings.get("kernelbench_timing") and C.within_max_tolerance(worst.worst, settings):
        ctx.phase("timing:kernelbench", settings["run_timeout_s"])
        args = C.draw_inputs(get_inputs, seed + 80_000, device)
        ref_mean = measure_kernelbench_style(ref_model, args, clock)
        cand_mean = measure_kernelbench_style(cand_model, args, clock)
        out["kb_speedup"] = ref_mean / cand_mean
    return out
