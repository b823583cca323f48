"""Which input variants each reference accepts, found before any of its candidates runs.

Host side (the orchestrator's device threads). For every reference program of a batch, the
first job that needs it asks a device worker to run the reference alone on each strict
trial's inputs (`op: probe`, device_job.run_probe). A variant the reference rejects becomes
"as_drawn" in the plan the trials follow, so no candidate ever sees it. On CUDA a rejected
variant can be a device-side assert (an embedding's negated indices, a multinomial's
negative weights) that breaks the whole context: the probe then stops at that trial, its
worker is replaced, the trial is marked rejected and the probe goes on from the next trial
on the fresh worker. Plans are remembered per reference (and the settings that draw the
inputs) for the batch's life, so each reference is probed once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading

log = logging.getLogger(__name__)


def plan_key(reference_code: str, seed: int, settings: dict) -> str:
    blob = json.dumps({"reference": reference_code, "seed": seed,
                       "trials": settings["correct_trials"],
                       "tf32": [settings["cudnn_allow_tf32"], settings["matmul_allow_tf32"]]},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


class ReferencePlans:
    def __init__(self):
        self._plans: dict[str, list[str] | None] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self.probes = 0  # probe requests sent (restarts after a fatal error included)
        self.fatal = 0  # probes that broke their worker's context

    def plan_for(self, reference_code: str, seed: int, settings: dict, worker) -> list | None:
        """The plan (a variant per strict trial), probing on `worker` the first time. None
        when the reference could not be probed (its jobs then report its failure)."""
        key = plan_key(reference_code, seed, settings)
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:  # one probe per reference, whichever device thread asks first
            if key not in self._plans:
                self._plans[key] = self._probe(reference_code, seed, settings, worker)
            return self._plans[key]

    def _probe(self, reference_code: str, seed: int, settings: dict, worker) -> list | None:
        plan: list[str] = []
        trials = int(settings["correct_trials"])
        while len(plan) < trials:
            message = {"op": "probe", "reference_code": reference_code, "seed": seed,
                       "plan": plan, "settings": settings}
            self.probes += 1
            reply = worker.request(message, float(settings["run_timeout_s"]))
            if reply.get("op") != "result":  # timeout, crash, memory: no plan, trials decide
                log.warning("probing a reference failed (%s); its trials fall back as they go",
                            reply.get("error", reply.get("kind")))
                worker.restart()
                return None
            result = reply["row"]
            if reply.get("fatal") or reply.get("restart"):
                worker.restart()
            if result.get("plan") is None:
                return None
            plan = list(result["plan"])
            fatal = result.get("fatal_trial")
            if fatal is not None:
                self.fatal += 1
                log.info("the reference broke the CUDA context on trial %d's variant; that "
                         "variant is rejected and the probe goes on on a fresh worker", fatal)
                plan = plan[:fatal] + ["as_drawn"]
        return plan
