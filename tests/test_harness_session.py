"""The harness session: warm workers, de-duplication, correctness-only mode, resume by
content, worker hygiene, visible GPUs and honest bookkeeping."""

from __future__ import annotations

import os
import stat
import tempfile
import textwrap
from dataclasses import fields, replace

import pytest
from dicepipe.errors import HarnessError
from kernelharness import FLAG_COLUMNS, HarnessSession, HarnessSettings, evaluate, hygiene
from kernelharness.compilation.buildspec import local_cuda_arch
from kernelharness.gpus import nvidia_smi_selector, visible_list, worker_device_ids
from kernelharness.settings import MEASUREMENT_FIELDS, OPERATIONAL_FIELDS
from kernelharness.worker.sandbox import scrubbed_env
from kernelharness.testing import RELU_REF, by_id, job, python_candidate, reference, settings

GOOD = python_candidate("return x.clamp_min(0)")
WRONG = python_candidate("return x")
HANG = python_candidate("import time\ntime.sleep(3600)\nreturn x")
VERDICT_COLUMNS = ("compiled", "correct", "correct_robust", "correct_trials_passed",
                   "max_abs_error", "error", "error_phase", *FLAG_COLUMNS)


# --- settings split (pure) ------------------------------------------------------------------

def test_temporary_folders_are_checked(harness_tempdir):
    """conftest's harness_tempdir points tempfile here and fails a test that leaves anything."""
    assert tempfile.gettempdir() == str(harness_tempdir)


def test_every_setting_is_classified_once():
    names = [f.name for f in fields(HarnessSettings)]
    groups = MEASUREMENT_FIELDS + OPERATIONAL_FIELDS
    assert sorted(groups) == sorted(names), "classify each HarnessSettings field exactly once"


def test_the_split_is_params_yaml_harness_measure_and_run():
    """What changes a row is harness.measure (plus what the caller sets), what does not is
    harness.run: the schema's sections and the settings' split say the same."""
    from dicepipe.config import schema_defaults

    defaults = schema_defaults("harness")
    caller = {"repeats", "decision_thresholds", "timing_gate", "kernelbench_timing", "devices"}
    assert set(defaults["measure"]) == set(MEASUREMENT_FIELDS) - caller
    assert set(defaults["run"]) == set(OPERATIONAL_FIELDS) - caller


def test_one_rule_names_the_stored_results(tmp_path):
    """harness.stored_results: one store per measurement setup; a run-only setting shares it,
    a measurement setting (or the caller's repeats and thresholds) gets its own."""
    from kernelharness import stored_results

    base = settings(tmp_path)
    path = stored_results(tmp_path / "resume", "1-of-2", base)
    assert path.parent == tmp_path / "resume" and path.name.startswith("1-of-2-")
    assert path.suffix == ".parquet"
    for name, value in [("cache_dir", str(tmp_path / "other")), ("build_workers", 7),
                        ("use_pch", True), ("build_timeout_s", 1.0), ("devices", (0,))]:
        assert stored_results(tmp_path / "resume", "1-of-2", replace(base, **{name: value})) == path
    for name, value in [("correct_trials", 3), ("repeats", 2), ("decision_thresholds", (2.0,)),
                        ("timing_gate", "strict"), ("run_timeout_s", 5)]:
        assert stored_results(tmp_path / "resume", "1-of-2", replace(base, **{name: value})) != path
    # `dicepipe score --out`: the file the user names
    assert stored_results(None, "scores.parquet", base).name == "scores.parquet"


def test_measurement_key_ignores_how_rows_are_made(tmp_path):
    base = settings(tmp_path)
    for name, value in [("cache_dir", str(tmp_path / "other")), ("build_workers", 7),
                        ("use_pch", True), ("build_timeout_s", 1.0)]:
        assert replace(base, **{name: value}).measurement_key() == base.measurement_key(), name
    for name, value in [("correct_trials", 3), ("timing_trials", 20), ("seed", 1),
                        ("cuda_graphs", True), ("cpu_threads", 2), ("run_timeout_s", 5)]:
        assert replace(base, **{name: value}).measurement_key() != base.measurement_key(), name


# --- hygiene decisions (pure) ---------------------------------------------------------------

def test_leak_decisions():
    limits = hygiene.leak_limits_mb(4096, 81920.0)
    assert limits == {"host_mb": 256.0, "device_used_mb": 4096.0}
    # the default limit (65,536 MB, sized for KernelBench's largest reference) leaks at 1 GiB
    assert hygiene.leak_limits_mb(65536, None) == {"host_mb": 1024.0}
    excess = hygiene.excess_mb({"host_mb": 250.0, "device_used_mb": 600.0},
                               {"host_mb": 2500.0, "device_used_before_mb": 9000.0,
                                "device_used_mb": 9100.0})
    assert excess == {"host_mb": 2250.0, "device_used_mb": 100.0}
    assert hygiene.leaked(excess, limits) == ["host +2250 MB"]
    # the device is shared: what others took between jobs (9000 - 600) never counts, and
    # per-job changes add up (a job that frees what an earlier one left brings it back)
    later = hygiene.excess_mb({}, {"device_used_before_mb": 20000.0, "device_used_mb": 25000.0},
                              excess)
    assert later["device_used_mb"] == 5100.0 and hygiene.leaked(later, limits) == ["device_used +5100 MB"]
    freed = hygiene.excess_mb({}, {"device_used_before_mb": 25000.0, "device_used_mb": 19000.0},
                              later)
    assert freed["device_used_mb"] == 0.0
    assert hygiene.leaked({"host_mb": 100.0}, limits) == []
    assert hygiene.holds_excess({"host_mb": 200.0}) and not hygiene.holds_excess({"host_mb": 5.0})
    assert hygiene.memory_failure({"op": "failed", "kind": "memory", "error": "x"})
    assert hygiene.memory_failure({"op": "result", "row": {"error": "torch.OutOfMemoryError"}})
    assert not hygiene.memory_failure({"op": "result", "row": {"error": "trial 0: mismatch"}})


# --- visible GPUs (no GPU needed) -----------------------------------------------------------

def test_workers_get_the_parents_gpus():
    assert worker_device_ids(None, 2, "2,3") == ["2", "3"]
    assert worker_device_ids((1,), 2, "2,3") == ["3"]
    assert worker_device_ids(None, 2, None) == ["0", "1"]
    uuids = "GPU-aaaa-1111,GPU-bbbb-2222"
    assert worker_device_ids(None, 2, uuids) == ["GPU-aaaa-1111", "GPU-bbbb-2222"]
    assert visible_list("0,1,,3") == ["0", "1"]  # CUDA stops at the first invalid entry
    with pytest.raises(HarnessError, match="not visible"):
        worker_device_ids((2,), 2, "2,3")


def test_scrubbed_env_keeps_the_visible_list(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.setenv("SECRET_TOKEN", "x")
    env = scrubbed_env()
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and "SECRET_TOKEN" not in env
    assert scrubbed_env({"CUDA_VISIBLE_DEVICES": "3"})["CUDA_VISIBLE_DEVICES"] == "3"


def test_arch_detection_asks_only_about_visible_gpus(tmp_path, monkeypatch):
    calls = tmp_path / "calls.txt"
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\necho 9.0\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert local_cuda_arch() == "9.0"
    assert calls.read_text().split()[:2] == ["-i", "2,3"]
    assert nvidia_smi_selector(None) == [] and nvidia_smi_selector("MIG-abc") is None


def test_device_workers_map_logical_to_physical(tmp_path, monkeypatch):
    from kernelharness import orchestrator

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.setattr(orchestrator, "visible_count", lambda: 2)
    tool = {"builder": 1, "cuda_arch": "9.0"}
    with orchestrator.Batch(settings(tmp_path), ["cuda"], {"cuda": tool}) as batch:
        ids = [w.env_extra["CUDA_VISIBLE_DEVICES"] for w in batch.devices["cuda"]]
    assert ids == ["2", "3"]  # workers are never started here: no GPU needed


# --- the session on CPU ---------------------------------------------------------------------

def test_session_keeps_workers_warm_and_evaluates_each_content_once(build_cache_dir):
    with HarnessSession(settings(build_cache_dir)) as session:
        first = by_id(session.evaluate([job("a", RELU_REF, GOOD), job("b", RELU_REF, GOOD),
                                        job("w", RELU_REF, WRONG)], progress=False))
        assert session.last_summary.measured == 2 and session.last_summary.copied == 1
        worker = session._batch.devices["cpu"][0]
        pid = worker.proc.pid
        second = by_id(session.evaluate([job("a", RELU_REF, GOOD), job("c", RELU_REF, GOOD)],
                                        progress=False))
        assert session.last_summary.measured == 0 and session.last_summary.copied == 2
        assert worker.proc.pid == pid, "the device worker was restarted between calls"
    assert first["a"]["correct"] and not first["w"]["correct"]
    assert not first["a"]["reused"] and first["b"]["reused"] and second["c"]["reused"]
    assert first["b"]["speedup_median"] == first["a"]["speedup_median"]
    assert first["b"]["wall_time_s"] == 0.0 and first["a"]["wall_time_s"] > 0.0
    assert first["a"]["content_key"] == second["c"]["content_key"] != first["w"]["content_key"]


def test_correctness_only_mode_never_times(build_cache_dir):
    with HarnessSession(settings(build_cache_dir)) as session:
        rows = by_id(session.evaluate([job("a", RELU_REF, GOOD), job("w", RELU_REF, WRONG)],
                                      progress=False, measure_speed=False))
        timed = by_id(session.evaluate([job("a", RELU_REF, GOOD)], progress=False))
    assert rows["a"]["correct"] and not rows["w"]["correct"]
    assert rows["a"]["num_repeats"] == 0 and rows["a"]["speedup_median"] is None
    assert rows["a"]["timing_mode"] is None and rows["a"]["wall_timing_s"] == 0.0
    assert timed["a"]["num_repeats"] >= 1 and not timed["a"]["reused"]  # another content key


def test_changed_candidate_under_the_same_out_is_measured_again(build_cache_dir, tmp_path):
    out = tmp_path / "results.parquet"
    cfg = settings(build_cache_dir)
    with HarnessSession(cfg) as session:
        session.evaluate([job("k", RELU_REF, GOOD)], out, progress=False)
    with HarnessSession(cfg) as session:
        swapped = by_id(session.evaluate([job("k", RELU_REF, WRONG)], out, progress=False))["k"]
        assert session.last_summary.stale_in_store == 1 and session.last_summary.measured == 1
    assert not swapped["correct"]
    with HarnessSession(cfg) as session:
        again = by_id(session.evaluate([job("k", RELU_REF, WRONG)], out, progress=False))["k"]
        assert session.last_summary.from_store == 1 and session.last_summary.measured == 0
    for name in ("content_key", "wall_time_s", "correct", "max_abs_error", "reused"):
        assert again[name] == swapped[name], name
    with HarnessSession(replace(cfg, correct_trials=3)) as session:
        session.evaluate([job("k", RELU_REF, WRONG)], out, progress=False)
        assert session.last_summary.measured == 1, "a measuring setting changed"


def test_a_hang_reports_the_time_it_used(build_cache_dir):
    row = by_id(evaluate([job("hang", RELU_REF, HANG)],
                         settings(build_cache_dir, run_timeout_s=3), progress=False))["hang"]
    assert row["error"].startswith("timeout") and row["wall_time_s"] >= 3.0


# A job that keeps 2 GB alive after it ends (a global the next job's worker still holds),
# then an honest job whose inputs need a few hundred MB: on the same worker it would pass the
# 3 GB memory limit. (At 1.5 GB the honest job's failure without hygiene depended on how the
# leaking job's own timing had left the worker's heap; 1.8 GB stopped being enough once a
# device worker no longer imported the host's session machinery: too close to the limit.)
LEAK_MB = 2000
LEAKY = python_candidate(f"""
if not hasattr(torch, "_held"):
    torch._held = torch.ones({LEAK_MB} * 2**18)  # never freed: lives in the torch module
return x.clamp_min(0)
""")
BIG_RELU_REF = reference("torch.relu(x)", shape="2048, 8192")


def test_a_leaking_job_does_not_change_the_next_row(build_cache_dir):
    cfg = settings(build_cache_dir, memory_limit_mb=3072)
    alone = by_id(evaluate([job("honest", BIG_RELU_REF, GOOD)], cfg, progress=False))["honest"]
    with HarnessSession(cfg) as session:
        after = by_id(session.evaluate([job("leak", BIG_RELU_REF, LEAKY),
                                        job("honest", BIG_RELU_REF, GOOD)], progress=False))
        assert session._batch.devices["cpu"][0].restarts >= 1, "the leaking worker was kept"
    assert alone["correct"], alone["error"]
    for name in VERDICT_COLUMNS:
        assert after["honest"][name] == alone[name], name


def test_leak_test_can_fail(build_cache_dir, monkeypatch):
    """Without hygiene, the honest job after the leak is harmed: the test above means something.
    The checks' memory plans now keep it correct in what memory is left, so the harm shows as
    its timing skipped for want of room (no speedup), or as a failure."""
    cfg = settings(build_cache_dir, memory_limit_mb=3072)
    monkeypatch.setattr(hygiene, "leak_limits_mb", lambda *a: {})  # never replace a worker
    rows = by_id(evaluate([job("leak", BIG_RELU_REF, LEAKY),
                           job("honest", BIG_RELU_REF, GOOD)], cfg, progress=False))
    honest = rows["honest"]
    assert not honest["correct"] or "timing and the post-timing check skipped" in (honest["error"] or ""), honest


GPU_LEAKY = python_candidate(textwrap.dedent("""
if not hasattr(torch, "_held"):
    free, _total = torch.cuda.mem_get_info()
    torch._held = torch.empty(int(free * 0.98), dtype=torch.uint8, device="cuda")
return x.clamp_min(0)
"""))


@pytest.mark.gpu
def test_a_cuda_leak_does_not_change_the_next_row(build_cache_dir):
    big = reference("torch.relu(x)", shape="16384, 16384")  # 1 GiB a tensor
    cfg = settings(build_cache_dir)
    alone = by_id(evaluate([job("honest", big, GOOD, "cuda")], cfg, progress=False))["honest"]
    rows = by_id(evaluate([job("leak", big, GPU_LEAKY, "cuda"), job("honest", big, GOOD, "cuda")],
                          cfg, progress=False))
    assert alone["correct"], alone["error"]
    for name in VERDICT_COLUMNS:
        assert rows["honest"][name] == alone[name], name


def test_progress_counts_builds_as_they_finish():
    """The bar's postfix says how many of this call's builds are done (cold shards)."""
    from types import SimpleNamespace

    from kernelharness.orchestrator import Batch

    shown = []
    bar = SimpleNamespace(set_postfix_str=lambda text, refresh=True: shown.append(text))
    batch = Batch.__new__(Batch)  # only its build services matter here
    batch.builds = {"cpu": SimpleNamespace(compiles_started=5, compiles_finished=2)}
    batch._show_builds(bar, (1, 0))  # one build was started by an earlier call
    assert shown == ["built 2/4"]
    batch._show_builds(bar, (5, 2))  # nothing of this call compiles: no postfix
    assert shown == ["built 2/4"]
