"""kernelharness: measure a candidate kernel against its PyTorch reference, sandboxed,
cached, low-noise and hard to fool.

    from kernelharness import Job, HarnessSettings, HarnessSession, evaluate, RESULT_SCHEMA

`evaluate(jobs, settings, results_path=None, progress=True)` returns one RESULT_SCHEMA row per
job; `HarnessSession(settings)` does the same for many calls with its workers kept warm
(session.py). A row records facts (compiled, each check's outcome, tolerances needed,
deception flags, timings and the speedup interval); deciding what a row is worth (a
protocol, a threshold) is the caller's. See orchestrator.py for the flow, and the modules it
names for each part.

The folders follow the processes the code runs in:
  kernelharness/              the host: the session and its orchestrator (threads, worker
                              pools, the extraction and build services, reference plans), the
                              handle on a worker process and the JSON channel to it, settings
                              and their schema, rows and the results journal, the speedup
                              statistics, the static checks, GPU visibility and worker hygiene
  kernelharness/compilation/  the build subsystem, run in builder workers (its docstring)
  kernelharness/worker/       what runs inside a sandboxed worker (its docstring)
compilation/ and worker/ never import the host's machinery. method.py holds METHOD_VERSION,
what a row means beyond its settings.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for type checkers and readers of the import graph; at run time: _EXPORTS
    from .results import DYNAMIC_FLAGS, FLAG_COLUMNS, RESULT_SCHEMA, STATIC_FLAGS
    from .session import HarnessSession, evaluate, stored_results
    from .settings import HarnessSettings, Job

# Imported on first use (PEP 562), so importing a light module of the package (errors, schema,
# method, stats) loads neither the session's machinery nor the build and worker code.
_EXPORTS = {
    "HarnessSession": ".session", "evaluate": ".session", "stored_results": ".session",
    "DYNAMIC_FLAGS": ".results", "FLAG_COLUMNS": ".results", "RESULT_SCHEMA": ".results",
    "STATIC_FLAGS": ".results", "HarnessSettings": ".settings", "Job": ".settings",
}
__all__ = ["DYNAMIC_FLAGS", "FLAG_COLUMNS", "RESULT_SCHEMA", "STATIC_FLAGS", "HarnessSession",
           "HarnessSettings", "Job", "evaluate", "stored_results"]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
