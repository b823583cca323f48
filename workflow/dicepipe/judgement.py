"""The one verdict: is a measured kernel correct under a protocol, robust, faster than p?

The harness (the kernelharness package) records facts in a row; what a row is worth is the
pipeline's decision, configured by params.yaml `protocols` and each stage's threshold and
`robust`, so it lives here, beside the params that configure it. Every decision made on a harness row goes through here: assemble keeping a corpus sample,
augment keeping a structural kernel, `dicepipe score` counting, the evaluation's Exec and
fast_p, and the RL reward. A row is judged, never re-measured: it carries what every
protocol needs, so any protocol or threshold applies to rows measured once.

A protocol (params.yaml `protocols`) names a check and its tolerances:
- check `kernelbench`: KernelBench's own trials (kernelharness/worker/kb_trials.py: as-drawn
  inputs, its seeds, `torch.allclose(atol=rtol=t)`); correct when the row compiled and each of the
  protocol's first `trials` trials needed at most the tolerance for the output's precision
  (`kernelbench`: 5 trials, fp32 1e-4; `kernelbench_v0`: 5 trials, 1e-2, the paper's and
  the release's evaluation; `release_reward`: 1 trial, 1e-2, what BiC-RL rewarded);
- check `strict`: the harness's own (kernelharness/worker/trials.py): varied input
  distributions, a tolerance relative to the output's range, exact non-float outputs, the memory scrub and
  the checked timed outputs: correct when the row is `correct` (all of that within
  `harness.max_tolerance`) and `tolerance_needed` is within the protocol's tolerance.
Deception flags are a separate axis for every protocol: robust = correct and no `flag_*`.
Faster than p: `statistic` "low" asks the harness's question (the lower end of the speedup
interval is above p: faster with confidence); "median" asks the paper's and KernelBench's
(the point speedup is above p). Both compare strictly, as KernelBench's fast_p does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import HarnessError

PRECISIONS = ("fp32", "low_precision", "exact")
STATISTICS = ("low", "median")
CHECKS = ("kernelbench", "strict")
# The protocols the project ships (params.yaml `protocols` holds the same values and is what
# stages read; these are for callers without params, such as benchmark scripts).
BUILTIN_PROTOCOLS = {
    "kernelbench": {"check": "kernelbench", "trials": 5, "fp32": 1e-4, "low_precision": 1e-2},
    "kernelbench_v0": {"check": "kernelbench", "trials": 5, "fp32": 1e-2,
                       "low_precision": 1e-2},
    "release_reward": {"check": "kernelbench", "trials": 1, "fp32": 1e-2,
                       "low_precision": 1e-2},
    "strict": {"check": "strict", "fp32": 1e-4, "low_precision": 1e-2},
}
# Why a row is not accepted, in the order the checks run.
REASONS = ("not_measured", "not_compiled", "incorrect", "flagged", "no_speedup",
           "below_threshold", "accepted")


@dataclass(frozen=True)
class Protocol:
    """A correctness check and its tolerance (atol = rtol) per output precision."""

    name: str
    check: str
    fp32: float
    low_precision: float
    trials: int = 0  # kernelbench check: how many of KernelBench's trials must pass

    def allowed(self, precision: str | None) -> float:
        if precision == "low_precision":
            return self.low_precision
        if precision == "exact" and self.check == "strict":
            return 0.0  # the strict check compares non-float outputs exactly
        return self.fp32  # fp32, and rows that predate `output_precision`

    def is_correct(self, row: Mapping) -> bool:
        """Compiled and correct under this protocol (no flags looked at)."""
        if not row.get("compiled"):
            return False
        if self.check == "kernelbench":
            trials = list(row.get("kb_trial_tolerance") or [])[:self.trials]
            allowed = self.allowed(row.get("output_precision"))
            return len(trials) == self.trials and all(
                _number(t) is not None and _number(t) <= allowed for t in trials)
        if not row.get("correct"):
            return False
        needed = _number(row.get("tolerance_needed"))
        if "tolerance_needed" in row and (needed is None or
                                          needed > self.allowed(row.get("output_precision"))):
            return False
        return True


def named_protocol(name: str, table: Mapping[str, Mapping] | None = None) -> Protocol:
    """The named protocol from `table` (params.yaml `protocols`) or the built-ins."""
    table = BUILTIN_PROTOCOLS if table is None else table
    if name not in table:
        raise HarnessError(f"protocol {name!r} is not defined; params.yaml protocols has "
                           f"{sorted(table)}.")
    values = table[name]
    check = values.get("check", "strict")
    if check not in CHECKS:
        raise HarnessError(f"protocols.{name}.check={check!r}: expected one of {CHECKS}.")
    trials = int(values.get("trials", 0) or 0)
    if check == "kernelbench" and trials < 1:
        raise HarnessError(f"protocols.{name}.trials={trials}: a kernelbench check needs at "
                           "least 1 trial.")
    return Protocol(name, check, float(values["fp32"]), float(values["low_precision"]),
                    trials)


def _number(value) -> float | None:
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value


def is_flagged(row: Mapping) -> bool:
    """Any deception flag set. Rows that carry no flag columns (summaries of harness rows,
    such as augment's attempt records) fall back to their stored robust verdict."""
    flags = [name for name in row if name.startswith("flag_")]
    if flags:
        return any(bool(row[name]) for name in flags)
    return bool(row.get("correct")) and not bool(row.get("correct_robust", row.get("correct")))


def is_correct(row: Mapping, protocol: Protocol, robust: bool) -> bool:
    return judge(row, protocol=protocol, robust=robust) == "accepted"


def is_faster(row: Mapping, threshold: float, statistic: str = "low") -> bool:
    """Speed only (pair it with is_correct): the chosen statistic is strictly above p."""
    if statistic not in STATISTICS:
        raise HarnessError(f"speedup statistic {statistic!r}: expected one of {STATISTICS}.")
    value = _number(row.get("speedup_low" if statistic == "low" else "speedup_median"))
    return value is not None and value > threshold


def judge(row: Mapping | None, *, protocol: Protocol, robust: bool,
          threshold: float | None = None, statistic: str = "low") -> str:
    """'accepted', or the first reason (REASONS) the row is not."""
    if statistic not in STATISTICS:
        raise HarnessError(f"speedup statistic {statistic!r}: expected one of {STATISTICS}.")
    if row is None:
        return "not_measured"
    if not row.get("compiled"):
        return "not_compiled"
    if not protocol.is_correct(row):
        return "incorrect"
    if robust and is_flagged(row):
        return "flagged"
    if threshold is None:
        return "accepted"
    value = _number(row.get("speedup_low" if statistic == "low" else "speedup_median"))
    if value is None:
        return "no_speedup"
    return "accepted" if value > threshold else "below_threshold"


def verdict(row: Mapping | None, *, protocol: Protocol, robust: bool,
            threshold: float | None = None, statistic: str = "low") -> bool:
    """Correct under `protocol` (and robust if asked), and faster than `threshold` if given."""
    return judge(row, protocol=protocol, robust=robust, threshold=threshold,
                 statistic=statistic) == "accepted"
