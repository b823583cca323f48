"""The harness's KernelBench check against KernelBench's own code (CPU, no GPU, no build).

KernelBench 423217d (../shared/reference/KernelBench-423217d, imported as its README-shared.md
says) decides a trial in `run_and_check_correctness`: a shape check, then
`torch.allclose(output, output_new, atol=tol, rtol=tol)` with tol from
`get_tolerance_for_precision`. The harness records instead, per trial, the smallest tolerance
at which that allclose holds (`correctness.allclose_tolerance`), and the protocols compare it
with theirs later. Here both decide the same hand-built outputs, at 1e-4 and at 1e-2, and
must agree case by case: KernelBench's function runs on the CPU (`device="cpu"`,
`torch.cuda.synchronize` a no-op), its tolerance patched to the one under test.

Known and pinned below: exactly at the boundary, torch computes `atol + rtol * |other|` in
the output's dtype and the harness in float64, so the two may differ when the needed
tolerance is within a few units in the last place of the output's dtype from the
protocol's (fp32: ~1e-7 relative; fp16 ~1e-3; bf16 ~8e-3).

Beyond single outputs: the harness's KernelBench trials (kb_trials: seeds, as-drawn inputs,
reference first) judged by the `kernelbench` / `kernelbench_v0` protocols against
KernelBench's five trials on the same CPU models; KernelBench's fp32 cast of integer inputs
(a listed defect); and the GPU bench's KernelBench child, whose one-run "probe" mode must
give the verdicts of two separate runs. The GPU half of the differential (real kernel pairs
through `eval_kernel_against_ref`) is bench/kernelbench_differential.py.
"""

from __future__ import annotations

import importlib
import math
import sys
import types
from pathlib import Path

import pytest
import torch
from dicepipe.judgement import judge, named_protocol
from kernelharness.worker import kb_trials
from kernelharness.worker.correctness import allclose_tolerance, output_precision
from torch import nn

REPO_ROOT = Path(__file__).resolve().parent.parent
KERNELBENCH_SRC = REPO_ROOT.parent / "shared" / "reference" / "KernelBench-423217d" / "src"
TOLERANCES = (1e-4, 1e-2)
# KernelBench's module-level imports that only its LLM clients use
_STUBBED = ("openai", "litellm", "dotenv")


def _stub_modules() -> dict:
    stubs = {name: types.ModuleType(name) for name in _STUBBED}
    stubs["openai"].OpenAI = object
    stubs["litellm"].completion = lambda *a, **k: None
    stubs["dotenv"].load_dotenv = lambda *a, **k: None
    return stubs


@pytest.fixture(scope="module")
def kb_eval():
    """KernelBench's eval module, imported from the shared source with its LLM clients stubbed
    (only while importing: no other test sees the stubs)."""
    if not KERNELBENCH_SRC.is_dir():
        pytest.skip(f"{KERNELBENCH_SRC} is absent (KernelBench 423217d source)")
    for needed in ("pydantic", "requests", "tqdm", "numpy"):
        pytest.importorskip(needed, reason=f"KernelBench's eval.py imports {needed}")
    saved = {name: sys.modules.get(name) for name in _STUBBED}
    sys.modules.update({n: m for n, m in _stub_modules().items() if saved[n] is None})
    sys.path.insert(0, str(KERNELBENCH_SRC))
    try:
        module = importlib.import_module("kernelbench.eval")
    finally:
        sys.path.remove(str(KERNELBENCH_SRC))
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
    assert Path(module.__file__).resolve().is_relative_to(KERNELBENCH_SRC.resolve())
    return module


class Fixed(nn.Module):
    """A model whose output is a given tensor, whatever the input (kept as a plain attribute,
    so KernelBench's `.to(device, dtype=fp32)` leaves its dtype alone)."""

    def __init__(self, out):
        super().__init__()
        self.out = out

    def forward(self, x):
        return self.out


def kernelbench_says(kb_eval, monkeypatch, ref, cand, tol: float) -> bool:
    """KernelBench's own verdict on one trial whose outputs are `ref` and `cand`."""
    monkeypatch.setattr(kb_eval, "get_tolerance_for_precision", lambda precision, tol=tol: tol)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    result = kb_eval.run_and_check_correctness(
        Fixed(ref), Fixed(cand), lambda: [torch.zeros(1)], metadata={}, num_correct_trials=1,
        device="cpu")
    assert result.compiled is True
    return bool(result.correctness)


def harness_says(ref, cand, tol: float) -> bool:
    return allclose_tolerance(ref, cand) <= tol


def _boundary_pair(magnitude: float, tol: float, factor: float, dtype=torch.float32,
                   candidate_side: bool = True):
    """(ref, cand) whose error is `factor` times allclose's allowance at `tol`: below the
    boundary for factor < 1, above it for factor > 1 (allowance on the candidate's value)."""
    cand = torch.linspace(0.5, 1.0, 16, dtype=torch.float64) * magnitude
    err = factor * (tol + tol * cand.abs())
    ref = cand + err * torch.where(torch.arange(16) % 2 == 0, 1.0, -1.0).double()
    return ref.to(dtype), cand.to(dtype)


def _cases() -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(64, generator=g)
    inf, nan = math.inf, math.nan
    cases = [
        ("identical", x, x.clone()),
        ("zero_vs_tiny", torch.zeros(8), torch.full((8,), 5e-5)),
        ("tiny_values_3x_off", x * 1e-8, x * 3e-8),
        ("tiny_values_with_sign_flip", x * 1e-6, -x * 1e-6),
        ("large_values_rel_5e-5", x * 1e6 + 1e6, (x * 1e6 + 1e6) * (1 + 5e-5)),
        ("large_values_abs_200", x * 1e6 + 1e6, x * 1e6 + 1e6 + 200.0),
        ("large_values_rel_2e-2", x * 1e6 + 1e6, (x * 1e6 + 1e6) * 1.02),
        ("huge_values_near_max", torch.full((4,), 3.0e38), torch.full((4,), 3.0e38) * (1 - 1e-3)),
        ("opposite_huge", torch.full((4,), 3.0e38), torch.full((4,), -3.0e38)),
        ("one_bad_element_among_many", x, torch.cat([x[:-1], x[-1:] + 0.5])),
        ("sign_flip", x + 0.5, -(x + 0.5)),
        ("scalar_0d", torch.tensor(1.0), torch.tensor(1.00005)),
        ("empty", torch.zeros(0, 3), torch.zeros(0, 3)),
        # relative term on the candidate's side (torch's `other`): error 1.015 at r=100 vs
        # c=101.015 passes 1e-2 (allowance 0.01 + 0.01 * 101.015); swapped, it fails
        ("relative_term_candidate_large", torch.tensor([100.0]), torch.tensor([101.015])),
        ("relative_term_reference_large", torch.tensor([101.015]), torch.tensor([100.0])),
        ("relative_term_candidate_large_fp64_1e-4",
         torch.tensor([1e6], dtype=torch.float64), torch.tensor([1e6 + 100.0051], dtype=torch.float64)),
        ("relative_term_reference_large_fp64_1e-4",
         torch.tensor([1e6 + 100.0051], dtype=torch.float64), torch.tensor([1e6], dtype=torch.float64)),
        # non-finite
        ("nan_in_reference", torch.tensor([1.0, nan]), torch.tensor([1.0, 1.0])),
        ("nan_in_candidate", torch.tensor([1.0, 1.0]), torch.tensor([1.0, nan])),
        ("nan_in_both_same_place", torch.tensor([1.0, nan]), torch.tensor([1.0, nan])),
        ("equal_infinities", torch.tensor([inf, -inf, 2.0]), torch.tensor([inf, -inf, 2.0])),
        ("opposite_infinities", torch.tensor([inf, 2.0]), torch.tensor([-inf, 2.0])),
        ("inf_vs_finite", torch.tensor([inf, 2.0]), torch.tensor([3.0e38, 2.0])),
        ("finite_vs_inf", torch.tensor([3.0e38, 2.0]), torch.tensor([inf, 2.0])),
        # shape: broadcastable shapes pass allclose, KernelBench's shape check rejects them
        ("shape_broadcastable", torch.ones(4), torch.ones(1, 4)),
        ("shape_different_length", torch.ones(4), torch.ones(5)),
        ("shape_transposed", torch.ones(2, 3), torch.ones(3, 2)),
        # dtype: allclose raises, KernelBench counts the exception as a failed trial
        ("dtype_fp32_vs_fp64", torch.ones(4), torch.ones(4, dtype=torch.float64)),
        ("dtype_int_vs_fp32", torch.ones(4, dtype=torch.int64), torch.ones(4)),
        ("dtype_fp16_vs_fp32", torch.ones(4, dtype=torch.float16), torch.ones(4)),
        # integer and boolean outputs (argmax, masks, indices)
        ("int_equal", torch.arange(10), torch.arange(10)),
        ("int_off_by_one_small", torch.arange(10), torch.arange(10) + (torch.arange(10) == 3)),
        ("int_off_by_one_at_1000", torch.tensor([1000]), torch.tensor([1001])),
        ("int_off_by_one_at_0", torch.tensor([0]), torch.tensor([1])),
        ("int32_equal", torch.arange(5, dtype=torch.int32), torch.arange(5, dtype=torch.int32)),
        ("bool_equal", x > 0.5, x > 0.5),
        # low precision outputs, away from the boundary by more than their rounding
        ("fp16_close", x.half(), (x * (1 + 2e-3)).half()),
        ("fp16_far", x.half(), (x + 0.05).half()),
        ("bf16_close", x.bfloat16(), (x * (1 + 4e-3)).bfloat16()),
        ("bf16_far", x.bfloat16(), (x + 0.05).bfloat16()),
        ("fp64_close", x.double(), x.double() * (1 + 1e-5)),
    ]
    # errors at 0.9 / 0.999 / 1.001 / 1.1 of the allowance, at both tolerances, over magnitudes
    for tol in TOLERANCES:
        for magnitude in (1e-6, 0.1, 1.0, 50.0, 1e4):
            for factor in (0.9, 0.999, 1.001, 1.1):
                ref, cand = _boundary_pair(magnitude, tol, factor)
                cases.append((f"boundary_tol{tol:g}_mag{magnitude:g}_x{factor:g}", ref, cand))
    for tol, dtype, factors in ((1e-2, torch.float16, (0.98, 1.02)), (1e-2, torch.bfloat16, (0.95, 1.05))):
        for magnitude in (0.1, 1.0, 50.0):
            for factor in factors:
                ref, cand = _boundary_pair(magnitude, tol, factor, dtype)
                cases.append((f"boundary_{dtype}_tol{tol:g}_mag{magnitude:g}_x{factor:g}", ref, cand))
    return cases


CASES = _cases()


@pytest.mark.parametrize("tol", TOLERANCES)
@pytest.mark.parametrize("name,ref,cand", CASES, ids=[c[0] for c in CASES])
def test_allclose_tolerance_agrees_with_kernelbench(kb_eval, monkeypatch, name, ref, cand, tol):
    expected = kernelbench_says(kb_eval, monkeypatch, ref, cand, tol)
    assert harness_says(ref, cand, tol) == expected, (
        f"{name} at {tol:g}: KernelBench says {'pass' if expected else 'fail'}, the harness's "
        f"allclose_tolerance is {allclose_tolerance(ref, cand)!r}")


def test_cases_discriminate(kb_eval, monkeypatch):
    """The case list is not one-sided: at each tolerance KernelBench passes some cases and
    fails others, and some case passes at 1e-2 only (so a harness that ignored the tolerance
    could not agree everywhere)."""
    verdicts = {tol: [kernelbench_says(kb_eval, monkeypatch, r, c, tol) for _, r, c in CASES]
                for tol in TOLERANCES}
    for tol, said in verdicts.items():
        assert 10 < sum(said) < len(said) - 10, (tol, sum(said), len(said))
    assert any(loose and not tight for tight, loose in zip(verdicts[1e-4], verdicts[1e-2]))
    by_name = {name: said for (name, _, _), said in zip(CASES, verdicts[1e-2])}
    assert by_name["relative_term_candidate_large"] and not by_name["relative_term_reference_large"]
    assert by_name["equal_infinities"] and not by_name["nan_in_both_same_place"]
    assert not by_name["shape_broadcastable"] and not by_name["dtype_fp32_vs_fp64"]


@pytest.mark.parametrize("dtype,ulps", [(torch.float32, 4), (torch.float64, 4),
                                        (torch.float16, 2), (torch.bfloat16, 2)])
def test_disagreement_only_within_rounding_of_the_boundary(kb_eval, monkeypatch, dtype, ulps):
    """Errors drawn at the boundary itself (and one unit in the last place either side):
    wherever the two differ, the harness's tolerance is within a few units in the last place
    of the output's dtype from the tolerance judged (torch rounds `atol + rtol*|other|` in
    that dtype; the harness does not)."""
    g = torch.Generator().manual_seed(1)
    eps = torch.finfo(dtype).eps
    checked = differ = 0
    for tol in TOLERANCES:
        for i in range(100):
            magnitude = 10 ** (torch.rand(1, generator=g).item() * 10 - 5)
            cand = (torch.rand(8, generator=g, dtype=torch.float64) * magnitude).to(dtype)
            err = (tol + tol * cand.double().abs()) * (1 + (torch.rand(8, generator=g).double() - 0.5) * 4 * eps)
            ref = (cand.double() + err * (1 if i % 2 else -1)).to(dtype)
            for nudged in (ref, torch.nextafter(ref, ref + 1), torch.nextafter(ref, ref - 1)):
                ours = allclose_tolerance(nudged, cand)
                theirs = kernelbench_says(kb_eval, monkeypatch, nudged, cand, tol)
                checked += 1
                if (ours <= tol) != theirs:
                    differ += 1
                    assert abs(ours / tol - 1) <= ulps * eps, (dtype, tol, ours, theirs)
    assert checked == 600 and differ < checked // 2


def test_kernelbench_casts_integer_inputs_to_fp32(kb_eval, monkeypatch):
    """The KernelBench defect the differential lists: every input tensor is cast to the run
    precision, so an index input reaches the reference as float and the reference fails
    (a copy of the reference is then judged incorrect: compiled, not correct)."""
    class Embed(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Embedding(10, 4)

        def forward(self, idx):
            return self.table(idx)

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    model = Embed()
    get_inputs = lambda: [torch.randint(0, 10, (6,))]
    with pytest.raises(RuntimeError):
        kb_eval.run_and_check_correctness(model, model, get_inputs, metadata={},
                                          num_correct_trials=1, device="cpu")
    assert kb_eval._process_input_tensor(torch.arange(3), "cpu").dtype == torch.float32


def test_trial_seeds_are_kernelbench_seeds(kb_eval, monkeypatch):
    seen = []
    monkeypatch.setattr(kb_eval, "set_seed", lambda seed: (seen.append(seed), torch.manual_seed(seed)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    kb_eval.run_and_check_correctness(Fixed(torch.ones(1)), Fixed(torch.ones(1)),
                                      lambda: [torch.zeros(1)], metadata={},
                                      num_correct_trials=5, device="cpu")
    # per trial: inputs, reference, candidate each after set_seed(trial_seed)
    assert seen[::3] == kb_trials.trial_seeds(5)
    assert len(set(seen[::3])) == 5


class Scaled(nn.Module):
    """y = x * 2; on draws whose first input element is above `cut`: an error of `err`, or a
    fault (`raise`, a wrong `shape`, a `nan`)."""

    def __init__(self, err: float = 0.0, cut: float = 2.0, fault: str | None = None):
        super().__init__()
        self.err, self.cut, self.fault = err, cut, fault

    def forward(self, x):
        y = x * 2
        if float(x.flatten()[0]) <= self.cut:
            return y
        if self.fault == "raise":
            raise RuntimeError("candidate failed on this draw")
        if self.fault == "shape":
            return y[:-1]
        if self.fault == "nan":
            return torch.where(torch.arange(y.numel()) == 0, torch.nan, y)
        return y + self.err


@pytest.mark.parametrize("err,cut,fault", [
    (0.0, 2.0, None), (5e-5, -1.0, None), (5e-3, -1.0, None), (0.5, -1.0, None),
    (0.5, 0.5, None), (5e-3, 0.5, None), (0.5, 0.9, None),
    (0.0, 0.5, "raise"), (0.0, 0.5, "shape"), (0.0, 0.5, "nan")])
def test_kernelbench_protocols_match_run_and_check_correctness(kb_eval, monkeypatch, err, cut,
                                                               fault):
    """The harness's KernelBench trials (its seeds, inputs as drawn, reference first), judged
    by the `kernelbench` and `kernelbench_v0` protocols, against KernelBench's five trials on
    the same models at 1e-4 and 1e-2: the same verdict, including candidates wrong on only
    some of the five draws (`cut` picks which) and ones that raise, change shape or give NaN
    on those draws."""
    get_inputs = lambda: [torch.rand(32)]
    record: list[float] = []
    kb_trials.run_kernelbench_trials(get_inputs, Scaled(), Scaled(err, cut, fault), 5, "cpu",
                                     record, lambda exc: AssertionError(f"reference failed: {exc}"))
    row = {"compiled": True, "kb_trial_tolerance": record,
           "output_precision": output_precision(Scaled()(torch.rand(32)))}
    for name, tol in (("kernelbench", 1e-4), ("kernelbench_v0", 1e-2)):
        monkeypatch.setattr(kb_eval, "get_tolerance_for_precision", lambda precision, tol=tol: tol)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
        result = kb_eval.run_and_check_correctness(Scaled(), Scaled(err, cut, fault), get_inputs,
                                                   metadata={}, num_correct_trials=5, device="cpu")
        ours = judge(row, protocol=named_protocol(name), robust=False)
        assert (ours == "accepted") == bool(result.correctness), (name, err, cut, fault, record)
    # the parameter sets with cut 0.5 go wrong on some draws only: trials are drawn apart
    if cut == 0.5:
        assert 0 < sum(t > 0 for t in record) < 5 or (fault and len(record) < 5), record


_PAIR_REFERENCE = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.lin = nn.Linear(64, 32)
        self.scale = scale

    def forward(self, x):
        return torch.tanh(self.lin(x)) * self.scale

def get_inputs():
    return [torch.rand(16, 64)]

def get_init_inputs():
    return [3.0]
'''
_PAIR_BODIES = {
    "off_by_1e-3": "return torch.tanh(self.lin(x)) * self.scale * (1 + 1e-3)",
    "raises_on_some_draws": ("if x[0, 0] > 0.3:\n            raise RuntimeError('boom')\n"
                             "        return torch.tanh(self.lin(x)) * self.scale"),
}


@pytest.mark.parametrize("name", sorted(_PAIR_BODIES))
def test_differential_child_probe_equals_separate_runs(kb_eval, tmp_path, name):
    """bench/kernelbench_differential.py's KernelBench child (CPU emulation): one
    eval_kernel_against_ref at 1e-4 with its allclose calls probed at 1e-2 gives the verdicts
    of two separate runs with get_tolerance_for_precision patched to each."""
    import json
    import subprocess

    reference = tmp_path / "reference.py"
    reference.write_text(_PAIR_REFERENCE)
    candidate = tmp_path / "candidate.py"
    candidate.write_text(_PAIR_REFERENCE.replace("Model", "ModelNew").replace(
        "return torch.tanh(self.lin(x)) * self.scale", _PAIR_BODIES[name]))
    verdicts = {}
    for mode in ("probe", "separate"):
        spec = {"mode": "eval", "kb_src": str(KERNELBENCH_SRC), "reference_path": str(reference),
                "candidate_path": str(candidate), "tolerances": [1e-4, 1e-2], "trials": 5,
                "kb_mode": mode, "emulate_cpu": True, "build_dir": str(tmp_path / "build"),
                "out": str(tmp_path / f"{mode}.json")}
        (tmp_path / f"{mode}.spec.json").write_text(json.dumps(spec))
        subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "kernelbench_eval_child.py"),
                        str(tmp_path / f"{mode}.spec.json")], check=True, capture_output=True,
                       timeout=120)
        runs = json.loads((tmp_path / f"{mode}.json").read_text())["runs"]
        verdicts[mode] = [(r["tol"], r["compiled"], r["correctness"]) for r in runs]
    assert verdicts["probe"] == verdicts["separate"]
    expected = {"off_by_1e-3": [(1e-4, True, False), (1e-2, True, True)],
                "raises_on_some_draws": [(1e-4, True, False), (1e-2, True, False)]}[name]
    assert verdicts["separate"] == expected


def test_differential_names_an_out_of_memory_side():
    """A disagreement where either side ran out of memory (KernelBench's jobs and our workers
    sharing one GPU, as in the first concurrent level-1 run) says so instead of 'unexplained'."""
    diff = _differential()
    record = {"ours_compiled": True, "ours_kernelbench": "accepted", "ours_kernelbench_v0": "accepted",
              "kb_compiled_0.0001": True, "kb_correct_0.0001": False, "kb_compiled_0.01": True,
              "kb_correct_0.01": False, "agree_kernelbench": False, "agree_kernelbench_v0": False,
              "kb_error_0.0001": "CUDA out of memory. Tried to allocate 6.00 GiB."}
    assert diff.suggest_reason(record, {"error": None}, {}, []).startswith("out of memory")
    ours_oom = dict(record, **{"kb_error_0.0001": None, "kb_correct_0.0001": True, "kb_correct_0.01": True,
                               "ours_kernelbench": "incorrect", "ours_kernelbench_v0": "incorrect"})
    assert "out of memory" in diff.suggest_reason(
        ours_oom, {"error": "Traceback ...\ntorch.OutOfMemoryError: CUDA out of memory."}, {}, [])
    assert diff.suggest_reason(dict(record, **{"kb_error_0.0001": "Output mismatch"}), {"error": None},
                               {}, []).startswith("unexplained")


def _differential():
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    try:
        import kernelbench_differential as diff
    finally:
        sys.path.remove(str(REPO_ROOT / "bench"))
    return diff


def test_differential_names_our_limits_and_counts_only_reached_reruns(tmp_path):
    """Level 1 as first run to the end on both sides: L1/45 failed our worker's host memory
    limit (KernelBench has none); a re-run budget that ended before L1/59 must not call its
    difference "reproduced"; and the tables can be rebuilt from a saved results file on a
    machine without a GPU."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    diff = _differential()
    ours_failed = {"ours_compiled": True, "ours_kernelbench": "incorrect",
                   "ours_kernelbench_v0": "incorrect", "kb_compiled_0.0001": True,
                   "kb_correct_0.0001": True, "kb_compiled_0.01": True, "kb_correct_0.01": True,
                   "kb_status_0.0001": "ok", "agree_kernelbench": False, "agree_kernelbench_v0": False}
    row = {"error": "memory: worker memory passed 16384 MB (phase correct)"}
    assert diff.suggest_reason(ours_failed, row, {}, []).startswith("our worker's host memory limit")
    row = {"error": "timeout: no answer within 120 s (phase correct)"}
    assert diff.suggest_reason(ours_failed, row, {}, []).startswith("our run phase limit")

    protocols = {name: named_protocol(name, None) for name in diff.PROTOCOLS}
    pairs = [{"key": "a", "pair_id": "copy/L1/21"}, {"key": "b", "pair_id": "copy/L1/59"}]
    entries = {("a", tol, 1): {"compiled": True, "correctness": True, "status": "ok", "metadata": {}}
               for tol in (1e-4, 1e-2)}
    reruns: dict = {}
    diff.add_reruns(reruns, pairs, entries, {}, [1e-4, 1e-2], protocols, 1)
    assert list(reruns) == ["a"] and reruns["a"][0]["kb_correct_0.0001"] is True
    kb_oom = dict(ours_failed, **{"ours_kernelbench": "accepted", "ours_kernelbench_v0": "accepted",
                                  "kb_correct_0.0001": False, "kb_correct_0.01": False,
                                  "kb_error_0.0001": "CUDA out of memory. Tried to allocate 7.00 GiB"})
    assert "reproduced" not in diff.suggest_reason(kb_oom, {"error": None}, {}, reruns.get("b", []))
    assert "nondeterministic" in diff.suggest_reason(kb_oom, {"error": None}, {}, reruns["a"])

    results = tmp_path / "results_run1.parquet"
    pq.write_table(pa.Table.from_pylist([{"job_id": "copy/L1/21@rerun1", "compiled": True}]), results)
    assert diff.saved_rows(pairs, results, "@rerun1") == {"a": {"job_id": "copy/L1/21@rerun1",
                                                               "compiled": True}}
    assert diff.saved_rows(pairs, tmp_path / "absent.parquet", "") == {}


def test_one_test_of_max_tolerance():
    """worker/correctness.within_max_tolerance: the one comparison every worker path uses
    (trials, the KernelBench gate to timing, timed outputs, the post-timing check)."""
    from kernelharness.worker.correctness import within_max_tolerance

    settings = {"max_tolerance": 0.01}
    assert within_max_tolerance(0.0, settings) and within_max_tolerance(0.01, settings)
    assert not within_max_tolerance(0.0100001, settings)
    assert not within_max_tolerance(math.inf, settings) and not within_max_tolerance(math.nan, settings)
