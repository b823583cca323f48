"""Find what a candidate file will build, without building or running any kernel.

Runs in an extractor worker (no GPU visible, no new processes): executes the candidate's
module with `load_inline` recording its arguments, then constructs `ModelNew` on the meta
device (cheap at any size) to catch extensions built in `__init__`. Anything that fails here
is not final, except a syntax error: the device worker builds on demand what extraction
missed, and reports its own errors.
"""

from __future__ import annotations

import traceback
from pathlib import Path

from .loader import StubModule, exec_module, forget_module, intercept_load_inline


def extract_specs(candidate_code: str, reference_code: str, folder: Path) -> dict:
    try:
        compile(candidate_code, "candidate.py", "exec")
    except SyntaxError as exc:
        return {"ok": False, "final": True, "specs": [],
                "error": f"candidate does not parse: {exc}"}
    specs: list[dict] = []

    def record(spec: dict):
        specs.append(spec)
        return StubModule(spec["name"])

    error = None
    with intercept_load_inline(record):
        try:
            cand = exec_module(candidate_code, "candidate", folder)
            _construct_on_meta(cand, reference_code, folder)
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt,)):
                raise
            error = "".join(traceback.format_exception(exc))[-3000:]
        finally:
            forget_module("candidate")
            forget_module("reference")
    return {"ok": error is None, "final": False, "specs": specs, "error": error}


def _construct_on_meta(cand, reference_code: str, folder: Path) -> None:
    import torch

    model_new = getattr(cand, "ModelNew", None)
    if model_new is None:
        return
    try:
        ref = exec_module(reference_code, "reference", folder)
        init_inputs = ref.get_init_inputs() if hasattr(ref, "get_init_inputs") else []
        with torch.device("meta"):
            model_new(*init_inputs)
    except Exception:
        pass
