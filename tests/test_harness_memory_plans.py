"""The checks' memory: block-wise comparisons give the whole-tensor verdicts, variants applied
in place give the same inputs, and an out-of-memory error goes to a leaner plan and blames
the candidate only for its own call in the leanest (CPU; one GPU test of the peak, marked)."""

from __future__ import annotations

import math

import pytest
import torch
from dicepipe.evaluation.scoring import reference_status
from kernelharness.worker import correctness as C
from kernelharness.worker import device_job
from kernelharness.worker import memory_plans as M
from kernelharness.worker import trials as T
from kernelharness.worker.kb_trials import run_kernelbench_trials
from torch import nn

SETTINGS = {"max_tolerance": 0.01, "correct_trials": 5}
FLAGS = ("flag_input_mutation", "flag_output_alias", "flag_output_cached",
         "flag_input_insensitive")


# --- the comparisons as whole-tensor arithmetic (what the block-wise ones must equal) ----------

def whole_tensor_tolerance(r, c):
    if r.numel() == 0:
        return 0.0, 0.0
    if not r.is_floating_point() and not r.is_complex():
        return (0.0, 0.0) if bool(torch.equal(r, c)) else (math.inf, math.inf)
    work = torch.float64 if r.dtype in (torch.float64, torch.complex128) else torch.float32
    if r.is_complex():
        rw, cw = torch.view_as_real(r).to(work), torch.view_as_real(c).to(work)
    else:
        rw, cw = r.to(work), c.to(work)
    if not torch.isfinite(cw).all():
        return math.inf, math.inf
    diff = (rw - cw).abs()
    err = float(diff.max())
    if math.isnan(err):
        return math.inf, math.inf
    scale = max(1.0, float(rw.abs().max()))
    return float((diff / (scale + rw.abs())).max()), err


def whole_outputs_changed(x, y, threshold=1e-5):
    if x.shape != y.shape or x.dtype != y.dtype:
        return True
    if x.numel() == 0:
        return False
    if not (x.is_floating_point() or x.is_complex()):
        return not torch.equal(x, y)
    xf = x.to(torch.complex128 if x.is_complex() else torch.float64)
    yf = y.to(xf.dtype)
    scale = float(xf.abs().max()) + float(yf.abs().max()) + 1e-30
    return not float((xf - yf).abs().max()) / scale <= threshold


def whole_allclose_tolerance(r, c):
    if r.numel() == 0:
        return 0.0
    if r.is_complex():
        r, c = torch.view_as_real(r), torch.view_as_real(c)
    r, c = r.reshape(-1).double(), c.reshape(-1).double()
    if bool(torch.isnan(r).any()) or bool(torch.isnan(c).any()):
        return math.inf
    differ = r != c
    r, c = r[differ], c[differ]
    if r.numel() == 0:
        return 0.0
    if not bool(torch.isfinite(r).all()) or not bool(torch.isfinite(c).all()):
        return math.inf
    return float(((r - c).abs() / (1.0 + c.abs())).max())


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def output_pairs(seed: int):
    """(reference, candidate) pairs: dtypes, shapes (non-contiguous, empty, 0-d), NaN and
    infinities on either side, errors around the tolerances."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(), (0,), (1,), (37,), (6, 11), (3, 1, 17), (2, 4, 5, 3)]
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64,
                  torch.int64, torch.bool):
        for shape in shapes:
            base = torch.randn(shape, generator=gen, dtype=torch.float64) * 3
            r = base.to(dtype) if not dtype.is_complex else torch.complex(base, base).to(dtype)
            if dtype == torch.bool:
                r = base > 0
            for kind in ("equal", "close", "far", "nan_cand", "nan_ref", "inf_both",
                         "inf_cand", "transposed"):
                c = r.clone()
                if kind == "close" and r.is_floating_point():
                    c = (r.double() * (1 + 1e-5 * torch.randn(shape, generator=gen,
                                                              dtype=torch.float64))).to(dtype)
                elif kind == "far" and r.numel():
                    c = r + 1 if dtype != torch.bool else ~r
                elif kind in ("nan_cand", "nan_ref", "inf_both", "inf_cand") and r.numel() \
                        and r.is_floating_point():
                    value = math.nan if kind.startswith("nan") else math.inf
                    target = r if kind in ("nan_ref", "inf_both") else c
                    r = r.clone() if target is r else r
                    target = r if kind in ("nan_ref", "inf_both") else c
                    target.view(-1)[0] = value
                    if kind == "inf_both":
                        c.view(-1)[0] = value
                elif kind == "transposed" and r.dim() >= 2:
                    r, c = r.transpose(0, -1), (c + (1 if dtype != torch.bool else 0)).transpose(
                        0, -1) if dtype != torch.bool else (~c).transpose(0, -1)
                yield r, c


@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_block_comparisons_equal_the_whole_tensor_ones(chunk):
    count = 0
    for r, c in output_pairs(chunk):
        t_new, e_new = C.tensor_tolerance(r, c, chunk=chunk)
        t_old, e_old = whole_tensor_tolerance(r, c)
        assert same(t_new, t_old) and same(e_new, e_old), (r, c)
        assert C.outputs_changed(r, c, chunk=chunk) == whole_outputs_changed(r, c), (r, c)
        assert C.tensors_equal(r, c, chunk) == bool(torch.equal(r, c))
        assert C.all_finite(c, chunk) == (not c.is_floating_point()
                                          or bool(torch.isfinite(c).all()))
        if r.dtype != torch.bool:
            assert same(C.allclose_tolerance(r, c, chunk=chunk), whole_allclose_tolerance(r, c))
        count += 1
    assert count > 300


def test_index_blocks_cover_every_element_once_within_the_chunk():
    for shape in [(), (7,), (3, 10), (2, 3, 50), (5, 1, 1), (1, 200)]:
        t = torch.arange(math.prod(shape)).reshape(shape)
        blocks = [t[idx].reshape(-1) for idx in C.index_blocks(shape, 16)]
        assert all(b.numel() <= 16 for b in blocks)
        assert torch.equal(torch.cat(blocks) if blocks else t.reshape(-1), t.reshape(-1))


@pytest.mark.parametrize("variant", C.VARIANTS)
def test_variants_in_place_give_the_same_inputs(variant):
    torch.manual_seed(0)
    x = torch.rand(9, 70, dtype=torch.float16) - 0.5
    x[0, :5] = 0.0  # exact zeros stay
    kept = torch.rand(4)  # a tensor the task module holds: never written over
    view = torch.rand(8)
    expected = C.apply_variant([x, kept, view[2:], 3], variant, 7)
    originals = (kept.clone(), view.clone())
    got = C.apply_variant([x, kept, view[2:], 3], variant, 7, in_place=True, shared=(kept,))
    for a, b in zip(expected, got):
        assert (a == b) if not isinstance(a, torch.Tensor) else torch.equal(a, b)
    assert torch.equal(kept, originals[0]) and torch.equal(view, originals[1])
    assert variant == "as_drawn" or got[0] is x  # the unshared one was transformed in place


# --- the strict trials in each plan, and the ladder ---------------------------------------------

class Relu(nn.Module):
    def forward(self, x):
        return torch.relu(x)


class CachedOutput(nn.Module):
    """Returns the same buffer every call (KernelBench's "result reuse")."""

    def __init__(self):
        super().__init__()
        self.buf = None

    def forward(self, x):
        if self.buf is None:
            self.buf = torch.empty_like(x)
        return self.buf.copy_(torch.relu(x))


class Mutates(nn.Module):
    def forward(self, x):
        y = torch.relu(x)
        x.zero_()
        return y


class ShortOfMemory(nn.Module):
    """Raises as CUDA's allocator does on its first `fail` calls (all when None)."""

    def __init__(self, inner: nn.Module, fail: int | None = None):
        super().__init__()
        self.inner, self.fail, self.calls = inner, fail, 0

    def forward(self, x):
        self.calls += 1
        if self.fail is None or self.calls <= self.fail:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 12.00 GiB")
        return self.inner(x)


def draw():
    return [torch.rand(16, 40)]


def strict(cand, ref=None, plan=M.PLANS[0]):
    flags = dict.fromkeys(FLAGS, False)
    return T._strict_trials(draw, ref or Relu(), cand, 5, SETTINGS, "cpu", None, plan, flags)


@pytest.mark.parametrize("plan", M.PLANS, ids=lambda p: p.name)
def test_each_plan_gives_the_same_verdict_and_its_flags(plan):
    honest = strict(Relu(), plan=plan)
    assert honest["correct"] and honest["tolerance_needed"] == 0.0
    assert honest["variants_run"] == list(C.VARIANTS)
    assert not any(honest[f] for f in FLAGS)
    assert strict(Mutates(), plan=plan)["flag_input_mutation"]
    # the leanest plan keeps no earlier output alive on the device: the address check is
    # the one it gives up (and the row says so)
    assert strict(CachedOutput(), plan=plan)["flag_output_cached"] == (plan.name != "leanest")


def test_harness_copy_short_of_memory_moves_to_a_leaner_plan(monkeypatch):
    real = C.clone_args
    calls = {"n": 0}

    def clone_short_once(args):
        calls["n"] += 1
        if calls["n"] == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 6.00 GiB")
        return real(args)

    monkeypatch.setattr(C, "clone_args", clone_short_once)
    result = T.check_correctness(draw, Relu(), Relu(), 5, SETTINGS, "cpu")
    assert result["correct"] and result["memory_plan"] == "host"
    assert "harness's own copies ran short" in result["memory_note"]
    assert "the cached-output check across trials" in result["memory_note"]
    assert "out of memory" not in result["memory_note"]  # (hygiene reads that as a failure)


def test_candidate_short_in_the_device_plan_only_is_correct_in_the_next():
    result = T.check_correctness(draw, Relu(), ShortOfMemory(Relu(), fail=1), 5, SETTINGS, "cpu")
    assert result["correct"] and result["memory_plan"] == "host"
    assert "device: the candidate's call ran short" in result["memory_note"]


def test_candidate_blamed_only_when_its_own_call_runs_out_in_the_leanest_plan():
    cand = ShortOfMemory(Relu())
    with pytest.raises(M.CandidateOutOfMemory, match="leanest memory plan"):
        T.check_correctness(draw, Relu(), cand, 5, SETTINGS, "cpu")
    assert cand.calls == len(M.PLANS)  # one try in every plan


def test_reference_that_does_not_fit_is_harness_limited():
    with pytest.raises(T.HarnessLimited, match="harness-limited"):
        T.check_correctness(draw, ShortOfMemory(Relu()), Relu(), 5, SETTINGS, "cpu")


def test_kernelbench_trials_retry_with_the_reference_output_in_host_memory():
    record: list = []
    run_kernelbench_trials(draw, Relu(), ShortOfMemory(Relu(), fail=1), 5, "cpu", record,
                           T.ReferenceFailed)
    assert record == [0.0] * 5
    record = []
    run_kernelbench_trials(draw, Relu(), ShortOfMemory(Relu()), 5, "cpu", record,
                           T.ReferenceFailed)
    assert record == [math.inf]  # its own call, in the last plan: its failure, trials end
    with pytest.raises(T.HarnessLimited):
        run_kernelbench_trials(draw, ShortOfMemory(Relu()), Relu(), 5, "cpu", [],
                               T.ReferenceFailed)


class _Context:
    """What run_job needs of a device worker's context, in this process."""

    def __init__(self, folder):
        from kernelharness.worker.guards import ThreadWatch

        self.device, self.toolchain, self.extensions = "cpu", {}, {}
        self.cache = self.folder = self.job_folder = folder
        self.current_phase = "load"
        self.thread_watch = ThreadWatch()
        self.base_threads = 1_000

    def phase(self, name, timeout_s):
        self.current_phase = name.split(":")[0]


PROGRAM = """
import torch
from torch import nn
CALLS = []
class {name}(nn.Module):
    def forward(self, x):
        CALLS.append(1)
        if {short}:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 12.00 GiB")
        return torch.relu(x)
def get_inputs():
    return [torch.rand({shape})]
def get_init_inputs():
    return []
"""


def job_row(tmp_path, ref_short: str, cand_short: str, device: str = "cpu",
            shape: str = "16, 40", kb_trials: int = 5, measure_speed: bool = False) -> dict:
    from kernelharness import HarnessSettings

    settings = HarnessSettings.with_defaults(
        correct_trials=5, kernelbench_trials=kb_trials, warmup_trials=1, timing_trials_cpu=10,
        repeats=1, cache_dir=str(tmp_path)).to_wire()
    msg = {"reference_code": PROGRAM.format(name="Model", short=ref_short, shape=shape),
           "candidate_code": PROGRAM.format(name="ModelNew", short=cand_short, shape=shape),
           "seed": 3, "settings": settings, "measure_speed": measure_speed,
           "variant_plan": None}
    context = _Context(tmp_path)
    context.device = device
    return device_job.run_job(msg, context)["row"]


def test_a_job_names_whose_memory_ran_out(tmp_path):
    limited = job_row(tmp_path, "True", "False")
    assert limited["error_phase"] == "reference" and "harness-limited" in limited["error"]
    assert reference_status(dict(limited, compiled=True))[0] is False  # out of every count
    blamed = job_row(tmp_path, "False", "True")
    assert blamed["compiled"] and not blamed["correct"]
    assert blamed["error_phase"] == "correct" and "leanest memory plan" in blamed["error"]
    assert blamed["kb_trial_tolerance"] == [math.inf]
    # short in the device plan only (KernelBench's first trial, then the strict trials'
    # first call): correct, and the row says what the strict trials' plan skipped
    lean = job_row(tmp_path, "False", "len(CALLS) in (1, 7)")
    assert lean["correct"] and lean["kb_trial_tolerance"] == [0.0] * 5
    assert lean.get("error_phase") is None
    assert "memory plan 'host'" in lean["error"] and "across trials" in lean["error"]


def test_timing_short_of_room_is_skipped_unless_the_candidate_ran_out(tmp_path, monkeypatch):
    from kernelharness.worker import measure

    # 5 KernelBench trials and 10 strict calls of the candidate, then timing's
    blamed = job_row(tmp_path, "False", "len(CALLS) > 15", measure_speed=True)
    assert not blamed["correct"] and blamed["error_phase"] == "timing"
    timed = job_row(tmp_path, "False", "False", measure_speed=True)
    assert timed["correct"] and timed["speedup_median"] is not None

    def no_room(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 6.00 GiB")

    monkeypatch.setattr(measure.RotatingInputs, "__init__", no_room)
    skipped = job_row(tmp_path, "False", "False", measure_speed=True)
    assert skipped["correct"] and skipped.get("error_phase") is None
    assert skipped["speedup_median"] is None and skipped["num_repeats"] == 0
    assert "timing and the post-timing check skipped" in skipped["error"]


def test_rows_that_ran_out_of_memory_without_a_plan_are_measured_again():
    from kernelharness.results import empty_row, finish_row
    from kernelharness.session import _reusable

    row = finish_row(dict(empty_row("j", "cuda"), content_key="k"))
    assert _reusable(row, "k")
    before = dict(row, error_phase="correct", error="torch.OutOfMemoryError: CUDA out of "
                  "memory. Tried to allocate 12.00 GiB")
    assert not _reusable(before, "k")  # the harness's copies were blamed on the candidate
    today = dict(before, error="the candidate's own call ran out of device memory in the "
                 "leanest memory plan (...): candidate: CUDA out of memory.")
    assert _reusable(today, "k")


def test_score_names_harness_limited_tasks_apart():
    from kernelharness.results import empty_row, finish_row, rows_to_table
    from dicepipe.judgement import BUILTIN_PROTOCOLS
    from dicepipe.stages.score import summarize

    ok = finish_row(dict(empty_row("relu", "cuda"), compiled=True, correct=True,
                         kb_trial_tolerance=[0.0] * 5, output_precision="fp32"))
    limited = finish_row(dict(empty_row("huge", "cuda"), compiled=True, error_phase="reference",
                              error="harness-limited: the reference alone cannot be checked"))
    lines = summarize(rows_to_table([ok, limited]), [1.0], True, BUILTIN_PROTOCOLS)
    assert any(line.startswith("1 tasks are harness-limited") and "huge" in line
               for line in lines), lines
    assert not any("failed on their own" in line for line in lines)
    assert "[kernelbench_v0] 1 correct, 1 correct without deception flags" in lines


# --- on a GPU: the peak memory of a large honest relu's checks -------------------------------

def _peak_bytes(fn) -> int:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - start


MARGIN_BYTES = 1 << 30  # blocks of the comparisons and variants, well under this


@pytest.mark.gpu
def test_peak_memory_of_a_whole_job_on_a_large_honest_relu(tmp_path):
    """The device job as a worker runs it (KernelBench's trial, the strict trials), correct
    in the device plan, within 2I + 3O + MARGIN_BYTES (I = O: a sixteenth of the card)."""
    total = torch.cuda.get_device_properties(0).total_memory
    elements = min(4 << 30, total // 16) // 4
    row = {}

    def job():
        row.update(job_row(tmp_path, "False", "False", "cuda", str(elements), kb_trials=1))

    peak = _peak_bytes(job)
    assert row["correct"] and row.get("error") is None, row.get("error")
    assert peak <= 5 * elements * 4 + MARGIN_BYTES, peak / (elements * 4)


@pytest.mark.gpu
def test_peak_memory_of_a_large_honest_relu_stays_within_the_plan_bound():
    """I = O = one input's bytes (a sixteenth of the card, at most 4 GiB). Bounds: KernelBench's
    trials I + 2O; the probe 2I; the strict trials' device plan 2I + 3O (a pristine and a
    call's input set; the reference's, the first and the second candidate output), host
    I + 2O, leanest I + O; each plus MARGIN_BYTES."""
    total = torch.cuda.get_device_properties(0).total_memory
    elements = min(4 << 30, total // 16) // 4
    size = elements * 4

    def get_inputs():
        return [torch.rand(elements)]

    ref, cand = Relu().cuda(), Relu().cuda()
    kb = _peak_bytes(lambda: run_kernelbench_trials(get_inputs, ref, cand, 2, "cuda", [],
                                                    T.ReferenceFailed))
    assert kb <= 3 * size + MARGIN_BYTES, kb / size
    probe = _peak_bytes(lambda: T.probe_reference(get_inputs, ref, 5, 5, "cuda", []))
    assert probe <= 2 * size + MARGIN_BYTES, probe / size
    bound = {"device": 5 * size, "host": 3 * size, "leanest": 2 * size}
    settings = dict(SETTINGS, correct_trials=3)
    for plan in M.PLANS:
        result: dict = {}

        def trials(memory_plan=plan, out=result):
            out.update(T._strict_trials(get_inputs, ref, cand, 5, settings, "cuda", None,
                                        memory_plan, dict.fromkeys(FLAGS, False)))

        peak = _peak_bytes(trials)
        assert result["correct"] and result["tolerance_needed"] == 0.0
        assert peak <= bound[plan.name] + MARGIN_BYTES, (plan.name, peak / size)
