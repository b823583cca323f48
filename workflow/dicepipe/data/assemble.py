"""CuKe assembly, the assemble stage's work (stages/assemble.py reads and writes its tables),
as pure functions: verdicts, threshold, held-out split and the four splits.

A corpus sample is kept for SFT when its measured kernel is correct under the chosen
tolerance protocol (robust verdict by default) and its median speedup over PyTorch eager is
above the threshold (dicepipe/judgement.py decides). Structural
samples (augment) were verified when generated and join as they are. Validation holds out
whole reference programs (by a seeded hash), never seen by SFT or RL training."""

from __future__ import annotations

import hashlib
from collections import Counter

from . import prompts
from .extract import normalise_code
from .infill import split_for_infilling
from ..judgement import Protocol, judge

STRUCTURAL_LEVEL = 3


def verdict(measurement: dict | None, threshold: float, robust: bool,
            protocol: Protocol) -> str:
    """Why a corpus sample is kept or not, in the harness verdict's words: accepted |
    not_measured | not_compiled | incorrect | flagged | no_speedup | below_threshold (point
    speedup above p)."""
    return judge(measurement, protocol=protocol, robust=robust, threshold=threshold,
                 statistic="median")


def is_solution(measurement: dict | None, robust: bool, protocol: Protocol) -> bool:
    """A working (correct) kernel exists for this reference, whatever its speed."""
    return judge(measurement, protocol=protocol, robust=robust) == "accepted"


def estimate_level(reference_code: str) -> int:
    """A KernelBench-like level for a reference without one (curriculum ordering only):
    1 = one operator call in `forward`, 2 = a few (up to 6: a fusion), 3 = more (a model).
    Counts the calls in every `forward` body; an unparsable program counts as 3."""
    import ast

    try:
        tree = ast.parse(reference_code)
    except (SyntaxError, ValueError):
        return 3
    calls = sum(isinstance(node, ast.Call)
                for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef) and fn.name == "forward"
                for node in ast.walk(fn))
    return 1 if calls <= 1 else 2 if calls <= 6 else 3


def sample_level(sample: dict) -> int:
    """The source's level when it has one, else `estimate_level` of the reference."""
    return int(sample.get("level") or estimate_level(sample["reference_code"]))


def reference_key(reference_code: str) -> str:
    return hashlib.sha256(normalise_code(reference_code).encode()).hexdigest()[:16]


def held_out_references(reference_keys: list[str], fraction: float, minimum: int, seed: int) -> set[str]:
    """A seeded, order-independent choice of reference programs for validation."""
    unique = sorted(set(reference_keys))
    ranked = sorted(unique, key=lambda k: hashlib.sha256(f"{seed}:{k}".encode()).hexdigest())
    count = max(round(fraction * len(unique)), min(minimum, len(unique) - 1)) if unique else 0
    return set(ranked[:max(count, 0)])


def assemble(samples: list[dict], measurements: dict[str, dict], structural: list[dict],
             settings: dict, protocol: Protocol) -> tuple[dict[str, list[dict]], dict]:
    """Return the splits {sft, rl_infill, rl_e2e, val} (lists of rows) and stats."""
    threshold, robust = settings["speedup_threshold"], settings["robust"]
    reasons: Counter = Counter()
    per_source: Counter = Counter()
    per_level: Counter = Counter()
    kept, solved = [], []
    for sample in samples:
        m = measurements.get(sample["sample_id"])
        why = verdict(m, threshold, robust, protocol)
        reasons[why] += 1
        if why == "accepted":
            kept.append(sample)
        if is_solution(m, robust, protocol):
            solved.append(sample)
    for row in structural:
        kept.append({**row, "level": row.get("level") or STRUCTURAL_LEVEL})
        solved.append(kept[-1])
        reasons["structural"] += 1

    kept.sort(key=lambda s: s["sample_id"])
    solved.sort(key=lambda s: s["sample_id"])
    val_keys = held_out_references([reference_key(s["reference_code"]) for s in solved],
                                   settings["val_fraction"], settings["min_val_samples"], settings["seed"])

    def held_out(sample):
        return reference_key(sample["reference_code"]) in val_keys

    splits = {"sft": [], "rl_infill": [], "rl_e2e": [], "val": []}
    seen_sft = set()
    for sample in kept:
        if held_out(sample) or sample["sample_id"] in seen_sft:
            continue
        seen_sft.add(sample["sample_id"])
        origin = "structural" if sample["source"] == "structural" else "corpus"
        per_source[sample["source"]] += 1
        per_level[str(sample.get("level"))] += 1
        splits["sft"].append({
            "sample_id": sample["sample_id"], "origin": origin, "level": sample.get("level"),
            # a source's own prompt verbatim (CuKe's), else the project's wording
            "prompt": sample.get("prompt") or prompts.end_to_end_prompt(sample["reference_code"],
                                                                        sample["backend"]),
            "response": prompts.response_text(sample["candidate_code"]),
        })
        pieces = split_for_infilling(sample["candidate_code"])
        if pieces is None:
            reasons["infill_no_core"] += 1
            continue
        prefix, core, suffix = pieces
        if settings.get("sft_infill"):  # the same row once more, asked for in RL stage 1's form
            splits["sft"].append({
                **splits["sft"][-1], "sample_id": sample["sample_id"] + ":infill",
                "prompt": prompts.infilling_prompt(sample["reference_code"], prefix, suffix, sample["backend"]),
            })
        splits["rl_infill"].append({
            "sample_id": sample["sample_id"], "level": sample_level(sample),
            "reference_code": sample["reference_code"],
            "candidate_code": sample["candidate_code"], "prefix": prefix, "core": core,
            "suffix": suffix,
            "prompt": prompts.infilling_prompt(sample["reference_code"], prefix, suffix, sample["backend"]),
        })
    seen_refs: dict[str, set] = {"rl_e2e": set(), "val": set()}
    for sample in solved:
        split = "val" if held_out(sample) else "rl_e2e"
        key = reference_key(sample["reference_code"])
        if key in seen_refs[split]:
            continue
        seen_refs[split].add(key)
        row = {
            "sample_id": sample["sample_id"], "level": sample_level(sample),
            "reference_code": sample["reference_code"],
            "prompt": prompts.end_to_end_prompt(sample["reference_code"], sample["backend"]),
        }
        if split == "val":  # RL stage 1 selects on infilling prompts of held-out references
            pieces = split_for_infilling(sample["candidate_code"])
            row["infill_prompt"] = None if pieces is None else prompts.infilling_prompt(
                sample["reference_code"], pieces[0], pieces[2], sample["backend"])
        splits[split].append(row)
    for split in ("rl_e2e", "val"):  # curriculum: single operators first, whole models last
        splits[split].sort(key=lambda r: (r["level"], r["sample_id"]))
    splits["sft"].sort(key=lambda r: r["sample_id"])
    splits["rl_infill"].sort(key=lambda r: (r["level"], r["sample_id"]))
    stats = {
        "speedup_threshold": threshold,
        "robust": robust,
        "protocol": protocol.name,
        "samples": len(samples),
        "structural": len(structural),
        "reasons": dict(sorted(reasons.items())),
        "sft_per_source": dict(sorted(per_source.items())),
        "sft_per_level": dict(sorted(per_level.items())),
        "split_sizes": {k: len(v) for k, v in splits.items()},
    }
    return splits, stats


def kept_at_thresholds(samples: list[dict], measurements: dict[str, dict], thresholds, robust: bool,
                       protocol: Protocol) -> dict:
    """How many corpus samples each threshold would keep (the ablation at a glance)."""
    return {str(t): sum(verdict(measurements.get(s["sample_id"]), t, robust, protocol) == "accepted"
                        for s in samples)
            for t in thresholds}
