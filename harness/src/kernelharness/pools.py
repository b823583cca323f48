"""Pools of workers and the two services the device work waits on: extraction and builds.

`WorkerPool` lends idle workers to threads; processes start on first use, so a batch whose
builds are all cached never starts a builder. `BuildService` de-duplicates builds by key
(a key is built at most once per batch, and never again once in the cache) and remembers
which job caused each build, so every row can say how much it built and how much it reused.
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from .compilation.buildspec import build_dir, check_build, normalize_spec, spec_key
from .compilation.entries import NO_HASH, discard, label, seal, unhashed, unsealed
from .compilation.options import BuildOptions
from .workerproc import WorkerProcess

log = logging.getLogger(__name__)


class WorkerPool:
    def __init__(self, workers: list[WorkerProcess]):
        self.workers = workers
        self._idle: queue.Queue = queue.Queue()
        for worker in workers:
            self._idle.put(worker)

    def call(self, message: dict, timeout_s: float, restart_when=None) -> dict:
        """One request on an idle worker; `restart_when(reply)` marks a worker that exits."""
        worker = self._idle.get()
        try:
            try:
                reply = worker.request(message, timeout_s)
            except RuntimeError as exc:  # the worker could not start
                reply = {"op": "failed", "kind": "start", "phase": "start", "error": str(exc),
                         "log": ""}
            if restart_when is not None and reply.get("op") == "result" and restart_when(reply):
                worker.restart()
            return reply
        finally:
            self._idle.put(worker)

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()


class BuildService:
    def __init__(self, pool: WorkerPool, cache: Path, toolchain: dict, timeout_s: float,
                 options: BuildOptions):
        self.pool, self.cache, self.toolchain = pool, cache, toolchain
        self.timeout_s, self.options = timeout_s, options
        self._executor = ThreadPoolExecutor(max_workers=len(pool.workers),
                                            thread_name_prefix="build")
        self._lock = threading.Lock()
        self._futures: dict[str, Future] = {}
        self.built_by: dict[str, str] = {}  # key -> the job (its token) whose request compiled it
        self.seconds: dict[str, float] = {}
        self.compiles_started = 0  # cache misses sent to a builder (for progress display)
        self.compiles_finished = 0
        self.repairs: list[str] = []  # "cache entry X was damaged (why), rebuilt", in order
        self._specs: dict[str, dict] = {}  # key -> spec (what a damaged entry is rebuilt from)
        self._repaired: set[str] = set()  # keys rebuilt for damage in this batch (once each)
        self.unrepairable: dict[str, str] = {}  # key -> why: damaged again after its rebuild

    def submit(self, spec: dict, job_id: str) -> tuple[str, Future]:
        """The build of `spec`: from the cache when its entry matches its hashes, else built
        (a damaged entry is removed first and reported)."""
        key = spec_key(spec, self.toolchain)
        with self._lock:
            self._specs.setdefault(key, spec)
            future = self._futures.get(key)
            if future is not None:
                return key, future
            status, damage = check_build(self.cache, key)
            if damage:
                return key, self._rebuild(key, damage, job_id)
            if status is not None:
                future = Future()
                future.set_result(status)
            else:
                future = self._start_build(spec, key, job_id)
            self._futures[key] = future
            return key, future

    def _start_build(self, spec: dict, key: str, job_id: str) -> Future:
        self.built_by[key] = job_id
        self.compiles_started += 1
        return self._executor.submit(self._build, spec, key)

    def _rebuild(self, key: str, damage: str, job_id: str) -> Future:
        """A damaged entry of `key`: removed and built again, once per batch; found damaged
        again, its status says so (`damaged`) and the job fails as the harness's fault, never
        the candidate's. Under _lock."""
        name = label(self.cache, build_dir(self.cache, key))
        future: Future = Future()
        if key in self._repaired:
            message = (f"cache entry {name} is damaged ({damage}) and was rebuilt once "
                       f"already in this run: check the disk under {self.cache} "
                       "(`dicepipe cache verify` lists damaged entries)")
            log.error("%s", message)
            self.unrepairable[key] = message
            self._futures.pop(key, None)
            future.set_result({"ok": False, "transient": True, "damaged": message,
                               "log_tail": message})
            return future
        status, still = check_build(self.cache, key)
        if status is not None and still is None:  # another process rebuilt it meanwhile
            future.set_result(status)
            self._futures[key] = future
            return future
        self._repaired.add(key)
        discard(self.cache, build_dir(self.cache, key))
        spec = self._specs.get(key)
        if spec is None:  # met only inside a worker: built when the job asks for it again
            self._note(name, damage, "removed")
            self._futures.pop(key, None)
            future.set_result({"ok": False, "transient": True, "removed": True})
            return future
        self._note(name, damage)
        future = self._start_build(spec, key, job_id)
        self._futures[key] = future
        return future

    def _note(self, entry: str, damage: str, done: str = "rebuilt") -> None:
        if unhashed(damage):  # made before entries carried hashes: not damage, not reported
            log.info("cache entry %s has %s: %s", entry, NO_HASH, done)
            return
        message = f"cache entry {entry} was damaged ({damage}), {done}"
        log.warning("%s", message)
        self.repairs.append(message)

    def build_now(self, spec: dict, key: str, job_id: str) -> dict:
        """For a device worker that met a spec extraction missed, or found its cached build
        damaged (the entry is checked again here, even when this batch built it)."""
        _key, future = self.submit(spec, job_id)
        status = future.result()
        if status.get("ok") and self.repair_damaged([key], job_id):
            _key, future = self.submit(spec, job_id)
            status = future.result()
        return status

    def repair_damaged(self, keys: list[str], job_id: str) -> bool:
        """Whether any of `keys` had a cached build that no longer matches its hashes (each
        such entry is then rebuilt, or given up on: `unrepairable`). False: every entry is
        healthy, so a job that failed loading them failed on its own."""
        found = False
        for key in dict.fromkeys(keys):
            status, damage = check_build(self.cache, key)
            if status is None and damage is None and self._built_ok(key):  # gone since
                damage = "the build folder is missing"
            if damage:
                found = True
                with self._lock:
                    self._futures.pop(key, None)
                    future = self._rebuild(key, damage, job_id)
                future.result()
        return found

    def _built_ok(self, key: str) -> bool:
        """Whether this batch found or made a working build of `key` (so a missing folder is
        the cache's loss, not a build that never was)."""
        with self._lock:
            future = self._futures.get(key)
        return (future is not None and future.done() and not future.cancelled()
                and future.exception() is None
                and bool(future.result().get("ok")))

    def _build(self, spec: dict, key: str) -> dict:
        message = {"op": "build", "spec": spec, "key": key, "options": self.options.to_wire()}
        reply = self.pool.call(message, self.timeout_s)
        if reply.get("op") == "failed":
            status = {"ok": False, "transient": True,
                      "log_tail": f"{reply['error']}\n{reply.get('log', '')}"}
        else:
            status = reply["status"]
        for entry, damage in status.pop("repaired", None) or []:  # found by the builder
            self._note(entry, damage)
        self.seconds[key] = float(status.get("seconds", 0.0))
        with self._lock:
            self.compiles_finished += 1
            if status.get("transient"):  # not cached: a later batch may try again
                self._futures.pop(key, None)
        return status

    def stop(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.pool.stop()


class ExtractService:
    """Extraction results are cached by content too: a second batch starts no extractor. A
    record carries its own hash; one that does not match it is extracted again (reported)."""

    def __init__(self, pool: WorkerPool, cache: Path, toolchain: dict, timeout_s: float):
        self.pool, self.cache, self.timeout_s = pool, cache, timeout_s
        self._tool = json.dumps(toolchain, sort_keys=True)
        self.repairs: list[str] = []

    def _path(self, job) -> Path:
        digest = hashlib.sha256(json.dumps([job.candidate_code, job.reference_code, job.backend,
                                            self._tool]).encode()).hexdigest()
        return self.cache / "extract" / digest[:2] / f"{digest}.json"

    def extract(self, job) -> dict:
        path = self._path(job)
        try:
            record, damage = unsealed(path.read_text())
        except OSError:
            record, damage = None, None
        if record is not None:
            return record
        if damage:
            discard(self.cache, path)
            if not unhashed(damage):  # a record from before records were hashed: not damage
                message = f"cache entry {label(self.cache, path)} was damaged ({damage}), rebuilt"
                log.warning("%s", message)
                self.repairs.append(message)
        message = {"op": "extract", "candidate_code": job.candidate_code,
                   "reference_code": job.reference_code}
        # the worker exits after a failed extraction (state left behind): do not race it
        reply = self.pool.call(message, self.timeout_s, restart_when=lambda r: not r.get("ok"))
        if reply.get("op") == "failed":
            return {"ok": False, "final": False, "specs": [], "error": reply["error"]}
        result = {"ok": bool(reply.get("ok")), "final": bool(reply.get("final")),
                  "error": reply.get("error"), "specs": []}
        for spec in reply.get("specs", []):
            try:
                result["specs"].append(normalize_spec(spec))  # re-checked: it came from a sandbox
            except Exception as exc:
                result.update(ok=False, final=True, error=f"bad load_inline arguments: {exc}")
        if result["ok"]:
            path.parent.mkdir(parents=True, exist_ok=True)
            # two jobs with the same files may finish extraction at once: private tmp names
            tmp = path.with_name(f"{path.name}.{threading.get_ident()}.tmp")
            tmp.write_text(json.dumps(seal(result)))
            tmp.replace(path)
        return result

    def stop(self) -> None:
        self.pool.stop()
