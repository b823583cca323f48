"""The kernel execution harness: sandboxed, cached, low-noise, hard to fool.

    from dicepipe.harness import Job, HarnessSettings, evaluate, RESULT_SCHEMA

`evaluate(jobs, settings, results_path=None, progress=True)` returns one RESULT_SCHEMA row per
job. See orchestrator.py for the flow, and the modules it names for each part.
"""

from .orchestrator import evaluate
from .results import DYNAMIC_FLAGS, FLAG_COLUMNS, RESULT_SCHEMA, STATIC_FLAGS
from .settings import HarnessSettings, Job

__all__ = [
           "DYNAMIC_FLAGS",
           "FLAG_COLUMNS",
           "RESULT_SCHEMA",
           "STATIC_FLAGS",
           "HarnessSettings",
           "Job",
           "evaluate",
]
