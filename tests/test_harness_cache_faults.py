"""Faults in the build cache and the resume store: every entry is checked against the hash
written with it, a damaged one is rebuilt once and reported, never blamed on the candidate;
re-measurement on request; `dicepipe cache verify|prune`; a reference failing on its own in
`dicepipe score`.

One extension is built for the module (a module of a few lines that includes only Python.h,
so each rebuild takes a second); every test damages its own copy of that cache.
"""

from __future__ import annotations

import shutil
import textwrap

import pyarrow.parquet as pq
import pytest
from dicepipe.cli import main
from kernelharness import HarnessSession, evaluate
from kernelharness.compilation.buildspec import check_build
from kernelharness.compilation.entries import write_checked
from kernelharness.results import ResultStore, empty_row, finish_row
from kernelharness.session import REMEASURE_ENV, remeasure_asked
from kernelharness.testing import RELU_REF, by_id, job, python_candidate, settings

TINY_EXTENSION = textwrap.dedent('''
    import torch
    import torch.nn as nn
    from torch.utils.cpp_extension import load_inline

    source = r"""
    #include <Python.h>
    #define DP_CAT(a, b) a##b
    #define DP_INIT(name) DP_CAT(PyInit_, name)
    static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "tiny", nullptr, -1, nullptr};
    PyMODINIT_FUNC DP_INIT(TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&module_def); }
    """
    ext = load_inline(name="cache_fault_tiny", cpp_sources=[source], functions=None,
                      no_implicit_headers=True)


    class ModelNew(nn.Module):
        def forward(self, x):
            return torch.relu(x)
    ''')
# fails before the candidate is loaded: a job that builds the extension but never imports it
REFERENCE_RAISING_ON_IMPORT = "raise RuntimeError('reference unavailable')\n" + RELU_REF
REFERENCE_RAISING_IN_GET_INPUTS = RELU_REF.replace(
    "def get_inputs():\n", "def get_inputs():\n    raise ValueError('no inputs today')\n")
GOOD = python_candidate("return x.clamp_min(0)")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    cache = tmp_path_factory.mktemp("pristine") / "cache"
    row = by_id(evaluate([job("tiny", RELU_REF, TINY_EXTENSION)], settings(cache),
                         progress=False))["tiny"]
    assert row["compiled"] and row["correct"], row["error"]
    return cache


@pytest.fixture
def cache(pristine, tmp_path):
    copy = tmp_path / "cache"
    shutil.copytree(pristine, copy, symlinks=True)
    return copy


def _build_folder(cache):
    (folder,) = [p for p in (cache / "ext").glob("*/*") if p.is_dir()]
    return folder


def _score_relu(cache, reference=RELU_REF, session=None):
    """The extension's job in a session: (its row, the damaged cache entries it reported)."""
    if session is None:
        with HarnessSession(settings(cache)) as fresh:
            return _score_relu(cache, reference, fresh)
    row = by_id(session.evaluate([job("relu", reference, TINY_EXTENSION)],
                                 progress=False))["relu"]
    return row, session.last_summary.repairs


def test_truncated_module_that_crashes_at_load_is_rebuilt(cache, caplog):
    folder = _build_folder(cache)
    (module,) = folder.glob("*.so")
    with HarnessSession(settings(cache)) as session:
        # the batch takes the healthy build (checked), and its worker never imports it
        first, _ = _score_relu(cache, REFERENCE_RAISING_ON_IMPORT, session)
        assert first["error_phase"] == "reference"
        module.write_bytes(module.read_bytes()[:4096])  # damaged after it was checked
        row, repairs = _score_relu(cache, session=session)
    # the worker's load failure (SIGBUS or ImportError) was traced to the entry's hash
    assert "job relu failed loading a damaged cache entry (" in caplog.text
    assert row["compiled"] and row["correct"] and row["error"] is None
    assert repairs == [(f"cache entry {folder.relative_to(cache)} was damaged ({module.name} "
                        "does not match its hash (size 4096 bytes)), rebuilt")]
    assert check_build(cache, folder.name) == (check_build(cache, folder.name)[0], None)


def test_damaged_status_json_is_rebuilt_not_a_failed_build(cache):
    status = _build_folder(cache) / "status.json"
    status.write_text(status.read_text().replace('"ok": true', '"ok": false'))
    row, repairs = _score_relu(cache)
    assert row["compiled"] and row["correct"] and row["error_phase"] is None
    assert repairs == [(f"cache entry {status.parent.relative_to(cache)} was damaged "
                        "(status.json: its content does not match its hash), rebuilt")]


def test_deleted_module_is_rebuilt_not_an_import_error(cache):
    (module,) = _build_folder(cache).glob("*.so")
    module.unlink()
    row, repairs = _score_relu(cache)
    assert row["compiled"] and row["correct"] and row["error"] is None
    assert repairs == [(f"cache entry {module.parent.relative_to(cache)} was damaged "
                        f"({module.name} is missing), rebuilt")]


def _stored_row(store_path, session, jobs, **values):
    """A row of `jobs[0]` in a results file, as a finished run leaves it."""
    row = finish_row(empty_row(jobs[0].job_id, "cpu"))
    row.update(compiled=True, correct=True, content_key=session.content_key(jobs[0]), **values)
    store = ResultStore(store_path)
    store.add(finish_row(row))
    store.flush()
    store.journal_path.unlink()
    store.close()


def test_damaged_resume_row_is_measured_again(tmp_path):
    out = tmp_path / "rows.parquet"
    jobs = [job("relu", RELU_REF, GOOD)]
    with HarnessSession(settings(tmp_path / "cache")) as session:
        _stored_row(out, session, jobs, error="stored")
        assert by_id(session.evaluate(jobs, out, progress=False))["relu"]["error"] == "stored"
        assert session.last_summary.from_store == 1
    table = pq.read_table(out)  # one value changed, the file's hashes kept
    rows = table.to_pylist()
    rows[0]["correct_trials_passed"] = 99
    pq.write_table(table.from_pylist(rows, schema=table.schema), out)
    with HarnessSession(settings(tmp_path / "cache")) as session:
        row = by_id(session.evaluate(jobs, out, progress=False))["relu"]
        summary = session.last_summary
    assert row["correct"] and row["error"] is None and row["correct_trials_passed"] != 99
    assert summary.measured == 1 and summary.damaged_in_store == 1
    assert "1 stored rows were damaged (their content does not match their hash)" in summary.line()
    assert ResultStore(out, writable=False).damaged == []  # the file holds the new row


def test_remeasure_flag_and_variable_pass_over_stored_rows(repo_root, tmp_path, monkeypatch,
                                                         capsys):
    refs, cands = tmp_path / "refs", tmp_path / "cands"
    refs.mkdir()
    cands.mkdir()
    (refs / "relu.py").write_text(RELU_REF)
    (cands / "relu.py").write_text(GOOD)
    args = ["score", "--params", str(repo_root / "params.yaml"), "--backend", "cpu",
            "--cache-dir", str(tmp_path / "cache"), "--references", str(refs),
            "--candidates", str(cands), "--out", str(tmp_path / "o.parquet")]
    assert main(args) == 0
    assert main(args) == 0
    assert "1 jobs: 0 measured, 0 copied from identical jobs, 1 reused" in capsys.readouterr().out
    assert main([*args, "--remeasure"]) == 0
    printed = capsys.readouterr().out
    assert "1 jobs: 1 measured" in printed and "1 stored rows not reused" in printed
    monkeypatch.setenv(REMEASURE_ENV, "1")
    assert remeasure_asked()  # what verify, evaluate and augment read under Snakemake and DVC
    monkeypatch.setenv(REMEASURE_ENV, "0")
    assert not remeasure_asked()


def test_cache_verify_and_prune(cache, repo_root, tmp_path, capsys):
    folder = _build_folder(cache)
    (module,) = folder.glob("*.so")
    module.write_bytes(module.read_bytes()[:100])
    shared = cache / "host-objects" / "ab" / ("ab" * 16 + ".o")
    shared.parent.mkdir(parents=True)
    write_checked(cache, shared, b"object")
    shared.write_bytes(b"objecT")
    healthy = cache / "host-objects" / "ab" / ("cd" * 16 + ".fail")
    write_checked(cache, healthy, b"main.cpp:1:1: error: nope")
    (cache / "tmp" / f"{'0' * 64}.999999999.1").mkdir(parents=True)  # a dead builder's
    old = cache / "host-objects" / "ab" / ("ef" * 16 + ".o")
    old.write_bytes(b"object")  # made before entries carried hashes: not damage, still removed
    resume = tmp_path / "resume"
    store_path = resume / "verify" / "seed" / "1-of-1-abc.parquet"
    store = ResultStore(store_path)
    for name in ("a", "b"):
        store.add(finish_row(dict(empty_row(name, "cpu"), content_key="k")))
    store.flush()
    store.close()
    lines = store.journal_path.read_text().splitlines()
    store.journal_path.write_text(lines[0].replace('"correct": false', '"correct": true') + "\n")
    store_path.unlink()  # a run cut short: only its journal holds the rows
    args = ["cache", "--params", str(repo_root / "params.yaml"), "--cache-dir", str(cache),
            "--resume-dir", str(resume)]
    assert main([*args, "verify"]) == 1
    printed = capsys.readouterr().out
    assert f"damaged: {folder.relative_to(cache)} ({module.name} does not match its hash" in printed
    assert f"damaged: {shared.relative_to(cache)} (does not match its hash" in printed
    assert "orphaned: tmp/" in printed and "builder that is gone" in printed
    assert "1 made before entries carried a hash (rebuilt when next used)" in printed
    assert str(old.relative_to(cache)) not in printed
    assert "damaged: verify/seed/1-of-1-abc.parquet (row a does not match its hash)" in printed
    assert "`dicepipe cache prune` removes them" in printed
    assert main([*args, "prune"]) == 0
    printed = capsys.readouterr().out
    assert ("removed 4 build cache entries (2 damaged, 1 orphaned, 1 made before entries "
            "carried a hash), 1 damaged rows") in printed
    assert not folder.exists() and not shared.exists() and not old.exists()
    assert healthy.is_file()
    assert main([*args, "verify"]) == 0
    assert "no entry is damaged or orphaned" in capsys.readouterr().out
    assert not ResultStore(store_path, writable=False).rows  # row a dropped, b was cut off


def test_reference_raising_in_get_inputs_is_a_reference_failure(repo_root, tmp_path, capsys):
    refs, cands = tmp_path / "refs", tmp_path / "cands"
    refs.mkdir()
    cands.mkdir()
    for name, ref in (("relu", RELU_REF), ("no_inputs", REFERENCE_RAISING_IN_GET_INPUTS)):
        (refs / f"{name}.py").write_text(ref)
        (cands / f"{name}.py").write_text(GOOD)
    assert main(["score", "--params", str(repo_root / "params.yaml"), "--backend", "cpu",
                 "--cache-dir", str(tmp_path / "cache"), "--references", str(refs),
                 "--candidates", str(cands), "--out", str(tmp_path / "o.parquet")]) == 0
    printed = capsys.readouterr().out
    assert ("1 references failed on their own (a reference failure, not a wrong candidate; "
            "left out of the counts below): no_inputs") in printed
    assert "[strict] 1 correct" in printed and "fast_1 (robust, interval above 1): " in printed
    assert "/1\n" in printed
