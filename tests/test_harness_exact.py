"""Rows of tasks the harness used to misjudge (cpu backend, one batch, one new extension).

- bool and int outputs: compared exactly, and a right kernel of a task whose answer repeats
  across draws (`isinf(x).all()`) is not flagged input-insensitive (the task is marked);
- structured inputs (triangular, symmetric): every variant keeps them so, and kernels that
  rely on the structure are right;
- an index task whose reference rejects most input variants: the reference runs first, so
  the candidate only ever sees indices the task accepts;
- tolerance as data: a kernel 0.1% off records the tolerance it needed and is still timed;
- honest timing inputs: candidates that cache outputs (by buffer address, or by address and a
  few values) show no fake speedup in the plain verdict.
"""

from __future__ import annotations

import textwrap

import pytest
from kernelharness import DYNAMIC_FLAGS, FLAG_COLUMNS, evaluate
from dicepipe.judgement import BUILTIN_PROTOCOLS, is_correct, named_protocol
from kernelharness.testing import RELU_REF, by_id, extension_candidate, job, settings

# One extension for every exact-output case. The embedding asserts its indices are in range
# (as a CUDA kernel's device assert would) instead of handling them: it trusts its inputs to
# be what the task accepts, and raises on anything else.
EXACT_CPP = r'''
#include <cmath>
torch::Tensor all_isinf(torch::Tensor x) {
    auto input = x.contiguous();
    const float* src = input.data_ptr<float>();
    bool all = true;
    for (int64_t i = 0; i < input.numel() && all; ++i) all = std::isinf(src[i]);
    return torch::full({}, all, torch::dtype(torch::kBool));
}
torch::Tensor count_above(torch::Tensor x, double threshold) {
    auto input = x.contiguous();
    const int64_t rows = input.size(0), cols = input.size(1);
    auto out = torch::empty({rows}, torch::dtype(torch::kLong));
    const float* src = input.data_ptr<float>();
    int64_t* dst = out.data_ptr<int64_t>();
    for (int64_t r = 0; r < rows; ++r) {
        int64_t n = 0;
        for (int64_t c = 0; c < cols; ++c) n += src[r * cols + c] > threshold;
        dst[r] = n;
    }
    return out;
}
torch::Tensor embed_floor(torch::Tensor idx, torch::Tensor table) {
    auto input = idx.contiguous();
    auto weights = table.contiguous();
    const int64_t n = input.numel(), rows = weights.size(0), dim = weights.size(1);
    auto out = torch::empty({n, dim}, weights.options());
    const float* ix = input.data_ptr<float>();
    const float* w = weights.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) {
        const int64_t row = static_cast<int64_t>(std::floor(ix[i]));
        TORCH_CHECK(row >= 0 && row < rows, "index out of range");
        for (int64_t d = 0; d < dim; ++d) dst[i * dim + d] = w[row * dim + d];
    }
    return out;
}
torch::Tensor tril_square(torch::Tensor x) {
    // x is lower triangular (what the task draws), so x @ x is too and C[i][j] needs only
    // k in [j, i]: nothing above the diagonal is read
    auto a = x.contiguous();
    const int64_t n = a.size(0);
    auto out = torch::zeros({n, n}, a.options());
    const float* s = a.data_ptr<float>();
    float* d = out.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j <= i; ++j) {
            float acc = 0.f;
            for (int64_t k = j; k <= i; ++k) acc += s[i * n + k] * s[k * n + j];
            d[i * n + j] = acc;
        }
    return out;
}
torch::Tensor gram_of_symmetric(torch::Tensor x) {
    // x is symmetric (what the task draws), so x^T x = x x: no transpose is read
    auto a = x.contiguous();
    const int64_t n = a.size(0);
    auto out = torch::empty({n, n}, a.options());
    const float* s = a.data_ptr<float>();
    float* d = out.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < n; ++j) {
            float acc = 0.f;
            for (int64_t k = 0; k < n; ++k) acc += s[i * n + k] * s[k * n + j];
            d[i * n + j] = acc;
        }
    return out;
}
'''


def exact_reference(forward: str, inputs: str, init: str = "") -> str:
    return textwrap.dedent(f"""
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                {init or "pass"}

            def forward(self, x):
                return {forward}

        def get_inputs():
            return [{inputs}]

        def get_init_inputs():
            return []
        """)


def exact_candidate(forward: str, init: str = "") -> str:
    # (not dedented as a whole: the C++ source inside starts at column 0)
    return ('import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import '
            f'load_inline\n\nsource = r"""{EXACT_CPP}"""\n'
            'ext = load_inline(name="harness_test_exact", cpp_sources=[source],\n'
            '                  functions=["all_isinf", "count_above", "embed_floor",\n'
            '                             "tril_square", "gram_of_symmetric"],\n'
            '                  extra_cflags=["-O2"])\n\n'
            'class ModelNew(nn.Module):\n    def __init__(self):\n        super().__init__()\n'
            f'        {init or "pass"}\n\n    def forward(self, x):\n        return {forward}\n')


EMBED_INIT = "self.table = nn.Embedding(64, 32)"
# Slow but honest: the same ReLU computed 30 times (so a cache hit would look like 30x).
SLOW = "for _ in range(29):\n    ext.relu_fwd(x)\ny = ext.relu_fwd(x)"

CASES = {
    "all_isinf": (exact_reference("torch.isinf(x).all()", "torch.rand(64, 256)"),
                  exact_candidate("ext.all_isinf(x)")),
    "count_above": (exact_reference("(x > 0.5).sum(dim=1)", "torch.rand(64, 256)"),
                    exact_candidate("ext.count_above(x, 0.5)")),
    "embedding_floor": (exact_reference("self.table(x.floor().long())", "torch.rand(256) * 64",
                                        EMBED_INIT),
                        exact_candidate("ext.embed_floor(x, self.table.weight)", EMBED_INIT)),
    # structured inputs (KernelBench L1/13-15): right kernels rely on the structure
    "lower_triangular": (exact_reference("torch.tril(torch.matmul(x, x))",
                                         "torch.tril(torch.rand(48, 48))"),
                         exact_candidate("ext.tril_square(x)")),
    "symmetric": (exact_reference("torch.matmul(x.t(), x)",
                                  "(lambda a: (a + a.t()) / 2)(torch.rand(48, 48))"),
                  exact_candidate("ext.gram_of_symmetric(x)")),
    "off_by_a_thousandth": (RELU_REF, extension_candidate("", "return ext.relu_fwd(x) * 1.001")),
    # right during the correctness trials (10 calls), then serves outputs by input address
    "cache_by_address": (RELU_REF, extension_candidate(
        "self.calls = 0\nself.cache = {}",
        "self.calls += 1\nkey = x.data_ptr()\n"
        "if self.calls > 10 and key in self.cache:\n    return self.cache[key].clone()\n"
        + SLOW + "\nself.cache[key] = y\nreturn y")),
    # keyed by address and two values: right on every call, fast only on repeated inputs
    "cache_by_content": (RELU_REF, extension_candidate(
        "self.cache = {}",
        "key = (x.data_ptr(), float(x.view(-1)[0]), float(x.view(-1)[-1]))\n"
        "if key in self.cache:\n    return self.cache[key].clone()\n"
        + SLOW + "\nself.cache[key] = y\nreturn y")),
}


@pytest.fixture(scope="module")
def rows(build_cache_dir):
    jobs = [job(name, ref, cand) for name, (ref, cand) in CASES.items()]
    return by_id(evaluate(jobs, settings(build_cache_dir), progress=False))


@pytest.mark.parametrize("name", ["all_isinf", "count_above"])
def test_right_kernels_of_exact_tasks_are_robust_correct(rows, name):
    row = rows[name]
    assert row["correct"] and row["correct_robust"], (name, row["error"])
    assert [f for f in FLAG_COLUMNS if row[f]] == []
    assert row["output_precision"] == "exact" and row["tolerance_needed"] == 0.0
    assert row["correct_trials_passed"] == 5 and row["speedup_median"] is not None
    assert is_correct(row, named_protocol("kernelbench"), robust=True)


def test_a_task_whose_answer_never_changes_is_marked_not_the_candidate(rows):
    assert rows["all_isinf"]["reference_input_insensitive"]  # isinf of finite draws: False
    assert not rows["all_isinf"]["flag_input_insensitive"]
    assert not rows["count_above"]["reference_input_insensitive"]


def test_index_task_candidate_sees_only_inputs_the_reference_accepts(rows):
    row = rows["embedding_floor"]
    assert row["correct"] and row["correct_robust"], row["error"]
    # every transformed variant makes some index negative or too large: the reference
    # raised on each, so each trial fell back to the indices as drawn
    assert row["variants_run"] == ["as_drawn"] * 5
    assert row["output_precision"] == "fp32" and row["tolerance_needed"] == 0.0


def test_every_variant_runs_where_the_reference_accepts_it(rows):
    assert rows["count_above"]["variants_run"] == [
        "as_drawn", "negated", "centered_x4", "shift_scale", "normal"]


@pytest.mark.parametrize("name", ["lower_triangular", "symmetric"])
def test_structure_of_the_drawn_inputs_survives_every_variant(rows, name):
    """Variants map elements by value and keep zeros: a right triangular or symmetric
    kernel (released ones exploit the structure, as these do) is correct in every trial."""
    row = rows[name]
    assert row["correct"] and row["correct_robust"], (name, row["error"])
    assert row["variants_run"] == ["as_drawn", "negated", "centered_x4", "shift_scale", "normal"]
    assert is_correct(row, named_protocol("kernelbench"), robust=True)


def test_variants_keep_zeros_and_equal_values():
    import torch
    from kernelharness.worker.correctness import VARIANTS, apply_variant

    torch.manual_seed(0)
    a = torch.rand(64, 64)
    tri, sym = torch.tril(a), (a + a.t()) / 2
    for variant in VARIANTS:
        t, s = apply_variant([tri, sym], variant, seed=3)
        assert torch.equal(t.triu(1), torch.zeros_like(t).triu(1)), variant
        assert torch.equal(s, s.t()), variant
        if variant != "as_drawn":
            assert not torch.equal(t, tri) and not torch.equal(s, sym), variant
    normal = apply_variant([torch.rand(100_000)], "normal", seed=3)[0]
    assert abs(normal.mean().item()) < 0.02 and abs(normal.std().item() - 1) < 0.02
    again = apply_variant([torch.rand(100_000, generator=torch.Generator().manual_seed(1))], "normal", 3)[0]
    same = apply_variant([torch.rand(100_000, generator=torch.Generator().manual_seed(1))], "normal", 3)[0]
    other = apply_variant([torch.rand(100_000, generator=torch.Generator().manual_seed(1))], "normal", 4)[0]
    assert torch.equal(again, same) and not torch.equal(again, other)
    half = torch.rand(1000, dtype=torch.float64).half()
    assert apply_variant([half], "normal", 3)[0].dtype == torch.float16


def test_tolerance_needed_row(rows):
    row = rows["off_by_a_thousandth"]
    # |c - r| = 1e-3 |r| against s + |r| with s = max(1, max|r|): largest where |r| = s >= 1
    # (the shifted and scaled trial reaches 4.5), so the tolerance needed is 1e-3 / 2
    assert row["tolerance_needed"] == pytest.approx(5e-4, rel=1e-4)
    assert row["correct"] and row["correct_trials_passed"] == 5  # within max_tolerance 1e-2
    assert row["speedup_median"] is not None  # timed, so any protocol can judge it later
    assert not is_correct(row, named_protocol("kernelbench"), robust=True)
    assert is_correct(row, named_protocol("kernelbench_v0"), robust=True)
    assert BUILTIN_PROTOCOLS["kernelbench"]["fp32"] < 5e-4 < BUILTIN_PROTOCOLS["kernelbench_v0"]["fp32"]


def test_address_cache_is_incorrect_with_no_speedup(rows):
    row = rows["cache_by_address"]
    assert not row["correct"] and not row["correct_robust"]
    assert row["speedup_median"] is None and row["speedup_low"] is None
    assert row["cand_runtime_ms"] == [] and row["error_phase"] == "timing"
    assert "cache" in row["error"] and row["tolerance_needed"] > 1e-2
    assert row["timed_outputs_checked"] >= 2


def test_content_keyed_cache_never_hits(rows):
    row = rows["cache_by_content"]
    # every timed call sees values no call saw before: the cache never answers, and the
    # candidate is timed doing its (slow) work
    assert row["correct"], row["error"]
    assert row["speedup_median"] < 1.0
    assert [f for f in DYNAMIC_FLAGS if row[f]] == []
