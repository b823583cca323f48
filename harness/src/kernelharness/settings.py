"""What the harness is asked to do: jobs, and the settings every job of a batch shares.

Both are plain frozen dataclasses that cross process boundaries as JSON (`to_wire`), so the
sandboxed workers never unpickle anything the orchestrator did not write itself.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from .errors import HarnessError

BACKENDS = ("cpu", "cuda")
TIMING_GATES = ("any", "strict", "kernelbench")

# The split every field of HarnessSettings falls under (a test checks that each is in exactly
# one of MEASUREMENT_FIELDS, OPERATIONAL_FIELDS, and that the params-backed ones are
# params.yaml's harness.measure and harness.run). MEASUREMENT_FIELDS change what a row says
# (trials, tolerances, timing, seeds, the limits a job runs under; harness.measure, plus the
# repeats, thresholds and timing gate the caller sets): a stored row is reused only under the
# same values (session.stored_results), and stages track harness.measure as a parameter.
# OPERATIONAL_FIELDS (harness.run, plus the devices the caller gives) change only how fast or
# where rows are made. How a row is judged (robust) is the judging stage's own key.
MEASUREMENT_FIELDS = (
    "correct_trials", "max_tolerance",
    "warmup_trials", "timing_trials", "timing_trials_cpu", "launch_bound_floor_ms",
    "cuda_graphs", "cpu_clock", "cpu_threads", "interval_confidence", "timing_noise_floor",
    "timing_noise_floor_cpu", "run_timeout_s", "memory_limit_mb", "max_open_files", "seed",
    "repeats", "decision_thresholds", "kernelbench_timing", "kernelbench_trials",
    "cudnn_allow_tf32", "matmul_allow_tf32", "timing_gate",
)
OPERATIONAL_FIELDS = (
    "build_timeout_s", "build_workers", "use_pch", "cuda_light_headers", "minimal_headers",
    "slim_op_headers", "share_host_objects", "wait_for_prelude_header", "cache_dir", "devices",
)


@dataclass(frozen=True)
class Job:
    """One (reference program, candidate file) pair to evaluate."""

    job_id: str
    reference_code: str
    candidate_code: str
    backend: str

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise HarnessError(
                f"job {self.job_id!r}: backend {self.backend!r} is not one of {BACKENDS}."
            )
        if not isinstance(self.job_id, str) or not self.job_id:
            raise HarnessError(f"job id {self.job_id!r}: expected a non-empty string.")


@dataclass(frozen=True)
class HarnessSettings:
    """Every knob of one evaluation batch: params.yaml's harness.measure and harness.run (no
    defaults here: the schema holds them; build with from_params or with_defaults), then what
    the caller sets."""

    # harness.measure
    correct_trials: int
    # KernelBench's own trials (as-drawn inputs, its seeds, allclose): what the `kernelbench`,
    # `kernelbench_v0` and `release_reward` protocols judge (kb_trials.py); 0 skips them
    kernelbench_trials: int
    # backend switches as PyTorch sets them by default (KernelBench runs under these)
    cudnn_allow_tf32: bool
    matmul_allow_tf32: bool
    # The loosest tolerance any profile may ask for (atol = rtol = t, see correctness.py):
    # rows within it are `correct` and timed; profiles judge `tolerance_needed` later.
    max_tolerance: float
    warmup_trials: int
    timing_trials: int
    timing_trials_cpu: int
    launch_bound_floor_ms: float
    cuda_graphs: bool
    cpu_clock: str
    cpu_threads: int
    interval_confidence: float
    timing_noise_floor: float
    timing_noise_floor_cpu: float
    run_timeout_s: float
    memory_limit_mb: int
    max_open_files: int
    seed: int
    # harness.run
    build_timeout_s: float
    build_workers: int
    use_pch: bool
    cuda_light_headers: bool
    minimal_headers: bool
    slim_op_headers: bool
    share_host_objects: bool
    wait_for_prelude_header: bool
    cache_dir: str
    # Set by the caller, not params.yaml's harness section.
    repeats: int = 1
    decision_thresholds: tuple[float, ...] = (1.0,)
    # Which check must accept a row (within max_tolerance) for it to be timed: "any" (either),
    # "strict" or "kernelbench" (verify names it through verify.protocol)
    timing_gate: str = "any"
    # Not user knobs: the benchmark scripts turn these on to compare against other methods.
    kernelbench_timing: bool = False
    devices: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise HarnessError(f"harness repeats={self.repeats}: expected at least 1.")
        if not self.decision_thresholds:
            raise HarnessError("harness decision_thresholds: expected at least one threshold.")
        if not 0.0 <= self.max_tolerance < 1.0:
            raise HarnessError(f"harness.measure.max_tolerance={self.max_tolerance}: expected a "
                               "tolerance in [0, 1) (0.01 admits every shipped profile).")
        if self.kernelbench_trials < 0:
            raise HarnessError(f"harness.measure.kernelbench_trials={self.kernelbench_trials}: "
                               "expected >= 0 (5 as KernelBench's scripts; 0 skips its "
                               "protocol).")
        if self.timing_gate not in TIMING_GATES:
            raise HarnessError(f"harness timing_gate={self.timing_gate!r}: expected one of "
                               f"{TIMING_GATES}.")
        if self.cpu_clock not in ("wall", "cpu"):
            raise HarnessError(f"harness.measure.cpu_clock={self.cpu_clock!r}: expected 'wall' "
                               "or 'cpu'.")
        if self.cpu_threads < 0:
            raise HarnessError(f"harness.measure.cpu_threads={self.cpu_threads}: expected >= 0 "
                               "(0 = torch's default, one per core).")
        for name in ("timing_trials", "timing_trials_cpu"):
            if getattr(self, name) < 3:
                raise HarnessError(f"harness.measure.{name}={getattr(self, name)}: expected >= 3.")

    @classmethod
    def from_params(
        cls,
        harness: dict,
        repeats: int = 1,
        decision_thresholds: Sequence[float] = (1.0,),
        cache_dir: str | os.PathLike | None = None,
        timing_gate: str = "any",
    ) -> HarnessSettings:
        """Settings from params.yaml's `harness:` section: harness.measure and harness.run,
        each over the schema's defaults (the one home of every default)."""
        from .schema import settings_defaults

        defaults = settings_defaults()
        values = {**_known(harness.get("measure") or {}, defaults["measure"], "harness.measure"),
                  **_known(harness.get("run") or {}, defaults["run"], "harness.run")}
        values["repeats"] = int(repeats)
        values["decision_thresholds"] = tuple(float(p) for p in decision_thresholds)
        values["timing_gate"] = timing_gate
        if cache_dir is not None:
            values["cache_dir"] = str(cache_dir)
        return cls(**values)

    @classmethod
    def with_defaults(cls, **values) -> HarnessSettings:
        """The schema's harness defaults with `values` (field names) over them: for scripts
        and tests that set a few fields."""
        from .schema import settings_defaults

        defaults = settings_defaults()
        return cls(**{**defaults["measure"], **defaults["run"], **values})

    @property
    def cache_path(self) -> Path:
        return Path(self.cache_dir).resolve()

    def build_options(self):
        """How builds compile (harness.run): what every builder is sent with each build."""
        from .compilation.options import BuildOptions

        return BuildOptions(use_pch=self.use_pch, light_headers=self.cuda_light_headers,
                            minimal_headers=self.minimal_headers,
                            slim_op_headers=self.slim_op_headers,
                            share_host_objects=self.share_host_objects,
                            wait_for_prelude_header=self.wait_for_prelude_header)

    def num_build_workers(self) -> int:
        return self.build_workers if self.build_workers > 0 else (os.cpu_count() or 1)

    def measurement_key(self) -> dict:
        """The settings that change a measurement (see MEASUREMENT_FIELDS), JSON-able."""
        wire = self.to_wire()
        return {name: wire[name] for name in MEASUREMENT_FIELDS if name in wire}

    def to_wire(self) -> dict:
        out = asdict(self)
        out["decision_thresholds"] = list(self.decision_thresholds)
        out["devices"] = list(self.devices) if self.devices is not None else None
        out["cache_dir"] = str(self.cache_path)
        return out


def _known(given: dict, defaults: dict, where: str) -> dict:
    """`given` over `defaults`, refusing keys the schema does not know."""
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise HarnessError(f"params.yaml {where}: unknown keys {unknown}. Expected only "
                           f"{sorted(defaults)}.")
    return {**defaults, **given}
