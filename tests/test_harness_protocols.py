"""KernelBench's own trials beside the strict ones, judged by every protocol (CPU, no builds).

Candidates here are plain PyTorch (`ModelNew` without an extension): the correctness
protocols do not ask for a kernel of its own (the robust verdict does, through the flags),
so each case isolates one difference between KernelBench's check and the strict one.
"""

from __future__ import annotations

import math

import pytest
import torch
from kernelharness import HarnessSession, HarnessSettings, Job
from dicepipe.judgement import BUILTIN_PROTOCOLS, judge, named_protocol
from kernelharness.worker.kb_trials import trial_seeds

PROTOCOLS = tuple(BUILTIN_PROTOCOLS)


def _program(body: str, inputs: str, cls: str = "Model") -> str:
    return f'''import torch
import torch.nn as nn


class {cls}(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        {body}


def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return []
'''


RELU = _program("return torch.relu(x)", "torch.rand(32, 64)")
CASES = {
    # right on [0, 1) inputs only (ReLU as the identity): KernelBench's check cannot tell
    "relu_identity": (RELU, _program("return x.clone()", "torch.rand(32, 64)", "ModelNew"),
                      {"kernelbench": True, "kernelbench_v0": True, "release_reward": True,
                       "strict": False}),
    # a relative error of 4e-3: KernelBench main's 1e-4 rejects it, the paper's 1e-2 accepts it
    "loose": (RELU, _program("return torch.relu(x) * (1 + 4e-3)", "torch.rand(32, 64)",
                             "ModelNew"),
              {"kernelbench": False, "kernelbench_v0": True, "release_reward": True,
               "strict": False}),
    # a sampling reference and the same sampling: both calls start from the trial's seed
    "dropout": (_program("return torch.nn.functional.dropout(x, 0.3, training=True)",
                         "torch.rand(32, 64)"),
                _program("return torch.nn.functional.dropout(x, 0.3, training=True)",
                         "torch.rand(32, 64)", "ModelNew"),
                {name: True for name in PROTOCOLS}),
    # a shape KernelBench would reject at its first trial
    "shape": (RELU, _program("return torch.relu(x).t()", "torch.rand(32, 64)", "ModelNew"),
              {name: False for name in PROTOCOLS}),
}


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    settings = HarnessSettings.with_defaults(timing_trials_cpu=20, warmup_trials=1, repeats=1,
                               cache_dir=str(tmp_path_factory.mktemp("builds")))
    jobs = [Job(name, ref, cand, "cpu") for name, (ref, cand, _) in CASES.items()]
    with HarnessSession(settings) as session:
        table = session.evaluate(jobs, progress=False)
    return {row["job_id"]: row for row in table.to_pylist()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_protocol_judges_its_own_check(rows, case):
    row = rows[case]
    expected = CASES[case][2]
    got = {name: judge(row, protocol=named_protocol(name), robust=False) == "accepted"
           for name in PROTOCOLS}
    assert got == expected, (row["kb_trial_tolerance"], row["tolerance_needed"], row["error"])


def test_kernelbench_trials_are_recorded_as_allclose_tolerances(rows):
    assert rows["relu_identity"]["kb_trial_tolerance"] == [0.0] * 5
    loose = rows["loose"]["kb_trial_tolerance"]
    # |c - r| = 4e-3 r against t (1 + c): just under 2e-3 for r below 1
    assert len(loose) == 5 and all(1.9e-3 < t < 2e-3 for t in loose)
    # a shape mismatch ends KernelBench's trials at the first one, as its own loop returns
    assert rows["shape"]["kb_trial_tolerance"] == [math.inf]


def test_a_kernel_correct_only_under_kernelbench_is_still_timed(rows):
    """fast_p under the benchmark's protocol needs a speedup for kernels the strict check
    rejects; the post-timing check then asks only what passed before timing."""
    row = rows["relu_identity"]
    assert not row["correct"] and row["speedup_median"] is not None
    assert not row["flag_post_timing_wrong"]
    assert rows["shape"]["speedup_median"] is None


def test_backend_switches_are_recorded_and_keyed(rows):
    assert all(r["cudnn_allow_tf32"] is True and r["matmul_allow_tf32"] is False
               for r in rows.values())
    job = Job("j", RELU, RELU.replace("class Model(", "class ModelNew("), "cpu")
    default = HarnessSession(HarnessSettings.with_defaults())
    no_tf32 = HarnessSession(HarnessSettings.with_defaults(cudnn_allow_tf32=False))
    try:
        assert default.content_key(job) != no_tf32.content_key(job)
    finally:
        default.close()
        no_tf32.close()


def test_trial_seeds_are_kernelbenchs_and_leave_the_global_generator_alone():
    torch.manual_seed(42)
    expected = [int(torch.randint(0, 2**32 - 1, (1,)).item()) for _ in range(5)]
    torch.manual_seed(7)
    before = torch.rand(1)
    torch.manual_seed(7)
    assert trial_seeds(5) == expected
    assert torch.equal(torch.rand(1), before)


EMBEDDING = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """An embedding fed float indices, floored: negated indices are out of range."""

    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(64, 16)

    def forward(self, idx):
        return self.table(idx.floor().long())


def get_inputs():
    return [torch.rand(8, 32) * 64]


def get_init_inputs():
    return []
'''


def test_a_variant_the_reference_rejects_is_found_before_any_candidate_runs(tmp_path):
    """The plan comes from the reference alone; the candidate's trials follow it and never
    see negated indices, so a right candidate is correct under every protocol."""
    cand = EMBEDDING.replace("class Model(", "class ModelNew(")
    settings = HarnessSettings.with_defaults(timing_trials_cpu=20, warmup_trials=1, repeats=1,
                               cache_dir=str(tmp_path))
    with HarnessSession(settings) as session:
        rows = session.evaluate([Job("a", EMBEDDING, cand, "cpu"),
                                 Job("b", EMBEDDING, cand + "\n# another candidate\n", "cpu")],
                                progress=False, measure_speed=False).to_pylist()
        plans = session._batch.reference_plans
        assert plans.probes == 1  # one probe for the reference, shared by both candidates
    for row in rows:
        assert "negated" not in row["variants_run"] and "as_drawn" in row["variants_run"]
        assert all(judge(row, protocol=named_protocol(n), robust=False) == "accepted"
                   for n in PROTOCOLS), row["error"]


class _FakeWorker:
    """Answers probes as a CUDA worker would: trial 1's variant breaks the context."""

    def __init__(self):
        self.restarts = 0
        self.requests = []

    def request(self, message, timeout_s):
        self.requests.append(list(message["plan"]))
        plan = list(message["plan"])
        while len(plan) < 5:
            trial = len(plan)
            if trial == 1 and self.restarts == 0:
                return {"op": "result", "row": {"plan": plan, "fatal_trial": 1},
                        "fatal": True, "restart": True}
            plan.append("as_drawn" if trial % 5 == 0 else f"v{trial}")
        return {"op": "result", "row": {"plan": plan, "fatal_trial": None}, "fatal": False,
                "restart": False}

    def restart(self):
        self.restarts += 1


def test_a_fatal_probe_marks_the_variant_and_goes_on_on_a_fresh_worker():
    from kernelharness.reference_plans import ReferencePlans

    plans, worker = ReferencePlans(), _FakeWorker()
    settings = HarnessSettings.with_defaults().to_wire()
    plan = plans.plan_for("ref", 3, settings, worker)
    assert plan == ["as_drawn", "as_drawn", "v2", "v3", "v4"]
    assert worker.restarts == 1 and worker.requests == [[], ["as_drawn", "as_drawn"]]
    assert plans.plan_for("ref", 3, settings, worker) is plan  # remembered, no new probe
    assert plans.probes == 2 and plans.fatal == 1
