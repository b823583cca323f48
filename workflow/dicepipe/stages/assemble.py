"""`dicepipe assemble`: apply the speedup threshold to the measurements, join the structural
samples and write the CuKe splits (sft, rl_infill, rl_e2e, val), stats.json (DVC metrics)
and speedups.png (DVC plots: the measured distribution with the threshold marked)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pyarrow as pa

from ..config import corpus_settings
from ..data.assemble import assemble, kept_at_thresholds
from ..data.schema import (RL_E2E_SCHEMA, RL_INFILL_SCHEMA, SAMPLE_SCHEMA, SFT_SCHEMA, VAL_SCHEMA,
                           read_parquet, read_table, write_table)
from ..errors import StageInputError
from ..judgement import is_correct, named_protocol

log = logging.getLogger(__name__)
SPLIT_SCHEMAS = {"sft": SFT_SCHEMA, "rl_infill": RL_INFILL_SCHEMA, "rl_e2e": RL_E2E_SCHEMA, "val": VAL_SCHEMA}
MEASUREMENT_COLUMNS = ("job_id", "compiled", "correct", "correct_robust", "speedup_median")
# Read when present (the verdict falls back to `correct`/`correct_robust` without them).
VERDICT_COLUMNS = ("tolerance_needed", "output_precision", "speedup_low", "kb_trial_tolerance")


def add_arguments(parser) -> None:
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--samples", required=True)
    parser.add_argument("--measurements", required=True)
    parser.add_argument("--structural", required=True)
    parser.add_argument("--out-dir", required=True)


def _read_measurements(path: str) -> dict[str, dict]:
    if not Path(path).is_file():
        raise StageInputError(f"{path}: no such file. Run `dicepipe verify` for this corpus first.")
    table = read_parquet(path)
    missing = [c for c in MEASUREMENT_COLUMNS if c not in table.column_names]
    if missing:
        raise StageInputError(f"{path}: missing columns {missing}; re-run verify.")
    extra = [c for c in table.column_names
             if c in VERDICT_COLUMNS or c.startswith("flag_")]
    return {row["job_id"]: row
            for row in table.select(list(MEASUREMENT_COLUMNS) + extra).to_pylist()}


def run(args, params: dict) -> int:
    settings = corpus_settings(params["assemble"], args.corpus)
    samples = read_table(args.samples, SAMPLE_SCHEMA).to_pylist()
    measurements = _read_measurements(args.measurements)
    structural = read_table(args.structural, SAMPLE_SCHEMA).to_pylist()
    protocol = named_protocol(settings["protocol"], params["protocols"])
    splits, stats = assemble(samples, measurements, structural, settings, protocol)
    stats["kept_at_thresholds"] = kept_at_thresholds(
        samples, measurements, sorted({*params["verify"]["decision_thresholds"], settings["speedup_threshold"]}),
        settings["robust"], protocol)
    out = Path(args.out_dir)
    for name, rows in splits.items():
        write_table(pa.Table.from_pylist(rows, schema=SPLIT_SCHEMAS[name]), out / f"{name}.parquet",
                    SPLIT_SCHEMAS[name])
    (out / "stats.json").write_text(json.dumps(stats, indent=2, sort_keys=True) + "\n")
    speedups = [m["speedup_median"] for m in measurements.values()
                if is_correct(m, protocol, robust=False) and m.get("speedup_median") is not None]
    plot_speedups(speedups, settings["speedup_threshold"], out / "speedups.png", args.corpus)
    log.info("corpus %s at threshold %.2fx: %s", args.corpus, settings["speedup_threshold"], stats["split_sizes"])
    if not splits["sft"]:
        # Not a quiet success: SFT cannot train on nothing, and a slower machine measuring
        # every kernel under the threshold should say so here, with what would be kept.
        raise StageInputError(
            f"corpus {args.corpus}: the sft split is empty at assemble.speedup_threshold "
            f"{settings['speedup_threshold']:g} (protocol {protocol.name}, robust {settings['robust']}): "
            f"samples kept at each threshold {stats['kept_at_thresholds']}, verdicts {stats['reasons']} "
            f"({out / 'stats.json'}, {out / 'speedups.png'}). Lower assemble.speedup_threshold in "
            "params.yaml, or check the measurements (data/verify/<corpus>/measurements.parquet).")
    return 0


def plot_speedups(speedups: list[float], threshold: float, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    matplotlib.rcParams["svg.hashsalt"] = "dicepipe"
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    values = np.clip(np.asarray(speedups, dtype=float), 1e-3, None)
    bins = np.logspace(np.log10(max(values.min(initial=1.0) / 1.2, 1e-2)),
                       np.log10(max(values.max(initial=1.0) * 1.2, threshold * 1.5)), 30)
    ax.hist(values, bins=bins, color="#4c72b0")
    ax.set_xscale("log")
    ax.axvline(threshold, color="#c44e52", linestyle="--", label=f"threshold {threshold:g}x")
    ax.axvline(1.0, color="grey", linewidth=0.8)
    ax.set_xlabel("measured speedup over PyTorch eager (median)")
    ax.set_ylabel("correct kernels")
    ax.set_title(f"{title}: {len(values)} correct kernels, {int((values > threshold).sum())} above the threshold")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)
