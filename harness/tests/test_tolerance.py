"""Tolerance as data, exact comparison, timing input slots, vendor libraries (pure, no builds)."""

from __future__ import annotations

import math

import pytest
import torch
from kernelharness.static_checks import static_flags, uses_vendor_library
from kernelharness.worker import correctness as C
from kernelharness.worker.measure import (MIN_INPUT_SETS, RotatingInputs, checked_calls,
                                             num_input_sets)
from kernelharness.worker.timing import balanced_order
from test_static import CUDA_HONEST


def passes(ref: torch.Tensor, cand: torch.Tensor, t: float) -> bool:
    """The comparison rule written out plainly: |c - r| <= t * max(1, max|r|) + t * |r|."""
    r, c = ref.double(), cand.double()
    scale = max(1.0, float(r.abs().max()))
    return bool(((c - r).abs() <= t * scale + t * r.abs()).all())


@pytest.mark.parametrize("magnitude", [1e-3, 1.0, 50.0])
def test_tolerance_needed_is_the_smallest_passing_tolerance(magnitude):
    gen = torch.Generator().manual_seed(int(magnitude * 1000))
    for _ in range(20):
        ref = (torch.randn(40, generator=gen, dtype=torch.float64) * magnitude)
        cand = ref + torch.randn(40, generator=gen, dtype=torch.float64) * magnitude * 1e-3
        needed, err, _reason = C.compare(ref, cand)
        assert err == pytest.approx(float((cand - ref).abs().max()))
        # brute force over a fine grid: the first passing tolerance brackets `needed`
        grid = [needed * (1 + k / 200) for k in range(-20, 21)]
        first = next(t for t in grid if passes(ref, cand, t))
        assert first == pytest.approx(needed, rel=6e-3)
        assert passes(ref, cand, needed * (1 + 1e-9))
        assert not passes(ref, cand, needed * (1 - 1e-3))


def test_tolerance_needed_edge_cases():
    x = torch.randn(8, 8)
    assert C.compare(x, x.clone())[0] == 0.0
    assert C.compare(x, x[:4])[0] == math.inf  # shape
    assert C.compare(x, x.double())[0] == math.inf  # dtype
    nan = x.clone()
    nan[0, 0] = float("nan")
    assert C.compare(x, nan)[0] == math.inf
    assert C.compare([x, x], [x])[0] == math.inf  # output count
    # low precision compares in fp32: half outputs one ulp apart need about 1e-3
    h = torch.full((4,), 1.0, dtype=torch.float16)
    assert 0 < C.compare(h, h + torch.finfo(torch.float16).eps)[0] < 2e-3


def test_non_floating_outputs_compare_exactly():
    flags = torch.tensor([True, False, True])
    assert C.compare(flags, flags.clone())[0] == 0.0
    assert C.compare(flags, ~flags)[0] == math.inf
    counts = torch.tensor([3, 4, 5])
    assert C.compare(counts, counts + 1)[0] == math.inf  # one off is wrong, at any tolerance
    assert C.compare(7, 7)[0] == 0.0 and C.compare(7, 8)[0] == math.inf
    assert C.compare(True, 1)[0] == math.inf  # a bool is not an int


def test_output_precision():
    assert C.output_precision(torch.zeros(2)) == "fp32"
    assert C.output_precision([torch.zeros(2, dtype=torch.half),
                               torch.zeros(2, dtype=torch.bfloat16)]) == "low_precision"
    assert C.output_precision([torch.zeros(2, dtype=torch.half), torch.zeros(2)]) == "fp32"
    assert C.output_precision([torch.tensor(True), torch.tensor([1, 2])]) == "exact"


def test_outputs_changed_reads_non_floating_outputs_exactly():
    # the bug this replaces: any bool/int output counted as "changed", so a right kernel of a
    # task whose answer repeats across draws (isinf(x).all()) was flagged input-insensitive
    same_bool = torch.tensor(False)
    assert not C.outputs_changed(same_bool, torch.tensor(False))
    assert C.outputs_changed(same_bool, torch.tensor(True))
    assert not C.outputs_changed(torch.tensor([1, 2]), torch.tensor([1, 2]))
    assert C.outputs_changed(torch.tensor([1, 2]), torch.tensor([1, 3]))
    x = torch.rand(16)
    assert not C.outputs_changed(x, x * (1 + 1e-7))
    assert C.outputs_changed(x, x + 0.1)
    assert C.outputs_changed(x, x[:8])


def test_input_slots_fit_memory_with_at_least_two():
    gib = 2**30
    assert num_input_sets(1024, 64 * gib) == 8
    assert num_input_sets(4 * gib, 64 * gib) == MIN_INPUT_SETS  # past the budget: still 2
    assert num_input_sets(gib // 2, 24 * gib) == 4  # 6 GiB budget / 1.5 GiB a slot


def test_checked_calls_are_slot_reuses():
    calls = checked_calls(first_call=3, trials=50, slots=8, seed=1)
    assert len(calls) == 7 and all(8 <= c < 53 for c in calls)
    assert calls == checked_calls(first_call=3, trials=50, slots=8, seed=1)
    assert len(checked_calls(first_call=0, trials=4, slots=8, seed=0)) == 2


def test_rotating_inputs_refill_in_place_and_never_repeat_values():
    def get_inputs():
        return [torch.rand(4, 4), 3]

    source = RotatingInputs(get_inputs, seed=5, count=2, device="cpu")
    seen, addresses = [], []
    for _ in range(6):
        _call, args = source.next()
        seen.append(args[0].clone())
        addresses.append(args[0].data_ptr())
        assert args[1] == 3
    assert addresses[0::2] == [addresses[0]] * 3 and addresses[1::2] == [addresses[1]] * 3
    assert addresses[0] != addresses[1]
    for i in range(6):  # no call sees values an earlier call saw
        assert all(not torch.equal(seen[i], seen[j]) for j in range(i))


def test_rotating_inputs_draw_between_rounds_only():
    draws = []

    def get_inputs():
        draws.append(1)
        return [torch.rand(8)]

    source = RotatingInputs(get_inputs, seed=1, count=3, device="cpu")
    per_call, seen = [], []
    for _ in range(9):
        before = len(draws)
        _call, args = source.next()
        per_call.append(len(draws) - before)
        seen.append(args[0].clone())
    # the first round uses the slots as drawn; each later round starts by redrawing all three
    assert per_call == [0, 0, 0, 3, 0, 0, 3, 0, 0]
    assert all(not torch.equal(seen[i], seen[j]) for i in range(9) for j in range(i))


def test_balanced_order_times_each_model_first_equally_often_at_every_slot_position():
    for seed in range(20):
        for slots in (1, 2, 3, 8):
            first = balanced_order(seed, slots)
            calls = range(3, 3 + 40 * slots)  # any start (warm-up calls come first)
            for position in range(slots):
                at = [first(c) for c in calls if c % slots == position]
                assert abs(sum(at) - (len(at) - sum(at))) <= 1
    # not one fixed pattern: the first round's order depends on the seed
    assert len({tuple(balanced_order(s, 8)(c) for c in range(8)) for s in range(20)}) > 1


VENDOR_SNIPPETS = {
    "cublas": "cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &a, A, m, B, k, &b, C, m);",
    "cublaslt": "cublasLtMatmul(lt, desc, &alpha, A, la, B, lb, &beta, C, lc, D, ld, 0, 0, 0, s);",
    "cudnn": "cudnnConvolutionForward(h, &a, xd, x, wd, w, cd, algo, ws, wsb, &b, yd, y);",
    "cutlass": "using Gemm = cutlass::gemm::device::Gemm<float, cutlass::layout::RowMajor>;",
    "cub": "cub::DeviceReduce::Sum(tmp, tmp_bytes, in, out, n);",
    "thrust": "thrust::transform(thrust::device, a, a + n, b, thrust::negate<float>());",
}
# the honest CUDA file with its kernel launch replaced by a vendor call (no __global__ launch)
_LAUNCH = "relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);"


@pytest.mark.parametrize("library", sorted(VENDOR_SNIPPETS))
def test_vendor_library_call_is_own_work(library):
    code = CUDA_HONEST.replace("__global__", "static").replace(_LAUNCH, VENDOR_SNIPPETS[library])
    assert "<<<" not in code
    row = static_flags(code, "cuda")
    assert row["uses_vendor_library"] and not row["flag_no_kernel"], library
    assert uses_vendor_library(VENDOR_SNIPPETS[library])


def test_torch_work_in_cpp_stays_no_kernel():
    code = CUDA_HONEST.replace(_LAUNCH, "y = at::matmul(x, x);  // cublasSgemm(h) in a comment\n"
                                        "cublasHandle_t h; cublasCreate(&h);")
    row = static_flags(code, "cuda")
    assert row["flag_no_kernel"] and not row["uses_vendor_library"]
    # a vendor call in Python text (not a load_inline source) is not the candidate's C++
    assert not static_flags("import torch\nclass ModelNew(torch.nn.Module):\n"
                            "    def forward(self, x):\n        'cublasSgemm(h)'\n"
                            "        return x @ x\n", "cuda")["uses_vendor_library"]
