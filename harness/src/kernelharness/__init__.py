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

from .session import HarnessSession, evaluate, stored_results
from .results import DYNAMIC_FLAGS, FLAG_COLUMNS, RESULT_SCHEMA, STATIC_FLAGS
from .settings import HarnessSettings, Job

__all__ = [
           "DYNAMIC_FLAGS",
           "FLAG_COLUMNS",
           "RESULT_SCHEMA",
           "STATIC_FLAGS",
           "HarnessSession",
           "HarnessSettings",
           "Job",
           "evaluate",
           "stored_results",
]
