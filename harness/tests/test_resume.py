"""Resume after a killed run: finished rows survive, are not re-run, and workers die too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from kernelharness import evaluate
from kernelharness.testing import RELU_REF, by_id, job, python_candidate, settings

GOOD = python_candidate("return x.clamp_min(0)")
LAST = python_candidate("return torch.relu(x)")  # not GOOD: an identical job would be a copy
HANG = python_candidate("import time\ntime.sleep(3600)\nreturn x")
# the same in both runs: run_timeout_s is a measuring setting (another value re-measures)
TIMEOUT_S = 20

RUNNER = textwrap.dedent("""
    import sys
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from kernelharness import evaluate
    from kernelharness.testing import RELU_REF, job, settings
    from test_resume import GOOD, HANG, LAST, TIMEOUT_S
    jobs = [job("first", RELU_REF, GOOD), job("hang", RELU_REF, HANG), job("last", RELU_REF, LAST)]
    evaluate(jobs, settings(Path({cache!r}), run_timeout_s=TIMEOUT_S), Path({out!r}),
             progress=False)
""")


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_resume_after_kill(tmp_path):
    out = tmp_path / "results.parquet"
    journal = tmp_path / "results.parquet.journal.jsonl"
    script = RUNNER.format(tests=str(Path(__file__).parent), cache=str(tmp_path / "cache"),
                           out=str(out))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", script], env=env)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if journal.is_file() and journal.read_text().count("\n") >= 1:
                break
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.5)
        else:
            raise AssertionError("no row was journaled in time")
        time.sleep(1.0)  # the hanging job is now on the device worker
        workers = _children(proc.pid)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    journaled = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [row["job_id"] for row in journaled] == ["first"]
    time.sleep(2.0)
    assert workers and not any(_alive(pid) for pid in workers), "workers outlived their parent"

    resumed = evaluate([job("first", RELU_REF, GOOD), job("hang", RELU_REF, HANG),
                        job("last", RELU_REF, LAST)],
                       settings(tmp_path / "cache", run_timeout_s=TIMEOUT_S), out, progress=False)
    rows = by_id(resumed)
    assert list(rows) == ["first", "hang", "last"]
    # not re-run: the row is the journaled one, timings and all
    assert rows["first"]["ref_runtime_ms"] == journaled[0]["ref_runtime_ms"]
    assert rows["first"]["wall_time_s"] == journaled[0]["wall_time_s"]
    assert rows["hang"]["error"].startswith("timeout")
    assert rows["last"]["correct"]
    assert out.is_file() and not journal.exists()


def test_stored_rows_read_from_the_file_and_a_cut_journal(tmp_path):
    """What a killed run left (Parquet + journal, last line torn) is read back whole, and
    reading opens nothing for writing."""
    import pytest
    from kernelharness.results import ResultStore, empty_row

    path = tmp_path / "results.parquet"
    with pytest.raises(FileNotFoundError, match="no rows"):
        ResultStore.read(path)
    store = ResultStore(path)
    store.add({**empty_row("b", "cpu"), "compiled": True})
    store.flush()  # "b" in the Parquet file
    store.add({**empty_row("a", "cpu"), "compiled": False})  # "a" only in the journal
    store.close()
    with open(store.journal_path, "a") as fh:
        fh.write('{"job_id": "c", "comp')  # the line a kill cut short
    before = sorted(p.name for p in tmp_path.iterdir())
    rows = ResultStore.read(path)
    assert [(r["job_id"], r["compiled"]) for r in rows] == [("a", False), ("b", True)]
    assert sorted(p.name for p in tmp_path.iterdir()) == before
