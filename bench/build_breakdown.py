"""Where a cold kernel build's CPU time goes, on real kernels, and cold builds per minute.

Every `load_inline` spec of a corpus of released kernels (extracted as the harness's extractor
workers do: the candidate's module run with `load_inline` recording its arguments) is built
through the harness's own build path (`builder.build_spec`, as BuildService's builder workers
run it: CPU slots shared by all builders, host unit first, nvcc's phases run one by one, the
precompiled host headers) into a fresh cache, `--workers` builder processes at a time over
`--slots` CPU slots (default: twice as many builders as slots, as the harness runs cuda
builds; the minimal-headers and slim-ops runs of the journal ran 16 builders on 16 slots).
Each build's status carries one record per compiler run (`steps`: wall and CPU seconds of the
whole process tree, from wait4); the report sums them per phase:

  host:check        main.cpp up to its bindings, preprocessed: a bound name nothing declares
                    or a second module block fails the build here (preludes' binding check)
  host              main.cpp: torch/extension.h (precompiled) + the bindings (pybind11)
  cuda:dryrun       nvcc --dryrun (the phase commands)
  cuda:preprocess   the host compiler's -E passes of cuda.cu (device and host side)
  cuda:cudafe       cudafe++ (host side split)           cuda:cicc   device front end + NVVM
  cuda:ptxas        PTX to SASS                           cuda:fatbinary
  cuda:host-compile the host pass of cuda.cu (against the precompiled prefix)
  link              the shared library
  pch:host, pch:cuda-host   the two precompiled headers, made once per cold cache (apart)

`--variants` runs each variant on the same kernels, each into its own cold cache, in the
same call, in the order given (the first is the baseline of the ratios). Before the first,
every header and compiler binary the builds read is read once (`warm_page_cache`; off with
`--no-warm-page-cache`): on a fresh machine the first variant otherwise reads them from disk
and the second does not (2.32x with the "before" variant first on a fresh machine, 2.00x on
the same code with the headers read first: docs/journal/2026-12-04-build-cut-slim-ops.md).
Even so, ratios move by about a tenth between calls and orders (1.79-2.00x): report both
orders.

  baseline          the build as the harness does it (use_pch and cuda_light_headers on)
  no-light-headers  cuda.cu compiled as written (what cuda_light_headers saves, measured)
  no-minimal-headers  no minimal-header tier and no binding check (harness.run.minimal_headers
                    off): the harness before the header work, the "before" of both
  no-slim-ops       cuda.cu's minimal prelude with the operators' own headers instead of
                    their slim copies (preludes.slim_op_text): the harness with minimal
                    headers, before the slim operator headers
  no-prelude-wait   a main.cpp finding its prelude's precompiled header being made by
                    another builder compiles plainly (BuildOptions.wait_for_prelude_header off): the
                    harness with slim operator headers, before the prelude wait
  no-shared-host    every build compiles its main.cpp (BuildOptions.share_host_objects off): the
                    harness with the prelude wait, before the shared main.cpp objects

The clock of a variant starts once its `--workers` builder processes are up with the build
modules imported (as a HarnessSession's builders, started once for a session's calls); with
`--cold-pool` it starts before them, as in the journal's build-cut runs (up to
docs/journal/2026-12-04-build-cut-both-orders.md), and each variant's wall then includes the
6-8 s that 32 processes take to start on 16 cores (`first_start_s`).

Each variant's summary also counts the header tier each build compiled with (`tiers`): the
cuda unit's (minimal-headers, light-headers, full-headers) and main.cpp's.

Corpus (`--corpus`): the real corpus folder of bench/harness_real_corpus.py (candidates/*.py,
references/*.py), or a CUDA-L1 release file (optimized_cuda_code/h100.json: one JSON object
a line, custom_code and ref_code). With a CPU-only torch (this 2-core VM) the bench points
torch at the local CUDA toolkit and links against empty stand-ins of libc10_cuda/libtorch_cuda
(the link step is then cheaper than the real one, which is measured on the GPU machine).

    PYTHONPATH=workflow python bench/build_breakdown.py --corpus .carry/realcorpus \\
        --out $OUT/bb --budget-s 150
    PYTHONPATH=workflow python bench/build_breakdown.py --corpus h100.json \\
        --out /tmp/bb --workers 2 --slots 2 --limit 6      # this 2-core VM, CUDA-L1's file

Writes <out>/build_breakdown.json (every build's status and records, the per-phase table per
variant, builds per minute, ratios against the first variant) and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workflow"))

PHASES = ("host:check", "host", "host:shared", "cuda:dryrun", "cuda:preprocess", "cuda:cudafe",
          "cuda:cicc", "cuda:ptxas", "cuda:fatbinary", "cuda:host-compile", "link", "pch:host",
          "pch:cuda-host")
PCH_STEPS = ("pch:host", "pch:cuda-host")

# name -> what it changes (applied in each builder process by _apply_variant)
VARIANTS = {
    "baseline": "the harness as configured (use_pch, cuda_light_headers from params.yaml)",
    "no-light-headers": "cuda.cu compiled as written (cuda_light_headers off)",
    "no-minimal-headers": "no minimal-header tier, no binding check (minimal_headers off): "
                          "the harness before them",
    "no-slim-ops": "the operators' own headers in cuda.cu's minimal prelude (no slim copies)",
    "no-prelude-wait": "a main.cpp that finds another builder making its prelude's precompiled "
                       "header compiles plainly at once (the harness before the prelude wait)",
    "no-shared-host": "every build compiles its own main.cpp (no main.cpp object shared "
                      "between builds of the same text)",
}


# ------------------------------------------------------------------ corpus and specs

def template_corpus(count: int) -> list[dict]:
    """`count` kernels of the augment templates author, the RL step bench's kernels: the
    CUDA sources a scripted author writes for the shipped tasks, cycling over the distinct
    ones, each made a build of its own by a comment after its first include (as rollouts of
    one task differ: the same operators, another text)."""
    import yaml

    from dicepipe.augment.authors.templates import TemplateAuthor
    from dicepipe.augment.tasks import generate_tasks

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    tasks = generate_tasks(dict(params["augment"], max_tasks={}), "cuda")
    author = TemplateAuthor()
    distinct, codes = [], set()
    for task in tasks:
        code = author.write(task, 0).code
        if code not in codes:
            codes.add(code)
            distinct.append((task, code))
    items = []
    for k in range(count):
        task, code = distinct[k % len(distinct)]
        code = code.replace("#include <torch/extension.h>",
                            f"#include <torch/extension.h>\n// build {k}", 1)
        items.append({"name": f"{task.task_id}#{k}", "code": code, "ref": task.reference_code})
    return items


def read_corpus(path: Path, limit: int | None, stride: int = 1) -> list[dict]:
    """[{"name", "code", "ref"}] in a stable order."""
    items = []
    if str(path).startswith("templates:"):
        items = template_corpus(int(str(path).split(":", 1)[1]))
    elif path.is_dir():
        refs = path / "references"
        for cand in sorted((path / "candidates").glob("*.py")):
            ref = refs / cand.name
            items.append({"name": cand.stem, "code": cand.read_text(),
                          "ref": ref.read_text() if ref.is_file() else ""})
    else:
        text = path.read_text()
        try:
            rows = json.loads(text)
            rows = rows if isinstance(rows, list) else [rows]
        except json.JSONDecodeError:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        for row in rows:
            code = row.get("custom_code") or row.get("code") or ""
            if "load_inline" not in code:
                continue
            name = f"L{row.get('level_id', '?')}_{row.get('task_id', len(items))}"
            items.append({"name": name, "code": code, "ref": row.get("ref_code") or ""})
    items = items[::max(1, stride)]
    return items[:limit] if limit else items


def extract_all(items: list[dict], work: Path) -> list[dict]:
    """The cuda `load_inline` specs of every candidate, deduplicated by build key."""
    from kernelharness.compilation.buildspec import spec_key, spec_uses_cuda, toolchain_fingerprint
    from kernelharness.worker.extract import extract_specs

    toolchain = toolchain_fingerprint("cuda")
    seen, specs = set(), []
    cwd = os.getcwd()
    for k, item in enumerate(items):
        folder = work / f"extract-{k}"
        folder.mkdir(parents=True)
        try:
            result = extract_specs(item["code"], item["ref"], folder)
        finally:
            os.chdir(cwd)
        for spec in result["specs"]:
            if not spec_uses_cuda(spec):
                continue
            key = spec_key(spec, toolchain)
            if key not in seen:
                seen.add(key)
                specs.append({"kernel": item["name"], "key": key, "spec": spec})
    return specs


# ------------------------------------------------------------------ builder processes

def _cpu_torch_stand_ins(folder: str) -> dict:
    """With a CPU-only torch: torch's CUDA home, empty libc10_cuda/libtorch_cuda to link, and
    the one generated c10/cuda header a CPU wheel lacks (extra spec fields to add)."""
    import torch
    from torch.utils import cpp_extension as ce

    if torch.version.cuda is not None:
        return {}
    if ce.CUDA_HOME is None:
        import shutil

        nvcc = os.path.realpath(shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
        home = "/usr/local/cuda" if os.path.isdir("/usr/local/cuda") else os.path.dirname(
            os.path.dirname(nvcc))
        ce.CUDA_HOME = home
        os.environ.setdefault("CUDA_HOME", home)
    stubs = Path(folder)
    stubs.mkdir(parents=True, exist_ok=True)
    for lib in ("c10_cuda", "torch_cuda"):
        target = stubs / f"lib{lib}.so"
        if not target.exists():
            import subprocess

            subprocess.run(["cc", "-shared", "-x", "c", "/dev/null", "-o", str(target)],
                           check=True)
    macros = stubs / "include" / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
    macros.parent.mkdir(parents=True, exist_ok=True)
    macros.write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    return {"extra_ldflags": [f"-L{stubs}"], "extra_include_paths": [str(stubs / "include")]}


_STATE: dict = {}


def _init_builder(variant: str, slots: int, stub_dir: str, arch: str) -> None:
    from kernelharness.compilation.compile_steps import SLOTS_ENV

    os.environ[SLOTS_ENV] = str(slots)
    os.environ["TORCH_CUDA_ARCH_LIST"] = arch
    os.environ.setdefault("MAX_JOBS", "1")
    _STATE["stand_ins"] = _cpu_torch_stand_ins(stub_dir)
    _STATE["variant"] = variant
    try:
        os.nice(10)  # as the harness's builders
    except OSError:
        pass


# variants that turn one build option off (kernelharness.compilation.options.BuildOptions)
_SWITCHED_OFF = {"no-slim-ops": "slim_op_headers", "no-prelude-wait": "wait_for_prelude_header",
                 "no-shared-host": "share_host_objects"}


def _build_one(item: dict, cache: str, use_pch: bool, light_headers: bool) -> dict:
    from kernelharness.compilation.builder import build_spec
    from kernelharness.compilation.options import BuildOptions

    spec = dict(item["spec"])
    for field, extra in _STATE["stand_ins"].items():
        spec[field] = list(spec[field]) + extra
    minimal_headers = True
    if _STATE["variant"] == "no-light-headers":
        light_headers = minimal_headers = False
    if _STATE["variant"] == "no-minimal-headers":
        minimal_headers = False
    switches = dict(slim_op_headers=True, share_host_objects=True, wait_for_prelude_header=True)
    if _STATE["variant"] in _SWITCHED_OFF:
        switches[_SWITCHED_OFF[_STATE["variant"]]] = False
    options = BuildOptions(use_pch=use_pch, light_headers=light_headers,
                           minimal_headers=minimal_headers, **switches)
    start = time.monotonic()
    status = build_spec(spec, item["key"], Path(cache), options)
    return {"kernel": item["kernel"], "key": item["key"], "ok": bool(status.get("ok")),
            "wall_s": round(time.monotonic() - start, 3), "done_at": time.monotonic(),
            "pch": status.get("pch"), "steps": status.get("steps", []),
            "log_tail": (status.get("log_tail") or "")[-400:]}


def _ready(roll: str, workers: int, timeout_s: float) -> int:
    """One pool worker up, its build modules imported, and held until `workers` workers are:
    each holds its task, so `workers` tasks land on `workers` distinct processes."""
    import kernelharness.compilation.builder  # noqa: F401 - what a build imports first

    Path(roll, str(os.getpid())).touch()
    deadline = time.monotonic() + timeout_s
    while len(os.listdir(roll)) < workers and time.monotonic() < deadline:
        time.sleep(0.05)
    return os.getpid()


def start_workers(pool, workers: int, roll: Path, timeout_s: float = 300.0) -> tuple[float, int]:
    """Start every worker of `pool` before the clock: the harness's builders live for a session
    (HarnessSession), so a call's builds do not wait for them. Seconds taken, workers seen."""
    roll.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    futures = [pool.submit(_ready, str(roll), workers, timeout_s) for _ in range(workers)]
    pids = {f.result() for f in futures}
    return time.monotonic() - t0, len(pids)


def run_variant(variant: str, specs: list[dict], args, work: Path) -> dict:
    cache = work / f"cache-{variant}"
    cache.mkdir(parents=True)
    ctx = multiprocessing.get_context("spawn")
    rows: list[dict] = []
    todo = list(specs)
    with ProcessPoolExecutor(args.workers, mp_context=ctx, initializer=_init_builder,
                             initargs=(variant, args.slots, str(work / "stubs"),
                                       args.arch)) as pool:
        pool_start = None
        if not args.cold_pool:
            pool_start = start_workers(pool, args.workers, work / f"roll-{variant}")
            print(f"  [{variant}] {pool_start[1]} builders up in {pool_start[0]:.1f} s "
                  f"(before the clock)", flush=True)
        start = time.monotonic()
        deadline = start + args.budget_s if args.budget_s else None
        running = set()
        while todo or running:
            while todo and len(running) < args.workers and (
                    deadline is None or time.monotonic() < deadline):
                running.add(pool.submit(_build_one, todo.pop(0), str(cache), args.use_pch,
                                        args.light_headers))
            if not running:
                break
            done, running = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                row = future.result()
                row["done_at"] = round(row["done_at"] - start, 3)
                rows.append(row)
                print(f"  [{variant}] {len(rows)}/{len(specs)} {row['kernel']} "
                      f"ok={row['ok']} {row['wall_s']:.1f}s "
                      f"cpu={sum(s['cpu_s'] for s in row['steps']):.1f}s", flush=True)
        wall = time.monotonic() - start  # the last build done (not the pool's shutdown)
    return {"variant": variant, "description": VARIANTS[variant], "wall_s": round(wall, 2),
            "pool_start_s": round(pool_start[0], 2) if pool_start else None,
            "builds": rows, "summary": summarize(rows, wall, args.slots)}


_IMPORT_SCRIPT = r"""
import importlib.machinery, importlib.util, json, sys
import torch  # noqa: F401 - the extensions' libraries
bad = []
for name, path, functions in json.load(sys.stdin):
    try:
        loader = importlib.machinery.ExtensionFileLoader(name, path)
        module = importlib.util.module_from_spec(
            importlib.util.spec_from_file_location(name, path, loader=loader))
        loader.exec_module(module)
        missing = [f for f in functions if not callable(getattr(module, f, None))]
        if module.__name__ != name or missing:
            bad.append(f"{name}: name {module.__name__}, missing {missing}")
    except Exception as exc:  # noqa: BLE001 - reported
        bad.append(f"{name}: {exc.__class__.__name__}: {exc}")
print(json.dumps(bad))
"""


def import_check(variant: dict, specs: list[dict], cache: Path) -> dict:
    """Import every module a variant built (in a fresh interpreter, after torch) and look up
    its bound functions: a module's name and bindings come from its main.cpp object, which
    the harness may have taken from another build (BuildOptions.share_host_objects)."""
    from kernelharness.compilation.buildspec import module_name, so_path

    by_key = {s["key"]: s for s in specs}
    todo = []
    for row in variant["builds"]:
        functions = by_key[row["key"]]["spec"].get("functions") or []
        if row["ok"]:
            todo.append([module_name(row["key"]), str(so_path(cache, row["key"])),
                         list(functions)])
    proc = subprocess.run([sys.executable, "-c", _IMPORT_SCRIPT], input=json.dumps(todo),
                          capture_output=True, text=True, timeout=600, check=False)
    try:
        bad = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        bad = [f"import check failed: {proc.stderr[-1000:]}"]
    return {"modules": len(todo), "imported": len(todo) - len(bad), "problems": bad[:10]}


def warm_page_cache() -> dict:
    """Read once every header and compiler binary the builds use (torch's and CUDA's include
    folders, the host compiler's, nvcc's tools), so that no variant pays for the disk."""
    import subprocess

    from torch.utils import cpp_extension as ce

    start = time.monotonic()
    trees = [Path(p) for p in ce.include_paths()]
    if ce.CUDA_HOME:
        home = Path(ce.CUDA_HOME)
        trees += [home / "include", home / "bin", home / "nvvm"]
    flat = []
    try:
        listing = subprocess.run(["c++", "-xc++", "-E", "-v", "/dev/null"], capture_output=True,
                                 text=True, timeout=60).stderr
        dirs = listing.split("search starts here:")[-1].split("End of search list.")[0].split()
        for folder in map(Path, dirs):
            (flat if str(folder) in ("/usr/include", "/usr/local/include") else trees).append(
                folder)
        compiler = subprocess.run(["c++", "-print-prog-name=cc1plus"], capture_output=True,
                                  text=True, timeout=60).stdout.strip()
        flat.append(Path(compiler))
    except (OSError, subprocess.SubprocessError):
        pass
    files = [f for tree in trees if tree.is_dir() for f in tree.resolve().rglob("*")]
    files += [f for folder in flat for f in ([folder] if folder.is_file()
                                               else folder.glob("*") if folder.is_dir() else [])]
    count = size = 0
    for path in files:
        try:
            if not path.is_file():
                continue
            with open(path, "rb") as handle:
                while chunk := handle.read(1 << 20):
                    size += len(chunk)
            count += 1
        except OSError:
            continue
    return {"files": count, "mb": round(size / 2**20, 1),
            "seconds": round(time.monotonic() - start, 2)}


# ------------------------------------------------------------------ report

def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarize(rows: list[dict], wall: float, slots: int) -> dict:
    per_phase: dict[str, list[float]] = {}
    per_phase_wall: dict[str, list[float]] = {}
    for row in rows:
        totals: dict[str, float] = {}
        walls: dict[str, float] = {}
        for s in row["steps"]:
            totals[s["step"]] = totals.get(s["step"], 0.0) + s["cpu_s"]
            walls[s["step"]] = walls.get(s["step"], 0.0) + s["seconds"]
        for name, value in totals.items():
            per_phase.setdefault(name, []).append(value)
            per_phase_wall.setdefault(name, []).append(walls[name])
    build_cpu = [sum(s["cpu_s"] for s in r["steps"] if s["step"] not in PCH_STEPS)
                 for r in rows]
    all_cpu = sum(sum(v) for v in per_phase.values())
    phases = {}
    for name in sorted(per_phase, key=lambda n: (PHASES.index(n) if n in PHASES else 99, n)):
        values = per_phase[name]
        phases[name] = {"builds": len(values), "cpu_median_s": round(_pct(values, 0.5), 2),
                        "cpu_p90_s": round(_pct(values, 0.9), 2),
                        "cpu_sum_s": round(sum(values), 1),
                        "share": round(sum(values) / all_cpu, 4) if all_cpu else 0.0,
                        "wall_median_s": round(_pct(per_phase_wall[name], 0.5), 2)}
    ok = [r for r in rows if r["ok"]]
    ok_cpu = [c for r, c in zip(rows, build_cpu) if r["ok"]]
    fail_cpu = [c for r, c in zip(rows, build_cpu) if not r["ok"]]
    return {
        "builds": len(rows), "ok": len(ok), "failed": len(rows) - len(ok),
        "wall_s": round(wall, 2),
        "builds_per_min": round(60 * len(rows) / wall, 2) if wall else 0.0,
        "ok_builds_per_min": round(60 * len(ok) / wall, 2) if wall else 0.0,
        "first_done_s": min((r["done_at"] for r in rows), default=None),
        # when the first build started: with --cold-pool, the builders' own start-up
        "first_start_s": round(min((r["done_at"] - r["wall_s"] for r in rows), default=0.0), 2),
        "cpu_s_total": round(all_cpu, 1),
        "pch_cpu_s": round(sum(sum(per_phase.get(n, [])) for n in PCH_STEPS), 1),
        # what the slots could do with the PCH made: slots x 60 / mean CPU-s a build
        "cpu_bound_builds_per_min": round(slots * 60 / statistics.mean(build_cpu), 2)
        if build_cpu and statistics.mean(build_cpu) > 0 else None,
        "build_cpu_s": {"median": round(_pct(build_cpu, 0.5), 2),
                        "p10": round(_pct(build_cpu, 0.1), 2),
                        "p90": round(_pct(build_cpu, 0.9), 2),
                        "max": round(max(build_cpu, default=0.0), 2),
                        "mean": round(statistics.mean(build_cpu), 2) if build_cpu else 0.0},
        "ok_build_cpu_median_s": round(_pct(ok_cpu, 0.5), 2),
        "failed_build_cpu_median_s": round(_pct(fail_cpu, 0.5), 2),
        "phases": phases,
        "tiers": tier_counts(rows),
    }


def tier_counts(rows: list[dict]) -> dict:
    """How many builds compiled each unit with which headers (from the build's notes)."""
    counts: dict[str, int] = {}
    for row in rows:
        notes = (row.get("pch") or "").split(",")
        cuda = next((n for n in notes if n in ("minimal-headers", "light-headers",
                                                 "full-headers")), "as-written")
        host = next((n for n in notes if n.startswith("host:")), "host:as-written")
        prelude = tuple(n for n in notes if n.startswith(("prelude-pch:", "host-object:")))
        for name in (f"cuda:{cuda}", host, *prelude) + (("cuda:slim-ops",)
                                                         if "slim-ops" in notes else ()):
            counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


def pool_note(res: dict) -> str:
    if res.get("pool_start_s") is None:
        return (f" (clock from the pool's start: the first build began at "
                f"{res['summary']['first_start_s']} s)")
    return f" (builders started before the clock, in {res['pool_start_s']} s)"


def markdown(results: list[dict], args) -> str:
    lines = []
    for res in results:
        s = res["summary"]
        lines += [f"### {res['variant']}: {res['description']}", "",
                  (f"{s['builds']} builds ({s['ok']} ok, {s['failed']} failed) in {s['wall_s']} s "
                  f"with {args.workers} builders on {args.slots} slots"
                  f"{pool_note(res)}: "
                  f"**{s['builds_per_min']} builds/min** cold (PCH made in the run, "
                  f"{s['pch_cpu_s']} CPU-s); CPU-bound rate once the PCH exists "
                  f"{s['cpu_bound_builds_per_min']}/min; CPU-s a build (no PCH) "
                  f"median {s['build_cpu_s']['median']}, p10 {s['build_cpu_s']['p10']}, "
                  f"p90 {s['build_cpu_s']['p90']}, max {s['build_cpu_s']['max']} "
                  f"(ok builds {s['ok_build_cpu_median_s']}, failed "
                  f"{s['failed_build_cpu_median_s']}); header tiers {s['tiers']}"),
                  "",
                  "| phase | builds | CPU s median | CPU s p90 | CPU s sum | share | wall median |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for name, p in s["phases"].items():
            lines.append(f"| {name} | {p['builds']} | {p['cpu_median_s']} | {p['cpu_p90_s']} "
                         f"| {p['cpu_sum_s']} | {100 * p['share']:.1f}% | "
                         f"{p['wall_median_s']} |")
        lines.append("")
    if len(results) > 1:
        base = results[0]["summary"]
        lines += ["| variant | builds/min | ratio | CPU-s a build (median) | ratio |",
                  "| --- | --- | --- | --- | --- |"]
        for res in results:
            s = res["summary"]
            r1 = s["builds_per_min"] / base["builds_per_min"] if base["builds_per_min"] else 0
            b, c = base["build_cpu_s"]["median"], s["build_cpu_s"]["median"]
            lines.append(f"| {res['variant']} | {s['builds_per_min']} | {r1:.2f}x | {c} | "
                         f"{(c / b if b else 0):.2f}x |")
        lines.append("")
        for res in results[1:]:
            lines.append(verdicts(results[0], res))
    return "\n".join(lines)


def verdicts(base: dict, other: dict) -> str:
    """Whether two variants agree, build by build, on which kernels build."""
    ok = {r["key"]: r["ok"] for r in base["builds"]}
    common = [r for r in other["builds"] if r["key"] in ok]
    differ = [f"{r['kernel']} ({base['variant']} {ok[r['key']]}, {other['variant']} {r['ok']})"
              for r in common if r["ok"] != ok[r["key"]]]
    return (f"Verdicts, {other['variant']} against {base['variant']}: {len(common)} builds in "
            f"both, {len(differ)} differ" + (": " + "; ".join(differ) if differ else "") + ".")


def main() -> None:

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, required=True,
                        help="real-corpus folder (candidates/, references/) or CUDA-L1 .json")
    parser.add_argument("--limit", type=int, default=None, help="first N candidates")
    parser.add_argument("--stride", type=int, default=1, help="every k-th candidate")
    parser.add_argument("--workers", type=int, default=None,
                        help="builder processes (builds in flight); default twice the slots, "
                             "as the harness runs cuda builds (orchestrator: n_build + n_build)")
    parser.add_argument("--slots", type=int, default=os.cpu_count() or 1, help="CPU slots")
    parser.add_argument("--variants", nargs="+", default=["baseline"], choices=list(VARIANTS))
    parser.add_argument("--budget-s", type=float, default=None,
                        help="per variant: start no build after this many seconds")
    parser.add_argument("--arch", default=os.environ.get("TORCH_CUDA_ARCH_LIST") or None,
                        help="TORCH_CUDA_ARCH_LIST (default: the local GPU's, else 9.0)")
    parser.add_argument("--no-pch", dest="use_pch", action="store_false")
    parser.add_argument("--no-light-headers", dest="light_headers", action="store_false")
    parser.add_argument("--no-warm-page-cache", dest="warm_page_cache", action="store_false",
                        help="leave headers and compilers to be read from disk by the first "
                             "variant")
    parser.add_argument("--import-check", action="store_true",
                        help="import every built module after each variant and look up its "
                             "bound functions (needs torch's real CUDA libraries: the GPU "
                             "machine)")
    parser.add_argument("--cold-pool", action="store_true",
                        help="start the clock before the builder processes are up (sessions "
                             "13-18: every variant's wall then includes about 6-8 s of 32 "
                             "processes starting on 16 cores)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.workers is None:
        args.workers = 2 * args.slots
    if not args.arch:
        from kernelharness.compilation.buildspec import local_cuda_arch

        args.arch = local_cuda_arch() or "9.0"
    os.environ["TORCH_CUDA_ARCH_LIST"] = args.arch
    with tempfile.TemporaryDirectory(prefix="build_breakdown_") as tmp:
        work = Path(tmp)
        _cpu_torch_stand_ins(str(work / "stubs"))
        t0 = time.monotonic()
        items = read_corpus(args.corpus, args.limit, args.stride)
        specs = extract_all(items, work / "extract")
        print(f"{len(items)} candidates, {len(specs)} distinct cuda builds "
              f"(extracted in {time.monotonic() - t0:.1f} s); arch {args.arch}, "
              f"{args.workers} builders, {args.slots} slots", flush=True)
        page_cache = warm_page_cache() if args.warm_page_cache else None
        if page_cache:
            print(f"page cache: read {page_cache['files']} files, {page_cache['mb']} MB, in "
                  f"{page_cache['seconds']} s", flush=True)
        results = []
        for variant in args.variants:  # written after each: a cut-off run keeps what is done
            results.append(run_variant(variant, specs, args, work))
            if args.import_check:
                results[-1]["import_check"] = import_check(results[-1], specs,
                                                           work / f"cache-{variant}")
                print(f"  [{variant}] import check: {results[-1]['import_check']}", flush=True)
            report = markdown(results, args)
            if args.out:
                args.out.mkdir(parents=True, exist_ok=True)
                (args.out / "build_breakdown.json").write_text(json.dumps(
                    {"args": {k: str(v) for k, v in vars(args).items()},
                     "cpu_count": os.cpu_count(), "page_cache": page_cache,
                     "results": results}, indent=1))
                (args.out / "build_breakdown.md").write_text(report + "\n")
    print(report)


if __name__ == "__main__":
    main()
