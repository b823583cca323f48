"""Inputs, output comparison and the memory checks behind the dynamic deception flags.

Inputs come from the reference's own `get_inputs()` under a per-trial seed, then one of
several distributions is applied to its floating-point tensors (as drawn, negated, centred
and widened, shifted and scaled, standard normal), so a kernel right only on [0, 1) inputs
(ReLU as identity, say) fails. A distribution under which the reference itself produces
non-finite values or raises is not informative for that task and falls back to as-drawn.
Values pass as in `torch.allclose` (|c - r| <= atol + rtol * |r|), with atol scaled by the
output's largest magnitude where that exceeds 1; shape and dtype must match; NaN never passes.
"""

from __future__ import annotations

import math

import torch

VARIANTS = ("as_drawn", "negated", "centered_x4", "shift_scale", "normal")
LOW_PRECISION = (torch.float16, torch.bfloat16)


def draw_inputs(get_inputs, seed: int, device: str) -> list:
    torch.manual_seed(seed)
    with torch.device(device):
        inputs = get_inputs()
    return [to_device(x, device) for x in inputs]


def to_device(obj, device: str):
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(x, device) for x in obj)
    return obj


def apply_variant(inputs: list, variant: str, seed: int) -> list:
    if variant == "as_drawn":
        return inputs
    gens: dict = {}  # one per device: a GPU input is redrawn on the GPU, not on the host

    def generator(device):
        if device not in gens:
            gens[device] = torch.Generator(device=device).manual_seed(seed)
        return gens[device]

    def transform(x):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            return x
        if variant == "negated":
            return -x
        if variant == "centered_x4":
            return (x - x.mean()) * 4.0
        if variant == "shift_scale":
            return x * 3.0 + 1.5
        if variant == "normal":
            return torch.randn(x.shape, generator=generator(x.device), dtype=torch.float32,
                               device=x.device).to(x.dtype)
        raise ValueError(variant)

    return [transform(x) for x in inputs]


def clone_args(args: list) -> list:
    def clone(x):
        if isinstance(x, torch.Tensor):
            return x.clone()
        if isinstance(x, (list, tuple)):
            return type(x)(clone(v) for v in x)
        return x

    return [clone(x) for x in args]


def flatten(obj) -> list:
    if isinstance(obj, (list, tuple)):
        out = []
        for item in obj:
            out += flatten(item)
        return out
    if isinstance(obj, dict):
        return flatten([obj[k] for k in sorted(obj)])
    return [obj]


def tensors(obj) -> list[torch.Tensor]:
    return [x for x in flatten(obj) if isinstance(x, torch.Tensor)]


def all_finite(obj) -> bool:
    for x in flatten(obj):
        if isinstance(x, torch.Tensor) and x.is_floating_point() and not torch.isfinite(x).all():
            return False
        if isinstance(x, float) and not math.isfinite(x):
            return False
    return True


def compare(ref, cand, tol: dict) -> tuple[bool, float, str]:
    """(equal within tolerance, max abs error, reason if not). NaN never passes."""
    ref_items, cand_items = flatten(ref), flatten(cand)
    if len(ref_items) != len(cand_items):
        return False, math.inf, f"{len(cand_items)} outputs, expected {len(ref_items)}"
    worst = 0.0
    for i, (r, c) in enumerate(zip(ref_items, cand_items)):
        if isinstance(r, torch.Tensor):
            if not isinstance(c, torch.Tensor):
                return False, math.inf, f"output {i}: {type(c).__name__}, expected a tensor"
            if tuple(c.shape) != tuple(r.shape):
                return (False, math.inf,
                        f"output {i}: shape {tuple(c.shape)}, expected {tuple(r.shape)}")
            if c.dtype != r.dtype:
                return False, math.inf, f"output {i}: dtype {c.dtype}, expected {r.dtype}"
            ok, err = _close(r, c.to(r.device), tol)
        elif isinstance(r, (int, float, bool)) and isinstance(c, (int, float, bool)):
            ok, err = _close(torch.tensor(float(r)), torch.tensor(float(c)), tol)
        else:
            ok, err = (r == c), (0.0 if r == c else math.inf)
        worst = max(worst, err)
        if not ok:
            return False, worst, f"output {i}: values differ (max abs error {err:.3g})"
    return True, worst, ""


def _close(r: torch.Tensor, c: torch.Tensor, tol: dict) -> tuple[bool, float]:
    if r.numel() == 0:
        return True, 0.0
    if not r.is_floating_point() and not r.is_complex():
        equal = bool(torch.equal(r, c))
        return equal, 0.0 if equal else math.inf
    low = r.dtype in LOW_PRECISION
    atol = tol["atol_low_precision"] if low else tol["atol"]
    rtol = tol["rtol_low_precision"] if low else tol["rtol"]
    work = torch.float64 if r.dtype == torch.float64 else torch.float32
    rw, cw = r.to(work), c.to(work)
    if not torch.isfinite(cw).all():
        return False, math.inf
    diff = (rw - cw).abs()
    err = float(diff.max())
    # atol is relative to the output's range once that passes 1: on mixed-sign inputs a
    # right fp32 reduction leaves near-zero sums with errors of eps * (sum of |terms|)
    atol = atol * max(1.0, float(rw.abs().max()))
    ok = bool((diff <= atol + rtol * rw.abs()).all())
    return ok, err


def _span(t: torch.Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    start = storage.data_ptr()
    return start, start + storage.nbytes()


def shares_memory(a, b) -> bool:
    """Whether any tensor in `a` lies in the same storage as any tensor in `b`."""
    spans_b = [_span(t) for t in tensors(b) if t.untyped_storage().nbytes() > 0]
    for t in tensors(a):
        if t.untyped_storage().nbytes() == 0:
            continue
        lo, hi = _span(t)
        if any(lo < hb and blo < hi for blo, hb in spans_b):
            return True
    return False


def same_values(a, b) -> bool:
    ta, tb = flatten(a), flatten(b)
    if len(ta) != len(tb):
        return False
    for x, y in zip(ta, tb):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x, y.to(x.device)):
                return False
        elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor) or x != y:
            return False
    return True


def max_relative_change(a, b) -> float:
    """How far the reference's outputs moved between two input sets (0 = not at all)."""
    worst = 0.0
    for x, y in zip(tensors(a), tensors(b)):
        if x.shape != y.shape or not x.is_floating_point():
            return 1.0
        xf, yf = x.float(), y.float()
        scale = float(xf.abs().max()) + float(yf.abs().max()) + 1e-30
        worst = max(worst, float((xf - yf).abs().max()) / scale)
    return worst


def input_bytes(inputs: list) -> int:
    return sum(t.numel() * t.element_size() for t in tensors(inputs))
