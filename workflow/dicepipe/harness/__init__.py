"""The kernel execution harness: sandboxed, cached, low-noise, hard to fool.

    from dicepipe.harness import Job, HarnessSettings, HarnessSession, evaluate, RESULT_SCHEMA

`evaluate(jobs, settings, results_path=None, progress=True)` returns one RESULT_SCHEMA row per
job; `HarnessSession(settings)` does the same for many calls with its workers kept warm
(session.py). See orchestrator.py for the flow, and the modules it names for each part.
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
