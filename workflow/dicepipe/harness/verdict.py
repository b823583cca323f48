"""The one verdict: is a measured kernel correct, robust, and faster than p? (pure functions)

Every decision made on a harness row goes through here: assemble keeping a corpus sample,
augment keeping a structural kernel, `dicepipe score` counting, the evaluation's Exec and
fast_p, and the RL reward. A row is judged, never re-measured, so any tolerance profile or
threshold can be applied to rows measured once:

- correct under a profile: the row compiled, passed every check the harness ran (`correct`,
  which already means "within the loosest tolerance, `harness.max_tolerance`, and no output
  served from a cache"), and the smallest tolerance its trials needed (`tolerance_needed`)
  is within the profile's tolerance for the row's `output_precision`;
- robust: additionally no deception flag (`flag_*` column) is set;
- faster than p: `statistic` "low" asks the harness's question (the lower end of the
  speedup interval is above p: faster with confidence); "median" asks the paper's and
  KernelBench's (the point speedup is above p). Both compare strictly, as KernelBench's
  fast_p does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import HarnessError

PRECISIONS = ("fp32", "low_precision", "exact")
STATISTICS = ("low", "median")
# The profiles the project ships (params.yaml `tolerance_profiles` holds the same values and
# is what stages read; these are for callers without params, such as benchmark scripts).
BUILTIN_PROFILES = {
    "kernelbench": {"fp32": 1e-4, "low_precision": 1e-2},  # KernelBench main (v0.2)
    "kernelbench_v0": {"fp32": 1e-2, "low_precision": 1e-2},  # the paper's and release's
}
# Why a row is not accepted, in the order the checks run.
REASONS = ("not_measured", "not_compiled", "incorrect", "flagged", "no_speedup",
           "below_threshold", "accepted")


@dataclass(frozen=True)
class ToleranceProfile:
    """atol = rtol = the tolerance for an output's precision (exact outputs need 0)."""

    name: str
    fp32: float
    low_precision: float

    def allowed(self, precision: str | None) -> float:
        if precision == "exact":
            return 0.0
        if precision == "low_precision":
            return self.low_precision
        return self.fp32  # fp32, and rows that predate `output_precision`


def tolerance_profile(name: str, profiles: Mapping[str, Mapping] | None = None
                      ) -> ToleranceProfile:
    """The named profile from `profiles` (params.yaml `tolerance_profiles`) or the built-ins."""
    table = BUILTIN_PROFILES if profiles is None else profiles
    if name not in table:
        raise HarnessError(f"tolerance profile {name!r} is not defined; params.yaml "
                           f"tolerance_profiles has {sorted(table)}.")
    values = table[name]
    return ToleranceProfile(name, float(values["fp32"]), float(values["low_precision"]))


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


def is_correct(row: Mapping, profile: ToleranceProfile, robust: bool) -> bool:
    return judge(row, profile=profile, robust=robust) == "accepted"


def is_faster(row: Mapping, threshold: float, statistic: str = "low") -> bool:
    """Speed only (pair it with is_correct): the chosen statistic is strictly above p."""
    if statistic not in STATISTICS:
        raise HarnessError(f"speedup statistic {statistic!r}: expected one of {STATISTICS}.")
    value = _number(row.get("speedup_low" if statistic == "low" else "speedup_median"))
    return value is not None and value > threshold


def judge(row: Mapping | None, *, profile: ToleranceProfile, robust: bool,
          threshold: float | None = None, statistic: str = "low") -> str:
    """'accepted', or the first reason (REASONS) the row is not."""
    if statistic not in STATISTICS:
        raise HarnessError(f"speedup statistic {statistic!r}: expected one of {STATISTICS}.")
    if row is None:
        return "not_measured"
    if not row.get("compiled"):
        return "not_compiled"
    if not row.get("correct"):
        return "incorrect"
    needed = _number(row.get("tolerance_needed"))
    if "tolerance_needed" in row and (needed is None or
                                      needed > profile.allowed(row.get("output_precision"))):
        return "incorrect"
    if robust and is_flagged(row):
        return "flagged"
    if threshold is None:
        return "accepted"
    value = _number(row.get("speedup_low" if statistic == "low" else "speedup_median"))
    if value is None:
        return "no_speedup"
    return "accepted" if value > threshold else "below_threshold"


def verdict(row: Mapping | None, *, profile: ToleranceProfile, robust: bool,
            threshold: float | None = None, statistic: str = "low") -> bool:
    """Correct under `profile` (and robust if asked), and faster than `threshold` if given."""
    return judge(row, profile=profile, robust=robust, threshold=threshold,
                 statistic=statistic) == "accepted"
