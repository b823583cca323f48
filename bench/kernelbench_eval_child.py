"""One pair judged by KernelBench's own code, in a process of its own (a child of
bench/kernelbench_differential.py; a device-side assert poisons a process, so each pair gets
a fresh one).

    python bench/kernelbench_eval_child.py SPEC.json

SPEC (JSON): mode "eval" (default) or "diagnose"; kb_src (KernelBench's src/ folder);
reference_path; candidate_path; tolerances; kb_mode: "separate" runs one
`eval_kernel_against_ref` per tolerance, with `get_tolerance_for_precision` patched to return
it; "probe" runs it once, at the first tolerance, and re-evaluates each `torch.allclose` call
its trials make at the other tolerances (same outputs; half the input draws, which dominate
on large level 1 tasks); trials; build_dir; out (the result JSON, rewritten after every run
so a timeout keeps the runs that finished); emulate_cpu (tests on a machine without CUDA:
KernelBench's CUDA calls become no-ops and the device is "cpu"; pairs with CUDA extensions
cannot run that way).

Each run is recorded as KernelBench's batch script (scripts/eval_from_generations.py) records
it: the KernelExecResult as returned; an exception escaping `eval_kernel_against_ref` gives
compiled=False, correctness=False with `cuda_error` or `other_error`; None (its "lock" retry
signal) is recorded as status "none" for the parent to retry. After a run that left the CUDA
context broken, the child stops; the parent starts a fresh one for the remaining tolerances.

"diagnose" looks at the reference alone (for the reason column of a disagreement): the
dtypes `get_inputs()` draws (KernelBench casts every input tensor to fp32) and whether the
reference's output depends on the global RNG state (KernelBench runs the candidate on the RNG
state the reference left).

Imports only torch and KernelBench (not dicepipe): the child starts in about a second.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import traceback
import types
from pathlib import Path

_TEXT_LIMIT = 2000


def _stub(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    module.__dict__["__dicepipe_stub__"] = True
    sys.modules[name] = module
    return module


def _pydantic_stub() -> types.ModuleType:
    """A stand-in for pydantic.BaseModel, enough for KernelExecResult (field defaults from
    class attributes, keyword construction, attribute access)."""

    class BaseModel:
        def __init__(self, **values):
            for name in getattr(type(self), "__annotations__", {}):
                default = getattr(type(self), name, None)
                setattr(self, name, dict(default) if isinstance(default, dict) else default)
            for name, value in values.items():
                setattr(self, name, value)

    return _stub("pydantic", BaseModel=BaseModel)


def import_kernelbench(kb_src: str):
    """kernelbench.eval with its LLM-client imports stubbed (README-shared.md); pydantic,
    requests and tqdm are stubbed too where this machine lacks them. Returns (module, stubs)."""
    stubs = []
    _stub("openai", OpenAI=object)
    _stub("litellm", completion=lambda *a, **k: None)
    _stub("dotenv", load_dotenv=lambda *a, **k: None)
    for name, make in (("pydantic", _pydantic_stub),
                       ("requests", lambda: _stub("requests")),
                       ("tqdm", lambda: _stub("tqdm", tqdm=lambda it=None, *a, **k: it))):
        try:
            __import__(name)
        except ImportError:
            make()
            stubs.append(name)
    sys.path.insert(0, kb_src)
    import kernelbench.eval as kb_eval

    return kb_eval, stubs


def _emulate_cpu(torch) -> None:
    """Make KernelBench's CUDA-only calls harmless on a CPU machine (tests of this script)."""
    cuda = torch.cuda
    cuda.is_available = lambda: True
    cuda.current_device = lambda: 0
    cuda.set_device = lambda *a, **k: None
    cuda.get_device_name = lambda *a, **k: "NVIDIA cpu-emulation"
    cuda.synchronize = lambda *a, **k: None
    cuda.empty_cache = lambda *a, **k: None
    cuda.reset_peak_memory_stats = lambda *a, **k: None
    cuda.device = lambda *a, **k: contextlib.nullcontext()


def _text(value) -> str:
    text = str(value)
    return text if len(text) <= _TEXT_LIMIT else text[:_TEXT_LIMIT] + "..."


def _context_broken(torch) -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        torch.cuda.synchronize()
        return False
    except Exception:  # noqa: BLE001 - any failure here means the context is gone
        return True


class _AllcloseProbe:
    """Stands for the `torch` module inside KernelBench's eval.py: everything is torch's, but
    each `allclose` call (the one per trial in run_and_check_correctness) is also evaluated
    at the probe's other tolerances, on the same two outputs."""

    def __init__(self, torch, tolerances):
        self._torch, self.tolerances, self.calls = torch, list(tolerances), []

    def __getattr__(self, name):
        return getattr(self._torch, name)

    def allclose(self, a, b, *args, **kwargs):
        result = self._torch.allclose(a, b, *args, **kwargs)
        self.calls.append({t: bool(self._torch.allclose(a, b, atol=t, rtol=t))
                           for t in self.tolerances})
        return result


def _run_once(kb_eval, torch, spec: dict, reference: str, candidate: str, device, tol: float):
    """One eval_kernel_against_ref at `tol`, recorded as KernelBench's script records it."""
    kb_eval.get_tolerance_for_precision = lambda precision: float(tol)
    start = time.perf_counter()
    run = {"tol": float(tol)}
    try:
        result = kb_eval.eval_kernel_against_ref(
            original_model_src=reference, custom_model_src=candidate,
            seed_num=42, num_correct_trials=int(spec["trials"]), measure_performance=False,
            verbose=False, build_dir=spec.get("build_dir"), device=device,
            backend="cuda", precision=torch.float32)
        if result is None:
            run.update(status="none", compiled=None, correctness=None, metadata={})
        else:
            run.update(status="ok", compiled=bool(result.compiled),
                       correctness=bool(result.correctness),
                       metadata={k: _text(v) for k, v in dict(result.metadata).items()})
    except Exception as exc:  # noqa: BLE001 - KernelBench's script's last-level catch
        kind = "cuda_error" if "CUDA error" in str(exc) else "other_error"
        run.update(status="exception", compiled=False, correctness=False,
                   metadata={kind: _text(exc), f"{kind}_name": type(exc).__name__,
                             "traceback": _text(traceback.format_exc())})
    run["wall_s"] = round(time.perf_counter() - start, 3)
    return run


def _probed(run: dict, calls: list, tol: float, trials: int) -> dict:
    """KernelBench's verdict at `tol` from a run at another tolerance: its trial loop does
    not depend on the tolerance (a mismatch only lowers pass_count; an exception or a shape
    mismatch ends it either way), so it is the run's outcome with the allclose calls it
    made re-evaluated at `tol`."""
    out = dict(run, tol=float(tol), probed_from=run["tol"])
    if run["status"] != "ok" or not run["compiled"]:
        return out
    meta = run["metadata"]
    ended_early = any(k in meta for k in ("runtime_error", "runtime_error_name")) or \
        str(meta.get("correctness_issue", "")).startswith("Output shape mismatch")
    passed = sum(call[tol] for call in calls)
    out["correctness"] = (not ended_early and len(calls) == trials and passed == trials)
    if ended_early:  # the same outcome at any tolerance
        return out
    out["metadata"] = {k: v for k, v in meta.items()
                       if k not in ("correctness_issue", "max_difference", "avg_difference")}
    out["metadata"]["correctness_trials"] = f"({passed} / {trials})"
    if not out["correctness"]:
        out["metadata"]["correctness_issue"] = "Output mismatch"
    return out


def run_eval(spec: dict) -> dict:
    """KernelBench's verdicts at every tolerance of the spec: one run each (`separate`), or
    one run at the first with the others probed on the same outputs (`probe`)."""
    import torch

    if spec.get("emulate_cpu"):
        _emulate_cpu(torch)
    kb_eval, stubs = import_kernelbench(spec["kb_src"])
    reference = Path(spec["reference_path"]).read_text()
    candidate = Path(spec["candidate_path"]).read_text()
    device = "cpu" if spec.get("emulate_cpu") else torch.cuda.current_device()
    out = {"stubs": stubs, "torch": torch.__version__, "runs": [], "context_broken": False}
    tolerances = [float(t) for t in spec["tolerances"]]
    if spec.get("kb_mode", "probe") == "probe":
        probe = _AllcloseProbe(torch, tolerances[1:])
        kb_eval.torch = probe
        try:
            run = _run_once(kb_eval, torch, spec, reference, candidate, device, tolerances[0])
        finally:
            kb_eval.torch = torch
        out["runs"].append(run)
        out["runs"] += [_probed(run, probe.calls, t, int(spec["trials"])) for t in tolerances[1:]]
        out["context_broken"] = _context_broken(torch)
        _write(spec["out"], out)
        return out
    for tol in tolerances:
        out["runs"].append(_run_once(kb_eval, torch, spec, reference, candidate, device, tol))
        broken = _context_broken(torch)
        out["context_broken"] = broken
        _write(spec["out"], out)
        if broken:
            break
    return out


def run_diagnose(spec: dict) -> dict:
    """Facts about the reference alone that explain KernelBench's verdicts."""
    import torch

    out: dict = {}
    context: dict = {}
    exec(compile(Path(spec["reference_path"]).read_text(), "reference", "exec"), context)  # noqa: S102 - the task file, as KernelBench runs it
    torch.manual_seed(42)
    inputs = context["get_inputs"]()
    out["input_dtypes"] = [str(x.dtype) if isinstance(x, torch.Tensor) else type(x).__name__
                           for x in inputs]
    out["integer_inputs"] = any(isinstance(x, torch.Tensor) and not x.is_floating_point()
                                for x in inputs)
    device = "cuda" if torch.cuda.is_available() and not spec.get("emulate_cpu") else "cpu"
    try:
        torch.manual_seed(42)
        model = context["Model"](*context["get_init_inputs"]()).to(device)
        inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]
        outputs = []
        with torch.no_grad():
            for seed in (1, 2):
                torch.manual_seed(seed)
                outputs.append(model(*inputs))
        a, b = outputs
        same = (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.shape == b.shape and bool(torch.allclose(a, b, atol=1e-5, rtol=1e-5,
                                                                 equal_nan=True)))
        out["reference_uses_rng"] = not same
    except Exception as exc:  # noqa: BLE001 - a fact to report, not a failure of the script
        out["reference_error"] = _text(f"{type(exc).__name__}: {exc}")
    _write(spec["out"], out)
    return out


def _write(path: str, data: dict) -> None:
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(data, sort_keys=True, default=str))
    tmp.replace(path)


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    if spec.get("mode", "eval") == "diagnose":
        run_diagnose(spec)
    else:
        run_eval(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
