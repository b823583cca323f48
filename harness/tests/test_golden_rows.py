"""Golden rows: what the harness records for the shipped seed suite and for the build's edge
cases, held against tests/golden/rows.json. A change that alters any recorded field of these
rows fails here unless it raises METHOD_VERSION (kernelharness/method.py) and re-records, so
"a row means what it meant" is checked, not remembered: the pipeline's runners track the
method version instead of the harness's source files, and trust stored rows by it.

Recorded fields are a row's meaning: whether it compiled, each check's outcome, the input
variants run, the deception flags, how many builds it needed, where and why it failed.
Timings, wall times, cache hits, tolerances' exact floats and the sandbox features (this
machine's) are measurements, not meaning, and are left out.

The edge cases are where a faster build could change a verdict: a kernel that relies on a
header the full torch header brings in (minimal headers must fall back, not fail it); a call
to a function declared nowhere (a compiler error under every header set); a binding naming a
function the source lacks (the binding check); and two candidates sharing one failing
extension (one build, the same error in both rows).

CI runs the edge cases and a subset of the seed suite (SUBSET); KERNELHARNESS_GOLDEN_ALL=1
runs all 24 pairs. Re-record (after raising METHOD_VERSION, with a CHANGELOG.md entry):

    python harness/tests/test_golden_rows.py record
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
from kernelharness.testing import reference

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden" / "rows.json"
SEED = HERE.parent.parent / "data" / "seed" / "corpus"  # the repository's shipped seed suite
# one pair of each level and kind: elementwise, row reductions, a GEMM, fused blocks, a model
SUBSET = ("relu", "softmax_rows", "layer_norm", "matmul_square", "swiglu", "lstm_cell")
RECORDED = ("compiled", "correct", "correct_robust", "correct_trials_passed", "output_precision",
            "variants_run", "reference_input_insensitive", "uses_vendor_library",
            "timed_outputs_checked", "builds_total", "timing_mode", "error_phase")

REF = reference("torch.relu(x)")  # [64, 256] inputs


def _candidate(name: str, source: str, functions: list[str], call: str) -> str:
    return f'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>
{source}
"""
ext = load_inline(name="{name}", cpp_sources=[source], functions={functions!r},
                  extra_cflags=["-O2"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return {call}
'''


RELU_BODY = '''
torch::Tensor relu_fwd(torch::Tensor x) {
    auto input = x.contiguous();
    auto out = torch::empty_like(input);
    const float* src = input.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    for (int64_t i = 0; i < input.numel(); ++i) dst[i] = src[i] > 0.0f ? src[i] : 0.0f;
    return out;
}
'''
# std::accumulate and std::vector come from headers torch/extension.h brings in, never named
TRANSITIVE = '''
torch::Tensor relu_fwd(torch::Tensor x) {
    std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
    int64_t n = std::accumulate(sizes.begin(), sizes.end(), int64_t{1}, std::multiplies<int64_t>());
    auto input = x.contiguous();
    auto out = torch::empty_like(input);
    const float* src = input.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i] > 0.0f ? src[i] : 0.0f;
    return out;
}
'''
UNDECLARED = '''
torch::Tensor relu_fwd(torch::Tensor x) {
    return relu_helper_declared_nowhere(x);
}
'''
SHARED_BROKEN = '''
torch::Tensor relu_fwd(torch::Tensor x) {
    return x.clamp_min(0)  // a missing semicolon
}
'''
EDGE_CASES = {
    "edge_transitive_include": _candidate("golden_transitive", TRANSITIVE, ["relu_fwd"],
                                          "ext.relu_fwd(x)"),
    "edge_missing_declaration": _candidate("golden_undeclared", UNDECLARED, ["relu_fwd"],
                                           "ext.relu_fwd(x)"),
    "edge_binding_names_missing_function": _candidate(
        "golden_binding", RELU_BODY, ["relu_fwd", "relu_bwd"], "ext.relu_fwd(x)"),
    "edge_shared_error_a": _candidate("golden_shared", SHARED_BROKEN, ["relu_fwd"],
                                      "ext.relu_fwd(x)"),
    "edge_shared_error_b": _candidate("golden_shared", SHARED_BROKEN, ["relu_fwd"],
                                      "ext.relu_fwd(x) * 1.0"),
}


def jobs(names: list[str] | None = None):
    from kernelharness import Job

    out = []
    pairs = sorted(p.stem for p in (SEED / "kernels").glob("*.py"))
    for stem in pairs if names is None else [n for n in pairs if n in names]:
        out.append(Job(job_id=stem, reference_code=(SEED / "reference" / f"{stem}.py").read_text(),
                       candidate_code=(SEED / "kernels" / f"{stem}.py").read_text(),
                       backend="cpu"))
    out += [Job(job_id=k, reference_code=REF, candidate_code=v, backend="cpu")
            for k, v in EDGE_CASES.items()]
    return out


def error_kind(text: str | None) -> str | None:
    """An error's first line without what varies by machine and run (paths, numbers,
    quoted compiler output): the kind of failure, which a change of method would alter."""
    if not text:
        return None
    first = text.strip().splitlines()[0]
    first = re.sub(r"(/[\w.@+-]+)+", "<path>", first)
    first = re.sub(r"\d+(\.\d+)?", "<n>", first)
    return first[:120]


def recorded(row: dict) -> dict:
    """The fields of a row that are its meaning (the module docstring)."""
    out = {name: row.get(name) for name in RECORDED}
    out["flags"] = sorted(k[5:] for k, v in row.items() if k.startswith("flag_") and v)
    out["kernelbench_trials"] = len(row.get("kb_trial_tolerance") or [])
    out["error"] = error_kind(row.get("error"))
    return out


def measure(job_list, cache_dir: Path) -> dict:
    from kernelharness import HarnessSettings, evaluate

    settings = HarnessSettings.with_defaults(
        warmup_trials=1, timing_trials=10, timing_trials_cpu=10, build_workers=2,
        cache_dir=str(cache_dir))
    table = evaluate(job_list, settings, progress=False)
    return {row["job_id"]: recorded(row) for row in table.to_pylist()}


def differences(found: dict, golden: dict) -> list[str]:
    """Rows of `found` whose recorded fields differ from the golden ones, field by field."""
    out = []
    for job_id, row in sorted(found.items()):
        if job_id not in golden:
            out.append(f"{job_id}: no golden row (record them: this file's docstring)")
            continue
        out += [f"{job_id}.{name}: golden {golden[job_id].get(name)!r}, now {value!r}"
                for name, value in row.items() if golden[job_id].get(name) != value]
    return out


@pytest.mark.slow
def test_recorded_fields_hold_unless_the_method_version_is_raised(build_cache_dir):
    from kernelharness.method import METHOD_VERSION

    if not SEED.is_dir():
        pytest.skip(f"the seed suite ({SEED}) is not beside this harness")
    golden = json.loads(GOLDEN.read_text())
    assert golden["method_version"] == METHOD_VERSION, (
        f"METHOD_VERSION is {METHOD_VERSION}, the golden rows are of "
        f"{golden['method_version']}: re-record them (this file's docstring)")
    names = None if os.environ.get("KERNELHARNESS_GOLDEN_ALL") else list(SUBSET)
    found = measure(jobs(names), build_cache_dir)
    problems = differences(found, golden["rows"])
    assert not problems, (
        "recorded fields changed without raising METHOD_VERSION (kernelharness/method.py): "
        "raise it, say what it re-measures in CHANGELOG.md and re-record, or undo the "
        "change:\n" + "\n".join(problems))


def test_a_changed_field_is_a_difference():
    golden = json.loads(GOLDEN.read_text())["rows"]
    changed = {k: dict(v) for k, v in golden.items()}
    job_id = sorted(changed)[0]
    changed[job_id]["compiled"] = not changed[job_id]["compiled"]
    assert differences(changed, golden) == [
        f"{job_id}.compiled: golden {golden[job_id]['compiled']!r}, now "
        f"{changed[job_id]['compiled']!r}"]
    assert differences(golden, golden) == []


def test_the_edge_cases_and_the_seed_suite_are_recorded():
    golden = json.loads(GOLDEN.read_text())
    assert set(EDGE_CASES) | set(SUBSET) <= set(golden["rows"])
    rows = golden["rows"]
    # the edge cases mean what they are for
    assert rows["edge_transitive_include"]["compiled"] and rows["edge_transitive_include"]["correct"]
    for name in ("edge_missing_declaration", "edge_binding_names_missing_function",
                 "edge_shared_error_a", "edge_shared_error_b"):
        assert not rows[name]["compiled"], name
    assert rows["edge_shared_error_a"]["error"] == rows["edge_shared_error_b"]["error"]


def record() -> None:
    import tempfile

    from kernelharness.method import METHOD_VERSION

    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(os.environ.get("KERNELHARNESS_TEST_CACHE") or Path(tmp) / "cache")
        found = measure(jobs(None), cache)
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps({"method_version": METHOD_VERSION, "rows": found}, indent=1,
                                 sort_keys=True) + "\n")
    print(f"{len(found)} rows written to {GOLDEN}")


if __name__ == "__main__":
    if sys.argv[1:] != ["record"]:
        sys.exit(__doc__)
    record()
