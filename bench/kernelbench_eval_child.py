"""One pair judged by KernelBench's own code, in a process of its own (a child of
bench/kernelbench_differential.py; a device-side assert poisons a process, so each pair gets
a fresh one).

    python bench/kernelbench_eval_child.py SPEC.json

SPEC (JSON): mode "eval" (default) or "diagnose"; kb_src (KernelBench's src/ folder);
reference_path; candidate_path; tolerances (run one `eval_kernel_against_ref` per entry, with
`get_tolerance_for_precision` patched to return it); trials; build_dir; out (the result JSON,
rewritten after every run so a timeout keeps the runs that finished); emulate_cpu (tests on a
machine without CUDA: KernelBench's CUDA calls become no-ops and the device is "cpu"; pairs
with CUDA extensions cannot run that way).

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


def run_eval(spec: dict) -> dict:
    import torch

    if spec.get("emulate_cpu"):
        _emulate_cpu(torch)
    kb_eval, stubs = import_kernelbench(spec["kb_src"])
    reference = Path(spec["reference_path"]).read_text()
    candidate = Path(spec["candidate_path"]).read_text()
    device = "cpu" if spec.get("emulate_cpu") else torch.cuda.current_device()
    out = {"stubs": stubs, "torch": torch.__version__, "runs": [], "context_broken": False}
    for tol in spec["tolerances"]:
        kb_eval.get_tolerance_for_precision = lambda precision, tol=tol: float(tol)
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
        out["runs"].append(run)
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
