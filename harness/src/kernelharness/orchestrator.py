"""The machinery a harness session keeps warm: workers, services, and one call's run.

Work flows in two stages. Preparation (threads, one job each): static checks, extraction of
the job's `load_inline` specs in an extractor worker, then its builds in builder workers,
all on CPU cores and never on the GPU. Device work (one thread per device worker, one worker
per GPU, or one for the CPU): correctness and timing. The two stages are one long-lived
stream per batch that every call feeds (`Batch.submit`): a job starts preparing when it is
submitted, whatever call it belongs to, so a later call's builds start while an earlier
call's last jobs run. On cuda a job reaches its GPU as soon as its builds are done, so
builds run ahead of and alongside device work; on cpu, device work waits until no cpu job
is being prepared, so compilers never share the cores being timed.
Rows go to their caller as they finish, in completion order. After every device job the worker
is checked (hygiene.py) and replaced if the job left memory behind or broke its context.
The public entry points, `HarnessSession` and `evaluate`, are in session.py.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import queue
import shutil
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from . import hygiene
from .compilation.buildspec import normalize_spec, spec_key, toolchain_fingerprint
from .compilation.compile_steps import SLOTS_ENV
from .errors import HarnessError
from .gpus import ENV as VISIBLE_ENV
from .gpus import visible_count, worker_device_ids
from .pools import BuildService, ExtractService, WorkerPool
from .reference_plans import ReferencePlans
from .rows import Prepared, account_builds, device_row, prepared_failure, scrub_paths
from .settings import HarnessSettings, Job
from .static_checks import static_flags
from .workerproc import WorkerProcess

log = logging.getLogger(__name__)
MAX_START_FAILURES = 3
PROGRESS_REFRESH_S = 1.0
ROOT_PREFIX = "dicepipe-harness-"  # + the orchestrator's pid: see remove_stale_roots


def remove_stale_roots() -> None:
    """Worker folders of runs that were killed (their process is gone): nothing else
    would ever remove them from the temporary directory."""
    for path in Path(tempfile.gettempdir()).glob(f"{ROOT_PREFIX}*"):
        pid = path.name[len(ROOT_PREFIX):].split("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(path, ignore_errors=True)


def job_seed(base: int, reference_code: str) -> int:
    """The job's seed, from the reference program: every candidate of a task sees the same
    inputs, and identical jobs under different ids get identical rows."""
    digest = hashlib.sha256(f"{base}:".encode() + reference_code.encode()).hexdigest()
    return int(digest[:8], 16) % (2**31 - 1)


@dataclass(frozen=True)
class _Ticket:
    """One submitted job: who gets its row, and in which order it came."""

    token: str
    job: Job
    deliver: Callable[[str, object], None]
    measure_speed: bool
    order: int


class Batch:
    def __init__(self, settings: HarnessSettings, backends: list[str],
                 toolchains: dict[str, dict] | None = None):
        self.settings = settings
        self.backends = frozenset(backends)
        self.cache = settings.cache_path
        self.cache.mkdir(parents=True, exist_ok=True)
        known = toolchains or {}
        self.toolchains = {b: known.get(b) or toolchain_fingerprint(b) for b in backends}
        remove_stale_roots()
        self.root = Path(tempfile.mkdtemp(prefix=f"{ROOT_PREFIX}{os.getpid()}-"))
        self.reference_plans = ReferencePlans()
        # the stream (started on the first submit)
        self._prep_pool: ThreadPoolExecutor | None = None
        self._device_threads: list[threading.Thread] = []
        self._stream_lock = threading.Lock()
        self._cpu_preparing = 0  # cpu jobs in preparation (their device work waits for it)
        self._cpu_held: list[tuple[_Ticket, Prepared]] = []
        self._order = itertools.count()
        self.broken: Exception | None = None  # set when the batch cannot go on
        try:
            self._start_services(settings, backends)
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise

    def _start_services(self, settings: HarnessSettings, backends: list[str]) -> None:
        """Worker pools and services (processes start on first use, not here)."""
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
                                       settings.build_timeout_s, settings.build_options())
                       for b in backends}
        self.extracts = {b: ExtractService(extract_pool, self.cache, self.toolchains[b],
                                           settings.run_timeout_s) for b in backends}
        self.pools = [build_pool, extract_pool]
        self.devices = {b: self._device_workers(b, base) for b in backends}
        self._queues = {b: queue.Queue() for b in self.devices}

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
        count = visible_count()
        if not count:
            raise HarnessError("backend cuda: no GPU is visible. Use backend cpu, or run where "
                               "a GPU is (check CUDA_VISIBLE_DEVICES).")
        # logical index -> the parent's own name for that GPU (CUDA_VISIBLE_DEVICES=2,3: 2, 3)
        gpus = worker_device_ids(self.settings.devices, count, os.environ.get(VISIBLE_ENV))
        return [self._worker("device", i, base, {VISIBLE_ENV: gpu}, "cuda", tool)
                for i, gpu in enumerate(gpus)]

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.broken = self.broken or HarnessError("the harness batch was closed")
        if self._prep_pool is not None:
            self._prep_pool.shutdown(wait=False, cancel_futures=True)
        for backend, q in self._queues.items():
            for _ in self.devices[backend]:
                q.put(None)
        # Every worker is signalled first, so their exits (a GPU context's teardown can take
        # seconds) overlap instead of adding up; the stops below then only reap them.
        for worker in self._all_workers():
            worker.kill()
        for service in list(self.builds.values()):
            service.stop()
        for pool in self.pools:
            pool.stop()
        for workers in self.devices.values():
            for worker in workers:
                worker.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def _all_workers(self):
        for pool in self.pools:
            yield from pool.workers
        for workers in self.devices.values():
            yield from workers

    # --- the stream of jobs --------------------------------------------------------------------
    #
    # Jobs enter one at a time (`submit`) and flow through the same pipeline whatever call
    # they came from: a preparation thread each (static checks, extraction, builds), then the
    # device queue of their backend, served by one long-lived thread per device worker. So
    # the builds of a later call start while an earlier call's last builds and device jobs
    # are still running, and no call waits for another's slowest build. `run` is one call's
    # view of the stream: submit, then collect its rows.

    def _stream(self) -> None:
        """Start the preparation pool and the device threads (once per batch)."""
        if self._prep_pool is not None:
            return
        workers = 2 * self.settings.num_build_workers() + 2
        self._prep_pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="prep")
        for backend, devices in self.devices.items():
            for worker in devices:
                thread = threading.Thread(target=self._device_loop, args=(backend, worker),
                                          name=f"device-{backend}-{worker.index}", daemon=True)
                thread.start()
                self._device_threads.append(thread)

    def submit(self, token: str, job: Job, deliver: Callable[[str, object], None],
               measure_speed: bool = True) -> None:
        """Send one job into the stream; `deliver("row", row)` is called once with its row,
        from a harness thread (or `deliver("abort", exc)` when the batch cannot go on)."""
        ticket = _Ticket(token, job, deliver, measure_speed, next(self._order))
        with self._stream_lock:
            if self.broken is not None:
                deliver("abort", self.broken)
                return
            self._stream()
            if job.backend == "cpu":
                self._cpu_preparing += 1
            future = self._prep_pool.submit(self._prepare, token, job)
        future.add_done_callback(lambda f, t=ticket: self._prepared(t, f))

    def _prepared(self, ticket: _Ticket, future) -> None:
        """A job's preparation ended: its final row, or on to its device queue. On cpu,
        device work waits until no cpu job is being prepared, so compilers never share the
        cores being timed; the held jobs then go in the order they were submitted."""
        try:
            item = future.result()
        except BaseException as exc:  # a cancelled future (the batch closed) or a bug
            ticket.deliver("abort", exc if isinstance(exc, Exception) else HarnessError(repr(exc)))
            item = None
        release = []
        with self._stream_lock:
            if ticket.job.backend == "cpu":
                self._cpu_preparing -= 1
                if item is not None and item.final_row is None:
                    self._cpu_held.append((ticket, item))
                if self._cpu_preparing == 0:
                    release, self._cpu_held = sorted(self._cpu_held, key=lambda p: p[0].order), []
            elif item is not None and item.final_row is None:
                release = [(ticket, item)]
        if item is not None and item.final_row is not None:
            ticket.deliver("row", self._finish(item, item.final_row))
        for pair in release:
            self._queues[pair[0].job.backend].put(pair)

    def run(self, todo: list[tuple[str, Job]], on_row: Callable[[dict], None], progress: bool,
            measure_speed: bool = True) -> None:
        """Evaluate `todo` ((token, job) pairs, tokens unique in the session); `on_row` gets
        each finished row in this thread, in completion order."""
        from tqdm import tqdm

        results: queue.Queue = queue.Queue()
        builds_before = self._build_counts()
        for token, job in todo:
            self.submit(token, job, lambda kind, payload: results.put((kind, payload)), measure_speed)
        with tqdm(total=len(todo), disable=not progress, desc="harness", unit="job") as bar:
            finished = 0
            while finished < len(todo):
                try:
                    kind, payload = results.get(timeout=PROGRESS_REFRESH_S)
                except queue.Empty:
                    self._show_builds(bar, builds_before)
                    continue
                if kind == "abort":
                    raise payload
                on_row(payload)
                finished += 1
                self._show_builds(bar, builds_before)
                bar.update(1)

    def _build_counts(self) -> tuple[int, int]:
        started = sum(s.compiles_started for s in self.builds.values())
        done = sum(s.compiles_finished for s in self.builds.values())
        return started, done

    def _show_builds(self, bar, before: tuple[int, int]) -> None:
        """Builds of this call as they finish: a cold batch is not "0/11" for minutes."""
        started, done = self._build_counts()
        if started > before[0]:
            bar.set_postfix_str(f"built {done - before[1]}/{started - before[0]}", refresh=True)

    def _prepare(self, token: str, job: Job) -> Prepared:
        start = time.monotonic()
        item = Prepared(job=job, seed=job_seed(self.settings.seed, job.reference_code),
                        static_flags=static_flags(job.candidate_code, job.backend), token=token)
        try:
            extracted = self.extracts[job.backend].extract(job)
            item.extract_s = time.monotonic() - start
            if not extracted["ok"] and extracted.get("final"):
                item.final_row = prepared_failure(item, "extract", extracted["error"])
                return item
            submitted = [self.builds[job.backend].submit(spec, token)
                         for spec in extracted["specs"]]
            item.keys = [key for key, _f in submitted]
            for spec, (_key, future) in zip(extracted["specs"], submitted):
                status = future.result()
                if status.get("damaged"):  # the cache's fault, not the candidate's
                    item.final_row = prepared_failure(item, "harness", status["damaged"])
                    return item
                if not status.get("ok"):
                    item.final_row = prepared_failure(
                        item, "build", f"extension {spec['name']!r} failed to build",
                        status.get("log_tail", ""))
                    return item
        except Exception as exc:
            log.exception("preparing job %s failed", job.job_id)
            item.extract_s = item.extract_s or time.monotonic() - start
            item.final_row = prepared_failure(item, "harness", f"harness error: {exc!r}")
        return item

    def _device_loop(self, backend: str, worker: WorkerProcess) -> None:
        jobs = self._queues[backend]
        start_failures = 0
        while True:
            pair = jobs.get()
            if pair is None:
                return
            ticket, item = pair
            if self.broken is not None:
                ticket.deliver("abort", self.broken)
                continue
            try:
                reply, seconds = self._run_clean(item, worker, ticket.measure_speed)
            except Exception as exc:
                log.error("device job %s: %s", item.job.job_id, traceback.format_exc())
                reply = {"op": "failed", "kind": "harness", "phase": "job", "error": repr(exc)}
                seconds = 0.0
            if reply.get("kind") == "start":
                start_failures += 1
                if start_failures >= MAX_START_FAILURES:
                    # every job after this one fails the same way: the batch stops here
                    self.broken = HarnessError(
                        f"the {backend} device worker failed to start {start_failures} times: "
                        f"{reply['error']}")
                    ticket.deliver("abort", self.broken)
                    continue
            else:
                start_failures = 0
            row = device_row(item, reply, worker.sandbox)
            row["wall_device_s"] = seconds  # what it really cost, a timeout's wait included
            ticket.deliver("row", self._finish(item, row))

    def _run_clean(self, item: Prepared, worker: WorkerProcess,
                   measure_speed: bool) -> tuple[dict, float]:
        """One job on a worker no earlier job has left anything on (see hygiene.py)."""
        held_before = dict(worker.excess_mb)
        reply, seconds = self._timed_request(item, worker, measure_speed)
        self._after_job(item, worker, reply)
        if hygiene.memory_failure(reply) and hygiene.holds_excess(held_before):
            log.warning("job %s failed for memory on a worker that held %s MB more than at "
                        "start; re-running it once on a fresh worker", item.job.job_id,
                        {k: round(v) for k, v in held_before.items()})
            worker.restart()
            reply, again_s = self._timed_request(item, worker, measure_speed)
            self._after_job(item, worker, reply)
            seconds += again_s
        if self._load_failed_on_damage(item, reply):
            log.warning("job %s failed loading a damaged cache entry (%s); running it again "
                        "on the rebuilt entry", item.job.job_id, _load_error(reply))
            worker.restart()  # a fresh process: nothing of the damaged module stays mapped
            reply, again_s = self._timed_request(item, worker, measure_speed)
            self._after_job(item, worker, reply)
            seconds += again_s
        return self._blame_damage(item, reply), seconds

    def _load_failed_on_damage(self, item: Prepared, reply: dict) -> bool:
        """A job that failed loading its programs (the worker crashed, SIGBUS say, or an
        ImportError) is the candidate's failure only if the builds it loaded match their
        hashes; a damaged one is rebuilt (pools.BuildService.repair_damaged) and the job runs
        again, once."""
        if reply.get("op") == "failed":
            failed = reply.get("phase", "").split(":")[0] in ("load", "build")
        else:
            failed = (reply.get("row") or {}).get("error_phase") in ("load", "build")
        if not failed:
            return False
        builds = self.builds[item.job.backend]
        return builds.repair_damaged(_loaded_keys(item, reply), item.token or item.job.job_id)

    def _blame_damage(self, item: Prepared, reply: dict) -> dict:
        """A job whose build was found damaged again after its rebuild fails as the
        harness's (a row never reused), not as the candidate's."""
        unrepairable = self.builds[item.job.backend].unrepairable
        found = [unrepairable[k] for k in _loaded_keys(item, reply) if k in unrepairable]
        if not found:
            return reply
        return {"op": "failed", "kind": "harness", "phase": "job", "error": found[0], "log": ""}

    def _timed_request(self, item: Prepared, worker: WorkerProcess,
                       measure_speed: bool) -> tuple[dict, float]:
        try:
            worker.ensure_started()  # a fresh worker's start-up is not the job's cost
        except RuntimeError as exc:
            return ({"op": "failed", "kind": "start", "phase": "start", "error": str(exc),
                     "log": ""}, 0.0)
        waited = [0.0]  # time spent on builds the worker asked for (counted as build time)
        start = time.monotonic()
        reply = self._run_on_device(item, worker, measure_speed, waited)
        return reply, max(0.0, time.monotonic() - start - waited[0])

    def _after_job(self, item: Prepared, worker: WorkerProcess, reply: dict) -> None:
        if reply.get("op") != "result":
            return  # the worker is gone already (timeout, crash, memory): the next job starts one
        if reply.get("fatal") or reply.get("restart"):
            worker.restart()
            return
        leaks = worker.check_memory(reply.get("memory"))
        if leaks:
            log.warning("job %s left memory behind on the %s worker (%s); replacing the worker",
                        item.job.job_id, worker.config.get("device"), ", ".join(leaks))
            worker.restart()

    def _run_on_device(self, item: Prepared, worker: WorkerProcess, measure_speed: bool,
                       waited: list[float]) -> dict:
        job = item.job
        builds = self.builds[job.backend]
        toolchain = self.toolchains[job.backend]

        def on_message(message: dict) -> dict | None:
            if message.get("op") != "build_request":
                return None
            start = time.monotonic()
            try:
                spec = normalize_spec(message["spec"])
                key = spec_key(spec, toolchain)
                status = builds.build_now(spec, key, item.token or job.job_id)
            except Exception as exc:
                status = {"ok": False, "log_tail": f"build request refused: {exc}"}
            waited[0] += time.monotonic() - start
            return {"op": "build_reply", "status": status}

        settings = self.settings.to_wire()
        plan = self.reference_plans.plan_for(job.reference_code, item.seed, settings, worker)
        message = {"op": "job", "job_id": job.job_id, "reference_code": job.reference_code,
                   "candidate_code": job.candidate_code, "seed": item.seed,
                   "measure_speed": bool(measure_speed), "settings": settings,
                   "variant_plan": plan}
        try:
            return worker.request(message, self.settings.run_timeout_s, on_message)
        except RuntimeError as exc:
            return {"op": "failed", "kind": "start", "phase": "start", "error": str(exc),
                    "log": ""}

    @property
    def repairs(self) -> list[str]:
        """Damaged cache entries found and rebuilt so far, in order (one message each)."""
        return [m for service in (*self.builds.values(), *self.extracts.values())
                for m in service.repairs]

    def _finish(self, item: Prepared, row: dict) -> dict:
        builds = self.builds[item.job.backend]
        for name in ("error", "compile_log_tail"):
            row[name] = scrub_paths(row.get(name), self.root, self.cache)
        return account_builds(row, item, builds.built_by, builds.seconds)


def _loaded_keys(item: Prepared, reply: dict) -> list[str]:
    """The builds a job used: as its worker reported them, else as extraction found them."""
    used = (reply.get("row") or {}).get("used_keys") if reply.get("op") == "result" else None
    return list(dict.fromkeys([*(used or []), *item.keys]))


def _load_error(reply: dict) -> str:
    """The last line of a failed load's error: the worker's crash, or the exception raised."""
    text = reply.get("error") if reply.get("op") == "failed" else (reply.get("row") or {}).get(
        "error")
    lines = [line for line in (text or "").splitlines() if line.strip()]
    return lines[-1].strip()[:200] if lines else "no error text"
