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

Memory: every comparison walks its tensors in blocks of at most `CHUNK` elements
(`index_blocks`: views along the leading dimensions, so no whole-output copy is made, in
float64 or otherwise), the two sides may live on different devices (a block is moved to the
side that computes), and block results combine exactly (maxima, equality), so the verdicts
are those of the whole-tensor arithmetic, bit for bit. Variants are applied in place, in
blocks, where an input tensor overlaps no other (`apply_variant(in_place=True)`).
"""

from __future__ import annotations

import math

import torch

CHUNK = 1 << 22  # elements per block of a comparison (32 MiB as float64)

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


def apply_variant(inputs: list, variant: str, seed: int, in_place: bool = False,
                  shared: tuple = ()) -> list:
    """The inputs under one distribution variant, applied to each floating-point tensor.

    Every variant maps each element by its value alone and keeps exact zeros, so structure
    that the task's `get_inputs` builds into its inputs survives: triangular or banded
    zeros, symmetry, repeated entries (KernelBench's triangular and symmetric matmuls,
    whose right kernels use that structure). Dense draws (rand, randn) have no exact zeros,
    so for them the variants are as wide as before.

    in_place: the tensors are overwritten block by block (the same values as the
    out-of-place transform, element for element) instead of copied, so a variant costs no
    second copy of the inputs. Only a tensor nothing else holds is: one that overlaps another
    input or itself (a view, an expanded tensor), whose storage another tensor shares, or
    that is one of `shared` (the task module's own tensors, which `get_inputs` may return
    as they are) is transformed out of place, as before.
    """
    if variant == "as_drawn":
        return inputs
    if variant not in VARIANTS:
        raise ValueError(variant)
    floating = [x for x in flatten(inputs) if isinstance(x, torch.Tensor) and x.is_floating_point()]

    def transform(x):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            return x
        if in_place and _owns_its_memory(x, floating, shared):
            _transform_in_place(x, variant, seed)
            return x
        return _transformed(x, variant, seed, x.mean() if variant == "centered_x4" else None)

    return [transform(x) for x in inputs]


def _transformed(x: torch.Tensor, variant: str, seed: int, mean) -> torch.Tensor:
    if variant == "negated":
        return -x
    if variant == "centered_x4":
        y = (x - mean) * 4.0
    elif variant == "shift_scale":
        y = x * 3.0 + 1.5
    else:
        y = value_normal(x, seed)
    return torch.where(x == 0, x, y)


def _owns_its_memory(x: torch.Tensor, floating: list[torch.Tensor], shared: tuple) -> bool:
    """x is dense without overlap, is none of `shared`, and no other tensor (an input or
    anything else alive) uses its storage."""
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    if use_count is None or x.numel() == 0 or not _dense(x):
        return False
    if any(x is t for t in shared):
        return False
    storage = x.untyped_storage()
    holders = sum(1 for y in floating if y.untyped_storage().data_ptr() == storage.data_ptr())
    # one tensor holds it, and the storage object made just now for the question
    return holders == 1 and use_count(storage._cdata) <= 2


def _dense(x: torch.Tensor) -> bool:
    """Every element at its own address and no gaps (contiguous in some order of dims)."""
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(x.shape, x.stride()) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def module_tensors(get_inputs) -> tuple:
    """The tensors a task module keeps at its top level (directly or in a list, tuple or
    dict): `get_inputs` may hand them out as they are, so they are never written over."""
    found = []
    for value in getattr(get_inputs, "__globals__", {}).values():
        items = value.values() if isinstance(value, dict) else (
            value if isinstance(value, (list, tuple)) else (value,))
        found += [v for v in items if isinstance(v, torch.Tensor)]
    return tuple(found)


def _transform_in_place(x: torch.Tensor, variant: str, seed: int) -> None:
    """The variant written over x in blocks (elementwise maps, so the values are those of
    the whole-tensor transform; the centred variant's mean is the whole tensor's)."""
    mean = x.mean() if variant == "centered_x4" else None
    for idx in index_blocks(tuple(x.shape), CHUNK):
        block = x[idx]
        block.copy_(_transformed(block, variant, seed, mean))


def device_copy(obj, device: str):
    """A fresh copy of obj's tensors on `device` (a copy even where they are already there)."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device, copy=True)
    if isinstance(obj, (list, tuple)):
        return type(obj)(device_copy(x, device) for x in obj)
    return obj


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


def all_finite(obj, chunk: int = CHUNK) -> bool:
    for x in flatten(obj):
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            for idx in index_blocks(tuple(x.shape), chunk):
                if not bool(torch.isfinite(x[idx]).all()):
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


def index_blocks(shape: tuple, chunk: int = CHUNK, prefix: tuple = ()):
    """Indices of blocks covering a tensor of `shape` in row-major order, each at most
    `chunk` elements: whole rows of the leading dimension where they fit, else one index of
    it and the blocks of the rest. `t[idx]` is a view; only its `reshape(-1)` may copy, at
    most `chunk` elements."""
    if not shape:
        yield prefix
        return
    inner = math.prod(shape[1:])
    if inner <= chunk:
        rows = max(1, chunk // max(inner, 1))
        for start in range(0, shape[0], rows):
            yield prefix + (slice(start, min(start + rows, shape[0])),)
        return
    for i in range(shape[0]):
        yield from index_blocks(shape[1:], chunk, prefix + (i,))


def pair_blocks(a: torch.Tensor, b: torch.Tensor, chunk: int = CHUNK):
    """Matching flat blocks of two tensors of one shape, on one device (the one that
    computes: a GPU where either side is on one)."""
    device = b.device if b.device.type != "cpu" else a.device
    for idx in index_blocks(tuple(a.shape), chunk):
        yield a[idx].reshape(-1).to(device), b[idx].reshape(-1).to(device)


def _max_of(values: list[torch.Tensor]) -> float:
    """The largest of block maxima (NaN if any is NaN, as a whole-tensor max gives)."""
    return float(torch.stack([v.to("cpu") for v in values]).max())


def tensor_tolerance(r: torch.Tensor, c: torch.Tensor, chunk: int = CHUNK) -> tuple[float, float]:
    """(tolerance needed, max abs error) for two tensors of equal shape and dtype, computed
    in blocks of `chunk` elements (exactly the whole-tensor values: maxima of the same
    elementwise terms)."""
    if r.numel() == 0:
        return 0.0, 0.0
    if not r.is_floating_point() and not r.is_complex():
        equal = all(bool(torch.equal(x, y)) for x, y in pair_blocks(r, c, chunk))
        return (0.0, 0.0) if equal else (math.inf, math.inf)
    work = torch.float64 if r.dtype in (torch.float64, torch.complex128) else torch.float32
    if r.is_complex():
        r, c = torch.view_as_real(r), torch.view_as_real(c)
    # pass 1: the candidate finite, the largest error and the reference's largest magnitude
    errors, magnitudes = [], []
    for rb, cb in pair_blocks(r, c, chunk):
        rw, cw = rb.to(work), cb.to(work)
        if not bool(torch.isfinite(cw).all()):
            return math.inf, math.inf
        errors.append((rw - cw).abs().max())
        magnitudes.append(rw.abs().max())
    err = _max_of(errors)
    if math.isnan(err):  # a non-finite reference value: NaN never passes
        return math.inf, math.inf
    # atol is relative to the output's range once that passes 1: on mixed-sign inputs a
    # right fp32 reduction leaves near-zero sums with errors of eps * (sum of |terms|)
    scale = max(1.0, _max_of(magnitudes))
    # pass 2: the smallest t with |c - r| <= t * scale + t * |r| everywhere
    needed = []
    for rb, cb in pair_blocks(r, c, chunk):
        rw, cw = rb.to(work), cb.to(work)
        needed.append(((rw - cw).abs() / (scale + rw.abs())).max())
    return _max_of(needed), err


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
            t, err = tensor_tolerance(r, c)
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


def tensors_equal(x: torch.Tensor, y: torch.Tensor, chunk: int = CHUNK) -> bool:
    """torch.equal of two tensors (any devices), block by block."""
    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    return all(bool(torch.equal(a, b)) for a, b in pair_blocks(x, y, chunk))


def same_values(a, b, chunk: int = CHUNK) -> bool:
    ta, tb = flatten(a), flatten(b)
    if len(ta) != len(tb):
        return False
    for x, y in zip(ta, tb):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if not tensors_equal(x, y, chunk):
                return False
        elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor) or x != y:
            return False
    return True


def outputs_changed(a, b, threshold: float = 1e-5, chunk: int = CHUNK) -> bool:
    """Whether the reference's outputs moved between two input sets. Floating tensors move
    when their largest change passes `threshold` of their magnitude; every other output
    (bool, int, index tensors, Python values) moves when it is not exactly equal. Computed
    in float64 (complex128) blocks of `chunk` elements, never a whole float64 copy."""
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
            if not tensors_equal(x, y, chunk):
                return True
            continue
        wide = torch.complex128 if x.is_complex() else torch.float64
        mag_x, mag_y, diffs = [], [], []
        for xb, yb in pair_blocks(x, y, chunk):
            xf, yf = xb.to(wide), yb.to(wide)
            mag_x.append(xf.abs().max())
            mag_y.append(yf.abs().max())
            diffs.append((xf - yf).abs().max())
        scale = _max_of(mag_x) + _max_of(mag_y) + 1e-30
        if not _max_of(diffs) / scale <= threshold:  # NaN counts as moved
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


def allclose_tolerance(ref, cand, chunk: int = CHUNK) -> float:
    """The smallest t at which `torch.allclose(ref, cand, atol=t, rtol=t)` holds: the
    comparison KernelBench makes, `allclose(output, output_new)`: |r - c| <= t + t * |c|
    everywhere (the relative term is on the candidate's value, torch's `other`; no scaling
    by the output's range). 0 for identical outputs; +inf where allclose cannot pass at any t or
    would raise: a shape or dtype mismatch, a NaN in either output, an infinity that the
    other side does not match, or an output that is not one tensor. Computed in float64 in
    blocks of `chunk` elements (either side may be in host memory), so a multi-GB output
    needs no full-size float64 copies."""
    if not isinstance(ref, torch.Tensor) or not isinstance(cand, torch.Tensor):
        return math.inf
    if tuple(ref.shape) != tuple(cand.shape) or ref.dtype != cand.dtype:
        return math.inf
    if ref.numel() == 0:
        return 0.0
    if ref.is_complex():
        ref, cand = torch.view_as_real(ref), torch.view_as_real(cand)
    worst = 0.0
    for rb, cb in pair_blocks(ref, cand, chunk):
        r, c = rb.to(torch.float64), cb.to(torch.float64)
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


def to_host(obj):
    """A copy of obj's tensors in host memory (the kept copies of the leaner memory plans)."""
    if isinstance(obj, torch.Tensor):
        return obj.to("cpu", copy=True)
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_host(x) for x in obj)
    return obj
