"""The timing phase of a device job: input sets, repeats, the repeat rule, extension calls."""

from __future__ import annotations

import torch

from . import correctness as C
from .loader import CallCounter
from .stats import run_repeats
from .timing import Clock, measure_graphs, measure_interleaved, measure_kernelbench_style

MAX_INPUT_SETS = 8


def _num_input_sets(sample: list, device: str, settings: dict) -> int:
    """As many distinct input sets as fit in a quarter of the free memory, 2..8."""
    per_set = max(C.input_bytes(sample), 1)
    if device == "cuda":
        free, _total = torch.cuda.mem_get_info()
    else:
        free = settings["memory_limit_mb"] * 2**20
    return int(max(1, min(MAX_INPUT_SETS, (free // 4) // per_set)))


class _CountedCalls:
    """Wraps a model so each timed call can be checked for extension calls.

    The reference is timed through the same wrapper (with a counter of its own): the extra
    Python call costs the same on both sides then, not a bias against the candidate (timed
    alone on the candidate it made unchanged programs read ~0.7% slower on CPU).
    """

    def __init__(self, model, counter):
        self.model, self.counter = model, counter
        self.calls = 0
        self.without_extension = 0

    def __call__(self, *args):
        before = self.counter.calls
        out = self.model(*args)
        self.calls += 1
        if self.counter.calls == before:
            self.without_extension += 1
        return out


def run_timing(get_inputs, ref_model, cand_model, seed: int, settings: dict, device: str,
               counter, ctx) -> dict:
    clock = Clock(device, settings.get("cpu_clock", "wall"))
    trials = settings["timing_trials_cpu" if device == "cpu" else "timing_trials"]
    sample = C.draw_inputs(get_inputs, seed + 90_000, device)
    n_sets = _num_input_sets(sample, device, settings)
    del sample
    cand = _CountedCalls(cand_model, counter)
    ref = _CountedCalls(ref_model, CallCounter())
    mode = {"value": "eager"}

    def measure(repeat: int):
        ctx.phase(f"timing:{repeat + 1}", settings["run_timeout_s"])
        base = seed + 100_000 + 1_000 * repeat
        sets = [C.draw_inputs(get_inputs, base + k, device) for k in range(n_sets)]
        with torch.no_grad():
            if device == "cuda" and settings["cuda_graphs"]:
                before = counter.calls
                timed = measure_graphs(ref_model, cand_model, sets, settings["warmup_trials"],
                                       trials, clock, base)
                if timed is not None:
                    mode["value"] = "cuda_graphs"
                    if counter.calls == before:
                        cand.without_extension += 1
                    return timed
            return measure_interleaved(ref, cand, sets, settings["warmup_trials"],
                                       trials, clock, base)

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
    }
    ref_medians = sorted(out["ref_runtime_ms"])
    out["launch_bound"] = ref_medians[len(ref_medians) // 2] < settings["launch_bound_floor_ms"]
    if settings.get("kernelbench_timing"):
        ctx.phase("timing:kernelbench", settings["run_timeout_s"])
        args = C.draw_inputs(get_inputs, seed + 80_000, device)
        ref_mean = measure_kernelbench_style(ref_model, args, clock)
        cand_mean = measure_kernelbench_style(cand_model, args, clock)
        out["kb_speedup"] = ref_mean / cand_mean
    return out
