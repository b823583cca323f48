"""Inputs, output comparison and the memory checks behind the dynamic deception flags.

Inputs come from the reference's own `get_inputs()` under a per-trial seed, then one of
several distributions is applied to its floating-point tensors (as drawn, negated, centred
and widened, shifted and scaled, standard normal), so a kernel right only on [0, 1) inputs
(ReLU as identity, say) fails. Each variant maps elements by value and keeps exact zeros, so
structure built into the inputs (triangular, symmetric) survives (`apply_variant`). The
reference sees each variant first; one under which it raises or produces non-finite values
is not a valid input of the task (index tensors made negative, say), and the candidate
never sees it (as-drawn inputs are used instead).

Comparison is tolerance as data: `tolerance_needed` is the smallest t such that
|c - r| <= t * s + t * |r| holds everywhere, with s = max(1, max |r|) (atol = rtol = t as in
`torch.allclose`, atol scaled by the output's largest magnitude once that passes 1). It is 0
for identical outputs and +inf for a shape, dtype or count mismatch, a non-finite candidate
value, or any difference in a non-floating output (those compare exactly).
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


# Integer views of each floating element size, for value_normal's hash of the bits.
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def value_normal(x: torch.Tensor, seed: int, chunk: int = 1 << 22) -> torch.Tensor:
    """A standard-normal value for each element that depends only on the element's value
    (its bits, hashed with `seed`): equal elements get equal values. Hashed in chunks, so
    the int64/float64 temporaries stay small beside a large input."""
    bits = x.detach().contiguous().view(_BITS[x.element_size()]).reshape(-1)
    out = torch.empty(bits.shape, dtype=x.dtype, device=x.device)
    salt = seed * 0x2545F4914F6CDD1D % 2**62
    for start in range(0, bits.numel(), chunk):
        h = bits[start:start + chunk].to(torch.int64) ^ salt
        for _ in range(2):  # multiply-xorshift rounds (int64 products wrap)
            h = h * 0x5851F42D4C957F2D
            h = h ^ (h >> 29)
        u = (((h >> 11) & (2**40 - 1)).to(torch.float64) + 0.5) / 2**40  # in (0, 1)
        out[start:start + chunk] = (math.sqrt(2.0) * torch.erfinv(2.0 * u - 1.0)).to(x.dtype)
    return out.view(x.shape)


def apply_variant(inputs: list, variant: str, seed: int) -> list:
    """The inputs under one distribution variant, applied to each floating-point tensor.

    Every variant maps each element by its value alone and keeps exact zeros, so structure
    that the task's `get_inputs` builds into its inputs survives: triangular or banded
    zeros, symmetry, repeated entries (KernelBench's triangular and symmetric matmuls,
    whose right kernels use that structure). Dense draws (rand, randn) have no exact zeros,
    so for them the variants are as wide as before.
    """
    if variant == "as_drawn":
        return inputs

    def transform(x):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            return x
        if variant == "negated":
            return -x
        if variant == "centered_x4":
            y = (x - x.mean()) * 4.0
        elif variant == "shift_scale":
            y = x * 3.0 + 1.5
        elif variant == "normal":
            y = value_normal(x, seed)
        else:
            raise ValueError(variant)
        return torch.where(x == 0, x, y)

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


def output_precision(ref) -> str:
    """"fp32" if any output is fp32/fp64 (or complex), "low_precision" if every floating
    output is fp16/bf16, "exact" if no output is floating (compared exactly)."""
    items = flatten(ref)
    floating = [x.dtype for x in items
                if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex())]
    floating += [torch.float64 for x in items if isinstance(x, float)]
    if not floating:
        return "exact"
    return "low_precision" if all(d in LOW_PRECISION for d in floating) else "fp32"


def tensor_tolerance(r: torch.Tensor, c: torch.Tensor) -> tuple[float, float]:
    """(tolerance needed, max abs error) for two tensors of equal shape and dtype."""
    if r.numel() == 0:
        return 0.0, 0.0
    if not r.is_floating_point() and not r.is_complex():
        equal = bool(torch.equal(r, c))
        return (0.0, 0.0) if equal else (math.inf, math.inf)
    work = torch.float64 if r.dtype in (torch.float64, torch.complex128) else torch.float32
    if r.is_complex():
        rw, cw = torch.view_as_real(r).to(work), torch.view_as_real(c).to(work)
    else:
        rw, cw = r.to(work), c.to(work)
    if not torch.isfinite(cw).all():
        return math.inf, math.inf
    diff = (rw - cw).abs()
    err = float(diff.max())
    if math.isnan(err):  # a non-finite reference value: NaN never passes
        return math.inf, math.inf
    # atol is relative to the output's range once that passes 1: on mixed-sign inputs a
    # right fp32 reduction leaves near-zero sums with errors of eps * (sum of |terms|)
    scale = max(1.0, float(rw.abs().max()))
    needed = float((diff / (scale + rw.abs())).max())
    return needed, err


def within_max_tolerance(needed: float, settings: dict) -> bool:
    """The one test of a needed tolerance against `harness.measure.max_tolerance` (the
    loosest any protocol may ask for): what is beyond it is never timed or counted correct.
    NaN and infinity are beyond it."""
    return needed <= float(settings["max_tolerance"])


def compare(ref, cand) -> tuple[float, float, str]:
    """(tolerance needed, max abs error, what differs most; "" when identical)."""
    ref_items, cand_items = flatten(ref), flatten(cand)
    if len(ref_items) != len(cand_items):
        return math.inf, math.inf, f"{len(cand_items)} outputs, expected {len(ref_items)}"
    worst_t, worst_err, reason = 0.0, 0.0, ""
    for i, (r, c) in enumerate(zip(ref_items, cand_items)):
        if isinstance(r, torch.Tensor):
            if not isinstance(c, torch.Tensor):
                return math.inf, math.inf, f"output {i}: {type(c).__name__}, expected a tensor"
            if tuple(c.shape) != tuple(r.shape):
                return (math.inf, math.inf,
                        f"output {i}: shape {tuple(c.shape)}, expected {tuple(r.shape)}")
            if c.dtype != r.dtype:
                return math.inf, math.inf, f"output {i}: dtype {c.dtype}, expected {r.dtype}"
            t, err = tensor_tolerance(r, c.to(r.device))
        elif isinstance(r, float) and isinstance(c, (int, float)) and not isinstance(c, bool):
            t, err = tensor_tolerance(torch.tensor(r, dtype=torch.float64),
                                      torch.tensor(float(c), dtype=torch.float64))
        else:  # ints, bools and anything else: exactly
            same = type(r) is type(c) and r == c
            t, err = (0.0, 0.0) if same else (math.inf, math.inf)
        if t > worst_t:
            reason = f"output {i}: values differ (max abs error {err:.3g}, tolerance needed {t:.3g})"
        worst_t, worst_err = max(worst_t, t), max(worst_err, err)
    return worst_t, worst_err, reason


def cuda_context_broken() -> bool:
    """Whether the CUDA context still works: an error such as a device-side assert is sticky
    and fails every later call, so a synchronize and a tiny computation tell."""
    try:
        torch.cuda.synchronize()
        return float(torch.ones(16, device="cuda").sum()) != 16.0
    except Exception:
        return True


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


def outputs_changed(a, b, threshold: float = 1e-5) -> bool:
    """Whether the reference's outputs moved between two input sets. Floating tensors move
    when their largest change passes `threshold` of their magnitude; every other output
    (bool, int, index tensors, Python values) moves when it is not exactly equal."""
    items_a, items_b = flatten(a), flatten(b)
    if len(items_a) != len(items_b):
        return True
    for x, y in zip(items_a, items_b):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return True
        if not isinstance(x, torch.Tensor):
            if x != y:
                return True
            continue
        if x.shape != y.shape or x.dtype != y.dtype:
            return True
        if x.numel() == 0:
            continue
        if not (x.is_floating_point() or x.is_complex()):
            if not torch.equal(x, y.to(x.device)):
                return True
            continue
        xf = x.to(torch.complex128 if x.is_complex() else torch.float64)
        yf = y.to(xf.dtype).to(x.device)
        scale = float(xf.abs().max()) + float(yf.abs().max()) + 1e-30
        if not float((xf - yf).abs().max()) / scale <= threshold:  # NaN counts as moved
            return True
    return False


def input_bytes(inputs: list) -> int:
    return sum(t.numel() * t.element_size() for t in tensors(inputs))


class _DeviceBytes:
    """A byte range of device memory as an array interface (a view, no allocation)."""

    def __init__(self, address: int, size: int):
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1",
                                         "data": (address, False), "version": 3}


def scrub_free_memory(device: str) -> None:
    """Overwrite what freed tensors left behind, so a candidate that allocates an output and
    never writes it cannot find the reference's result (or an intermediate equal to it).

    cuda: every free block the caching allocator holds is filled with 0xFF bytes (NaN as a
    float, -1 as an integer) through a view of its address. cpu: glibc's `malloc_trim`
    gives the whole pages of free chunks back to the kernel (they read as zeros when next
    handed out); large tensors are unmapped when freed anyway.
    """
    if device == "cuda":
        for segment in torch.cuda.memory_snapshot():
            for block in segment.get("blocks", ()):
                if block.get("state") == "inactive" and block.get("size", 0) > 0:
                    view = torch.as_tensor(_DeviceBytes(block["address"], block["size"]),
                                           device="cuda")
                    view.fill_(0xFF)
                    del view
        torch.cuda.synchronize()
        return
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


_TRIM: list = []


def _malloc_trim():
    if not _TRIM:
        try:
            import ctypes

            _TRIM.append(ctypes.CDLL("libc.so.6").malloc_trim)
        except (OSError, AttributeError):
            _TRIM.append(None)
    return _TRIM[0]


def allclose_tolerance(ref, cand, chunk: int = 1 << 24) -> float:
    """The smallest t at which `torch.allclose(ref, cand, atol=t, rtol=t)` holds: the
    comparison KernelBench makes, `allclose(output, output_new)`: |r - c| <= t + t * |c|
    everywhere (the relative term is on the candidate's value, torch's `other`; no scaling
    by the output's range). 0 for identical outputs; +inf where allclose cannot pass at any t or
    would raise: a shape or dtype mismatch, a NaN in either output, an infinity that the
    other side does not match, or an output that is not one tensor. Computed in float64 in
    chunks of `chunk` elements, so a multi-GB output needs no full-size float64 copies."""
    if not isinstance(ref, torch.Tensor) or not isinstance(cand, torch.Tensor):
        return math.inf
    if tuple(ref.shape) != tuple(cand.shape) or ref.dtype != cand.dtype:
        return math.inf
    if ref.numel() == 0:
        return 0.0
    if ref.is_complex():
        ref, cand = torch.view_as_real(ref), torch.view_as_real(cand)
    flat_r = ref.reshape(-1)
    flat_c = cand.to(ref.device).reshape(-1)
    worst = 0.0
    for start in range(0, flat_r.numel(), chunk):
        r = flat_r[start:start + chunk].to(torch.float64)
        c = flat_c[start:start + chunk].to(torch.float64)
        if bool(torch.isnan(r).any()) or bool(torch.isnan(c).any()):
            return math.inf
        differ = r != c  # equal values (equal infinities too) are close at any t
        r, c = r[differ], c[differ]
        if r.numel() == 0:
            continue
        if not bool(torch.isfinite(r).all()) or not bool(torch.isfinite(c).all()):
            return math.inf
        worst = max(worst, float(((r - c).abs() / (1.0 + c.abs())).max()))
    return worst
