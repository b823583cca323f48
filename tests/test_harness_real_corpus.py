"""bench/harness_real_corpus.py's judging and summary on hand-built result rows (cpu, no harness run)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from kernelharness.results import empty_row
from dicepipe.judgement import Protocol

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "harness_real_corpus.py"
# the corpus rows measured before KernelBench's own trials were recorded carry the strict check's `tolerance_needed` only: judged
# here by strict-check protocols at KernelBench main's and v0's tolerances
PROFILES = {"kernelbench": Protocol("kernelbench", "strict", 1e-4, 1e-2),
            "kernelbench_v0": Protocol("kernelbench_v0", "strict", 1e-2, 1e-2)}


@pytest.fixture(scope="module")
def corpus_script():
    spec = importlib.util.spec_from_file_location("harness_real_corpus", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def result(job_id, *, compiled=True, correct=True, needed=0.0, precision="fp32", legacy=False,
           max_abs_error=None, launch_bound=False, error_phase=None, **flags):
    row = empty_row(job_id, "cuda")
    row.update(compiled=compiled, correct=correct, launch_bound=launch_bound,
               error_phase=error_phase, max_abs_error=max_abs_error, **flags)
    row.pop("tolerance_needed", None)
    row.pop("output_precision", None)
    if not legacy:
        row.update(tolerance_needed=needed, output_precision=precision)
    return row


MANIFEST = {
    "a__L1_1_0": {"source": "a", "problem_name": "1_Matmul", "expected": "correct"},
    "a__L1_2_0": {"source": "a", "problem_name": "2_Matmul", "expected": "correct"},
    "a__L1_3_0": {"source": "a", "problem_name": "3_Relu", "static_hints": ["try/except"]},
    "b__L2_1_0": {"source": "b", "problem_name": "1_Conv", "expected": "correct"},
    "b__L2_2_0": {"source": "b", "problem_name": "2_Conv"},
    "b__L2_3_0": {"source": "b", "problem_name": "3_Conv"},
    "c__L1_4_0": {"source": "c", "problem_name": "4_Any", "label": "no_custom_kernel"},
}


def judged(corpus_script):
    rows = [
        result("a__L1_1_0", needed=1e-6),  # right at every protocol
        result("a__L1_2_0", needed=2e-3),  # TF32-like: only the v0 protocol accepts it
        result("a__L1_3_0", needed=0.0, flag_try_fallback=True, launch_bound=True),
        result("b__L2_1_0", compiled=False, correct=False, needed=None, error_phase="build"),
        result("b__L2_2_0", legacy=True, max_abs_error=5e-5),  # old row: fallback on the error
        result("b__L2_3_0", legacy=True, max_abs_error=5e-3, correct=False),
        # loaded past its own failed build (a try/except around load_inline): torch did it
        result("c__L1_4_0", needed=0.0, precision="exact", flag_no_kernel=True,
               flag_ext_not_called=True, compile_log_tail="main.cpp:4: error: 'f' undeclared"),
    ]
    return corpus_script.per_kernel_rows(rows, MANIFEST, PROFILES)


def test_profiles_and_fallback(corpus_script):
    by_id = {r["job_id"]: r for r in judged(corpus_script)}
    assert by_id["a__L1_1_0"]["correct_kernelbench"] and by_id["a__L1_1_0"]["correct_kernelbench_v0"]
    assert not by_id["a__L1_2_0"]["correct_kernelbench"]
    assert by_id["a__L1_2_0"]["correct_kernelbench_v0"]
    assert by_id["a__L1_3_0"]["correct_kernelbench"]
    assert not by_id["a__L1_3_0"]["correct_kernelbench_robust"]
    assert not by_id["b__L2_1_0"]["correct_kernelbench_v0"]
    assert by_id["b__L2_2_0"]["correct_basis"] == "max_abs_error"
    assert by_id["b__L2_2_0"]["correct_kernelbench"]
    assert not by_id["b__L2_3_0"]["correct_kernelbench"]
    assert by_id["b__L2_3_0"]["correct_kernelbench_v0"]
    assert by_id["c__L1_4_0"]["flags"] == "ext_not_called,no_kernel"


def test_summary_counts(corpus_script):
    rows = judged(corpus_script)
    summary = corpus_script.summarize(rows, list(PROFILES))
    total = summary["total"]
    assert total == {"kernels": 7, "compiled": 6, "compiled_build_failed": 1,
                     "launch_bound": 1, "flagged": 2,
                     "correct_kernelbench": 4, "correct_kernelbench_robust": 2,
                     "correct_kernelbench_v0": 6, "correct_kernelbench_v0_robust": 4}
    assert summary["by_source"]["b"]["kernels"] == 3
    assert summary["by_source"]["b"]["correct_kernelbench_v0"] == 2
    assert summary["by_flag"]["flag_try_fallback"] == 1
    assert summary["by_flag"]["flag_output_alias"] == 0
    assert summary["profiles_disagree"] == ["a__L1_2_0", "b__L2_3_0"]
    assert summary["source_says_correct_harness_not"] == ["b__L2_1_0"]
    assert summary["correct_basis"] == {"tolerance_needed": 5, "max_abs_error": 2}
    assert [f["job_id"] for f in summary["flagged"]] == ["a__L1_3_0", "c__L1_4_0"]


def test_summary_text_names_every_flagged_kernel(corpus_script, tmp_path):
    rows = judged(corpus_script)
    summary = corpus_script.summarize(rows, list(PROFILES))
    lines = corpus_script.format_summary(summary, list(PROFILES))
    text = "\n".join(lines)
    assert lines[0].startswith("all: 6/7 compiled (1 of them past a failed build of their own); "
                               "kernelbench: 4 correct, 2 robust; "
                               "kernelbench_v0: 6 correct, 4 robust; 2 flagged, 1 launch-bound")
    assert "a__L1_3_0: try_fallback" in text
    assert "c__L1_4_0: ext_not_called,no_kernel" in text and "label=no_custom_kernel" in text
    corpus_script.write_outputs(rows, summary, lines, tmp_path / "out")
    csv_header = (tmp_path / "out" / "per_kernel.csv").read_text().splitlines()[0]
    assert "correct_kernelbench_v0_robust" in csv_header and "ref_runtime_ms" not in csv_header
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["total"]["kernels"] == 7


def test_corpus_jobs_pair_by_name(corpus_script, tmp_path):
    for sub in ("candidates", "references", "references_source"):
        (tmp_path / sub).mkdir()
    for key in ("x__L1_1_0", "y__L1_2_0"):
        (tmp_path / "candidates" / f"{key}.py").write_text(f"# cand {key}\n")
        (tmp_path / "references" / f"{key}.py").write_text(f"# parquet ref {key}\n")
    (tmp_path / "references_source" / "x__L1_1_0.py").write_text("# source ref\n")
    manifest = {"x__L1_1_0": {"source": "x"}, "y__L1_2_0": {"source": "y"}}
    jobs = corpus_script.corpus_jobs(tmp_path, "references_source", None, manifest, None)
    assert [(j.job_id, j.reference_code) for j in jobs] == [
        ("x__L1_1_0", "# source ref\n"), ("y__L1_2_0", "# parquet ref y__L1_2_0\n")]
    only_y = corpus_script.corpus_jobs(tmp_path, "references", ["y"], manifest, None)
    assert [j.job_id for j in only_y] == ["y__L1_2_0"]
