"""The kernel execution harness: sandboxed, cached, low-noise, hard to fool.

    from dicepipe.harness import Job, HarnessSettings, HarnessSession, evaluate, RESULT_SCHEMA

`evaluate(jobs, settings, results_path=None, progress=True)` returns one RESULT_SCHEMA row per
job; `HarnessSession(settings)` does the same for many calls with its workers kept warm
(session.py). See orchestrator.py for the flow, and the modules it names for each part.

The folders follow the processes the code runs in:
  harness/         the host: the session and its orchestrator (threads, worker pools, the
                   extraction and build services, reference plans), the handle on a worker
                   process and the JSON channel to it, settings, rows and the results journal;
                   and the pure judgement of a row every stage applies (verdict.py, stats.py),
                   the static checks, GPU visibility and worker hygiene
  harness/build/   the build subsystem, run in builder workers (its package docstring)
  harness/worker/  what runs inside a sandboxed worker (its package docstring)
build/ and worker/ never import the host's machinery.
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
