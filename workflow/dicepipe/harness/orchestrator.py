"""`evaluate`: the harness's one public entry, and the batch that runs it.

Work flows in two stages. Preparation (threads, one job each): static checks, extraction of
the job's `load_inline` specs in an extractor worker, then its builds in builder workers,
all on CPU cores and never on the GPU. Device work (one thread per device worker, one worker
per GPU, or one for the CPU): correctness and timing. On cuda a job reaches its GPU as soon
as its builds are done, so builds run ahead of and alongside device work; on cpu, device
work waits until every build is done, so compilers never share the cores being timed.
Rows are handed to the result store as they finish (append + fsync), in completion order.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import shutil
import tempfile
import threading
import time
import traceback
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import pyarrow as pa

from ..errors import HarnessError
from .buildspec import normalize_spec, spec_key, toolchain_fingerprint
from .compile_steps import SLOTS_ENV
from .pools import BuildService, ExtractService, WorkerPool
from .results import ResultStore, rows_to_table
from .rows import Prepared, account_builds, device_row, prepared_failure, scrub_paths
from .settings import HarnessSettings, Job
from .static_checks import static_flags
from .workerproc import WorkerProcess

log = logging.getLogger(__name__)
FLUSH_EVERY_S = 60.0
MAX_START_FAILURES = 3


def job_seed(base: int, job_id: str) -> int:
    return int(hashlib.sha256(f"{base}:{job_id}".encode()).hexdigest()[:8], 16) % (2**31 - 1)


def evaluate(jobs: Iterable[Job], settings: HarnessSettings,
             results_path: str | os.PathLike | None = None, progress: bool = True) -> pa.Table:
    """Evaluate every job; one RESULT_SCHEMA row each, in the order of `jobs`.

    With `results_path`, rows are appended (to a journal beside it) as they finish, the file
    is rewritten as Parquet, and a re-run skips every job id already there.
    """
    jobs = list(jobs)
    ids = [job.job_id for job in jobs]
    if len(set(ids)) != len(ids):
        dupes = sorted({i for i in ids if ids.count(i) > 1})[:5]
        raise HarnessError(f"job ids must be unique; repeated: {dupes}")
    store = ResultStore(results_path)
    todo = [job for job in jobs if not store.done(job.job_id)]
    if len(todo) < len(jobs):
        log.info("resuming: %d of %d jobs already have results", len(jobs) - len(todo), len(jobs))
    try:
        if todo:
            with Batch(settings, sorted({job.backend for job in todo})) as batch:
                batch.run(todo, store, progress)
        store.flush()
        if store.path is not None:
            store.close()
            store.journal_path.unlink(missing_ok=True)
    finally:
        store.close()
    return rows_to_table(store.rows[i] for i in ids)


class Batch:
    def __init__(self, settings: HarnessSettings, backends: list[str]):
        self.settings = settings
        self.cache = settings.cache_path
        self.cache.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix="dicepipe-harness-"))
        self.toolchains = {b: toolchain_fingerprint(b) for b in backends}
        n_build = settings.num_build_workers()
        arch = self.toolchains.get("cuda", {}).get("cuda_arch")
        # Every compiler process holds one of n_build CPU slots; there are more builders
        # than slots, so a build waiting for a precompiled header leaves its core to another.
        build_env = {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
                     SLOTS_ENV: str(n_build)}
        if arch:
            build_env["TORCH_CUDA_ARCH_LIST"] = arch  # only the local GPU's architecture
        base = self._worker_config()
        # (cuda builds wait longer: for two headers, the second after nvcc's front ends)
        extra = n_build if "cuda" in backends else max(1, n_build // 2)
        build_pool = WorkerPool([self._worker("build", i, base, build_env, file_mb=8192)
                                 for i in range(n_build + extra)])
        extract_pool = WorkerPool([
            self._worker("extract", i, base, {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"})
            for i in range(max(1, min(4, n_build)))])
        self.builds = {b: BuildService(build_pool, self.cache, self.toolchains[b],
                                       settings.build_timeout_s, settings.use_pch,
                                       settings.cuda_light_headers)
                       for b in backends}
        self.extracts = {b: ExtractService(extract_pool, self.cache, self.toolchains[b],
                                           settings.run_timeout_s) for b in backends}
        self.pools = [build_pool, extract_pool]
        self.devices = {b: self._device_workers(b, base) for b in backends}

    def _worker_config(self) -> dict:
        s = self.settings
        return {"cache_dir": str(self.cache), "memory_mb": s.memory_limit_mb,
                "open_files": s.max_open_files, "file_size_mb": 2048,
                "cpu_seconds_per_job": int((s.run_timeout_s * (3 + s.repeats) + s.build_timeout_s)
                                           * (os.cpu_count() or 1))}

    def _worker(self, role: str, index: int, base: dict, env: dict, device: str = "cpu",
                toolchain: dict | None = None, file_mb: int = 2048) -> WorkerProcess:
        config = dict(base, device=device, toolchain=toolchain or {}, file_size_mb=file_mb)
        # RLIMIT_AS is set inside the worker (not on cuda, where the driver reserves huge
        # address ranges); the resident-memory watchdog covers device workers everywhere.
        watch = self.settings.memory_limit_mb if role == "device" else None
        return WorkerProcess(role, self.root, index, config, env,
                             start_timeout_s=max(120.0, self.settings.run_timeout_s),
                             memory_limit_mb=watch)

    def _device_workers(self, backend: str, base: dict) -> list[WorkerProcess]:
        tool = self.toolchains[backend]
        if backend == "cpu":
            env = {"CUDA_VISIBLE_DEVICES": ""}
            if self.settings.cpu_threads:  # torch's pool and the candidate's OpenMP pool alike
                env.update(OMP_NUM_THREADS=str(self.settings.cpu_threads),
                           MKL_NUM_THREADS=str(self.settings.cpu_threads))
            return [self._worker("device", 0, base, env, "cpu", tool)]
        gpus = self.settings.devices
        if gpus is None:
            import torch

            gpus = tuple(range(torch.cuda.device_count()))
        if not gpus:
            raise HarnessError("backend cuda: no GPU is visible. Use backend cpu, or run where "
                               "a GPU is (check CUDA_VISIBLE_DEVICES).")
        return [self._worker("device", i, base, {"CUDA_VISIBLE_DEVICES": str(gpu)}, "cuda", tool)
                for i, gpu in enumerate(gpus)]

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, *exc) -> None:
        for service in list(self.builds.values()):
            service.stop()
        for pool in self.pools:
            pool.stop()
        for workers in self.devices.values():
            for worker in workers:
                worker.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    # --- running ------------------------------------------------------------------------------

    def run(self, todo: list[Job], store: ResultStore, progress: bool) -> None:
        from tqdm import tqdm

        results: queue.Queue = queue.Queue()
        queues = {b: queue.Queue() for b in self.devices}
        threads = [threading.Thread(target=self._device_loop, args=(b, w, queues[b], results),
                                    name=f"device-{b}-{w.index}", daemon=True)
                   for b, workers in self.devices.items() for w in workers]
        threads.append(threading.Thread(target=self._prepare_all, args=(todo, queues, results),
                                        name="prepare", daemon=True))
        for thread in threads:
            thread.start()
        last_flush = time.monotonic()
        with tqdm(total=len(todo), disable=not progress, desc="harness", unit="job") as bar:
            for _ in range(len(todo)):
                kind, payload = results.get()
                if kind == "abort":
                    raise payload
                store.add(payload)
                bar.update(1)
                if time.monotonic() - last_flush > FLUSH_EVERY_S:
                    store.flush()
                    last_flush = time.monotonic()

    def _prepare_all(self, todo: list[Job], queues: dict, results: queue.Queue) -> None:
        workers = 2 * self.settings.num_build_workers() + 2
        held: dict[str, list[Prepared]] = {b: [] for b in queues}
        try:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="prep") as pool:
                futures = [pool.submit(self._prepare, job) for job in todo]
                for future in as_completed(futures):
                    item = future.result()
                    if item.final_row is not None:
                        results.put(("row", self._finish(item, item.final_row)))
                    elif item.job.backend == "cpu":
                        held["cpu"].append(item)  # cpu timing waits for every build
                    else:
                        queues[item.job.backend].put(item)
            order = {job.job_id: i for i, job in enumerate(todo)}
            for backend, items in held.items():
                for item in sorted(items, key=lambda it: order[it.job.job_id]):
                    queues[backend].put(item)
        except BaseException as exc:
            results.put(("abort", exc))
        finally:
            for backend, q in queues.items():
                for _ in self.devices[backend]:
                    q.put(None)

    def _prepare(self, job: Job) -> Prepared:
        start = time.monotonic()
        item = Prepared(job=job, seed=job_seed(self.settings.seed, job.job_id),
                        static_flags=static_flags(job.candidate_code, job.backend))
        try:
            extracted = self.extracts[job.backend].extract(job)
            item.extract_s = time.monotonic() - start
            if not extracted["ok"] and extracted.get("final"):
                item.final_row = prepared_failure(item, "extract", extracted["error"])
                return item
            submitted = [self.builds[job.backend].submit(spec, job.job_id)
                         for spec in extracted["specs"]]
            item.keys = [key for key, _f in submitted]
            for spec, (_key, future) in zip(extracted["specs"], submitted):
                status = future.result()
                if not status.get("ok"):
                    item.final_row = prepared_failure(
                        item, "build", f"extension {spec['name']!r} failed to build",
                        status.get("log_tail", ""))
                    return item
        except Exception as exc:
            log.exception("preparing job %s failed", job.job_id)
            item.final_row = prepared_failure(item, "harness", f"harness error: {exc!r}")
        return item

    def _device_loop(self, backend: str, worker: WorkerProcess, jobs: queue.Queue,
                     results: queue.Queue) -> None:
        start_failures = 0
        while True:
            item = jobs.get()
            if item is None:
                return
            try:
                reply = self._run_on_device(item, worker)
            except Exception as exc:
                log.error("device job %s: %s", item.job.job_id, traceback.format_exc())
                reply = {"op": "failed", "kind": "harness", "phase": "job", "error": repr(exc)}
            if reply.get("kind") == "start":
                start_failures += 1
                if start_failures >= MAX_START_FAILURES:
                    results.put(("abort", HarnessError(
                        f"the {backend} device worker failed to start {start_failures} times: "
                        f"{reply['error']}")))
                    return
            else:
                start_failures = 0
            row = device_row(item, reply, worker.sandbox)
            results.put(("row", self._finish(item, row)))

    def _run_on_device(self, item: Prepared, worker: WorkerProcess) -> dict:
        job = item.job
        builds = self.builds[job.backend]
        toolchain = self.toolchains[job.backend]

        def on_message(message: dict) -> dict | None:
            if message.get("op") != "build_request":
                return None
            try:
                spec = normalize_spec(message["spec"])
                key = spec_key(spec, toolchain)
                status = builds.build_now(spec, key, job.job_id)
            except Exception as exc:
                status = {"ok": False, "log_tail": f"build request refused: {exc}"}
            return {"op": "build_reply", "status": status}

        message = {"op": "job", "job_id": job.job_id, "reference_code": job.reference_code,
                   "candidate_code": job.candidate_code, "seed": item.seed,
                   "settings": self.settings.to_wire()}
        try:
            reply = worker.request(message, self.settings.run_timeout_s, on_message)
        except RuntimeError as exc:
            return {"op": "failed", "kind": "start", "phase": "start", "error": str(exc),
                    "log": ""}
        if reply.get("op") == "result" and (reply.get("fatal") or reply.get("restart")):
            worker.restart()
        return reply

    def _finish(self, item: Prepared, row: dict) -> dict:
        builds = self.builds[item.job.backend]
        for name in ("error", "compile_log_tail"):
            row[name] = scrub_paths(row.get(name), self.root, self.cache)
        return account_builds(row, item, builds.built_by, builds.seconds)
