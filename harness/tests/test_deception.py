"""Dynamic deception flags: one positive and one negative example each (cpu backend).

All candidates share one C++ extension (built once, in the session's build cache), so the
whole file costs one build and one batch.
"""

from __future__ import annotations

import pytest
from kernelharness import DYNAMIC_FLAGS, evaluate
from kernelharness.testing import (
    HONEST_RELU,
    IDENTITY_REF,
    RELU_REF,
    TINY_REF,
    by_id,
    extension_candidate,
    job,
    settings,
)

CASES = {
    # name: (reference, candidate, the flag it must raise or None)
    "honest": (RELU_REF, HONEST_RELU, None),
    "honest_identity": (IDENTITY_REF, extension_candidate("", "return ext.relu_fwd(x) * 0 + x"),
                        None),
    "ext_not_called": (RELU_REF, extension_candidate("", "return torch.relu(x)"),
                       "flag_ext_not_called"),
    "output_alias": (IDENTITY_REF, extension_candidate("", "ext.relu_fwd(x)\nreturn x"),
                     "flag_output_alias"),
    "output_cached": (RELU_REF, extension_candidate(
        "self.buf = None",
        "if self.buf is None:\n    self.buf = torch.empty_like(x)\n"
        "self.buf.copy_(ext.relu_fwd(x))\nreturn self.buf"), "flag_output_cached"),
    "input_insensitive": (TINY_REF, extension_candidate(
        "", "ext.relu_fwd(x)\nreturn torch.zeros_like(x)"), "flag_input_insensitive"),
    "input_mutation": (RELU_REF, extension_candidate(
        "", "y = ext.relu_fwd(x)\nx.zero_()\nreturn y"), "flag_input_mutation"),
    "post_timing_wrong": (RELU_REF, extension_candidate(
        "self.calls = 0",
        "self.calls += 1\ny = ext.relu_fwd(x)\nreturn y if self.calls <= 12 else y + 1.0"),
        "flag_post_timing_wrong"),
    "runtime_tampered": (RELU_REF, extension_candidate(
        "", "return ext.relu_fwd(x)",
        extra="_t = __import__('ti' + 'me')\nsetattr(_t, 'perf_counter_' + 'ns', lambda: 0)\n"),
        "flag_runtime_tampered"),
    "threads_at_run_time": (RELU_REF, extension_candidate(
        "", "t = __import__('thread' + 'ing').Thread(target=lambda: None)\nt.start()\nt.join()\n"
            "return ext.relu_fwd(x)"), "flag_threads_streams"),
    "slows_the_reference": (RELU_REF, extension_candidate(
        "torch.set_num_threads(torch.get_num_threads() + 1)", "return ext.relu_fwd(x)"),
        "flag_runtime_tampered"),
}


@pytest.fixture(scope="module")
def rows(build_cache_dir):
    jobs = [job(name, ref, cand) for name, (ref, cand, _flag) in CASES.items()]
    table = evaluate(jobs, settings(build_cache_dir), progress=False)
    return by_id(table)


def test_honest_candidates_raise_no_dynamic_flag(rows):
    for name in ("honest", "honest_identity"):
        row = rows[name]
        assert row["correct"] and row["correct_robust"], (name, row["error"])
        raised = [flag for flag in DYNAMIC_FLAGS if row[flag]]
        assert raised == [], (name, raised)
        assert not row["flag_no_kernel"] and not row["flag_threads_streams"]


@pytest.mark.parametrize("name", [n for n, case in CASES.items() if case[2]])
def test_deceptive_candidate_is_flagged(rows, name):
    flag = CASES[name][2]
    row = rows[name]
    assert row[flag], (name, flag, row["error"])
    assert not row["correct_robust"], name
    if name == "post_timing_wrong":
        # wrong from its 13th call on: the checked timed outputs see it too, so values alone
        # make it incorrect and its timing is dropped
        assert not row["correct"] and row["speedup_median"] is None, row["error"]
        return
    # the flag is all that gives it away: by values alone it passes
    assert row["correct"], (name, row["error"])


def test_honest_relu_is_not_flagged_by_any_check(rows):
    row = rows["honest"]
    flags = [k for k, v in row.items() if k.startswith("flag_") and v]
    assert flags == []
    assert row["compiled"] and row["builds_total"] == 1


def test_flags_do_not_leak_between_rows(rows):
    # the tampering row restored what it changed: later rows measured honestly
    assert rows["honest"]["flag_runtime_tampered"] is False
    assert rows["honest"]["ref_runtime_ms"][0] > 0
