"""One writer per results file (harness/results.py's lock): a second writer waits for the
first, or refuses naming it; no row of either is lost; readers take no lock."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
from kernelharness.errors import HarnessError
from kernelharness.results import ResultStore, empty_row, finish_row
from kernelharness.session import HarnessSession
from kernelharness.settings import HarnessSettings

# A first writer in its own process: opens the store, writes its rows, says so, then keeps
# the file for a while before its final flush (a long scoring run's shape).
FIRST_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from kernelharness.results import ResultStore, empty_row, finish_row
    out, ready, hold_s = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
    store = ResultStore(out)
    for name in ("a1", "a2", "a3"):
        store.add(finish_row(empty_row(name, "cpu")))
    ready.write_text("held")
    time.sleep(hold_s)
    store.flush()
    store.journal_path.unlink()
    store.close()
""")


def _start_first_writer(tmp_path, hold_s: float):
    out, ready = tmp_path / "scores.parquet", tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", FIRST_WRITER, str(out), str(ready),
                             str(hold_s)])
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None, "the first writer died"
        assert time.monotonic() < deadline, "the first writer never took the file"
        time.sleep(0.05)
    return proc, out


def _rows(names):
    return [empty_row(name, "cpu") for name in names]


def test_a_second_writer_waits_and_both_keep_their_rows(tmp_path, caplog):
    proc, out = _start_first_writer(tmp_path, hold_s=2.0)
    try:
        # no job to run: no worker starts
        with HarnessSession(HarnessSettings.with_defaults()) as session:
            session.evaluate([], results_path=out, wait_s=60, unrun=_rows(["b1", "b2"]))
    finally:
        assert proc.wait(timeout=60) == 0
    assert f"being written by pid {proc.pid}" in caplog.text
    assert [r["job_id"] for r in ResultStore.read(out)] == ["a1", "a2", "a3", "b1", "b2"]
    assert not (tmp_path / "scores.parquet.lock").exists()


def test_a_second_writer_refuses_naming_the_file_and_pid(tmp_path):
    proc, out = _start_first_writer(tmp_path, hold_s=30.0)
    try:
        with pytest.raises(HarnessError) as caught:
            ResultStore(out, wait_s=0)
        message = str(caught.value)
        assert str(out) in message and f"pid {proc.pid}" in message
        assert "--wait-s" in message and "run this command again" in message
        # a reader takes no lock: it sees the first writer's rows (from its journal) now
        assert [r["job_id"] for r in ResultStore.read(out)] == ["a1", "a2", "a3"]
    finally:
        proc.kill()
        proc.wait()
    # the kernel dropped the killed writer's lock: the next writer resumes its rows
    store = ResultStore(out, wait_s=0)
    assert sorted(store.rows) == ["a1", "a2", "a3"]
    store.close()


def test_one_process_cannot_write_one_file_twice(tmp_path):
    out = tmp_path / "scores.parquet"
    first = ResultStore(out)
    try:
        with pytest.raises(HarnessError, match=f"pid {os.getpid()}"):
            ResultStore(out, wait_s=0.3)
    finally:
        first.close()
    second = ResultStore(out)  # released by close()
    second.add(finish_row(empty_row("x", "cpu")))
    second.flush()
    second.close()
    assert [r["job_id"] for r in ResultStore.read(out)] == ["x"]
