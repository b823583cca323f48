"""Build the Snakemake and DVC DAGs of a workspace as comparable records (for the parity
and rerun tests). A record: stage name (<rule>@<key>), cmd, deps, outs, params keys."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from dicepipe.deps import HARNESS_METHOD_FILE, HARNESS_METHOD_KEY

WORKFLOW_FILES = ["Snakefile", "dvc.yaml", "real", "params.yaml", ".dvcignore", "workflow", "profiles",
                  "envs", "data/kernelbench", "data/baselines", "data/base",
                  "harness"]
# The pipeline's DVC files (dvc.yaml's header): the default chain, which a target-less
# `dvc repro` runs, and the real scales, addressed as real/dvc.yaml:<stage>.
DEFAULT_DVC_FILE = "dvc.yaml"
REAL_DVC_FILE = "real/dvc.yaml"
DVC_FILES = (DEFAULT_DVC_FILE, REAL_DVC_FILE)
# DVC's first stage validates params.yaml before any stage deletes its outputs (the Snakefile
# validates while parsing, so Snakemake needs no such job); the root stages depend on it.
DVC_ONLY_STAGES = {"check_params"}
DVC_ONLY_DEPS = frozenset({"data/checked/params.json"})


@dataclass(frozen=True)
class StageRecord:
    name: str
    cmd: str
    deps: frozenset
    outs: frozenset
    params: frozenset
    # DVC only: the file holding the stage and the address DVC names it by
    # (`evaluate@tiny`, `real/dvc.yaml:evaluate@8b`)
    dvcfile: str = ""
    address: str = ""


def copy_workflow(repo_root: Path, dest: Path) -> Path:
    """A copy of the workflow definition (no data) where every corpus source exists."""
    for name in WORKFLOW_FILES:
        src = repo_root / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    import yaml

    params = yaml.safe_load((dest / "params.yaml").read_text())
    acquired = set(params.get("acquire", {}))
    for corpus in params["corpora"].values():
        source = corpus["source"]
        # a hub id, or a file the acquire stage fetches: nothing is placed by hand
        if source["kind"] == "hub" or acquired_folder(source["path"], acquired) != source["path"]:
            continue
        path = dest / source["path"]
        if source["kind"] == "pairs_dir":
            (path / "reference").mkdir(parents=True, exist_ok=True)
            (path / "kernels").mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("[]")
    for bench in params.get("benchmarks", {}).values():
        if (dest / bench["path"]).exists() or acquired_folder(bench["path"], acquired) != bench["path"]:
            continue
        if bench["kind"] == "kernelbench_dir":
            (dest / bench["path"] / "level1").mkdir(parents=True, exist_ok=True)
        elif bench["kind"] == "parquet":
            (dest / bench["path"]).parent.mkdir(parents=True, exist_ok=True)
            (dest / bench["path"]).write_text("")
    return dest


def acquired_folder(path: str, acquired) -> str:
    """The acquire output (data/external/<name>) a path lies in, else the path: Snakemake's
    input for a file inside an acquired folder is the folder (common.smk acquired_input)."""
    parts = Path(path).parts
    if len(parts) >= 3 and parts[:2] == ("data", "external") and parts[2] in acquired:
        return str(Path(*parts[:3]))
    return path


@contextlib.contextmanager
def _cwd(path: Path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def _stage_key(wildcards: dict) -> str:
    if "scale" in wildcards:
        return wildcards["scale"]
    if "shard" in wildcards:
        return f"{wildcards['corpus']}-{wildcards['shard']}"
    if "benchmark" in wildcards:
        return wildcards["benchmark"]
    if "external" in wildcards:
        return wildcards["external"]
    return wildcards["corpus"]


def snakemake_records(workdir: Path, targets: list[str]) -> dict[str, StageRecord]:
    """Every job Snakemake would run (forceall) for `targets`."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import DAGSettings, OutputSettings, ResourceSettings

    records = {}
    with _cwd(workdir), contextlib.redirect_stderr(io.StringIO()):
        with SnakemakeApi(OutputSettings()) as api:
            wf = api.workflow(resource_settings=ResourceSettings(cores=1),
                              snakefile=Path("Snakefile"), workdir=Path("."))
            dag_api = wf.dag(DAGSettings(targets=set(targets), forceall=True))
            workflow = dag_api.workflow_api._workflow
            workflow._prepare_dag(forceall=True, ignore_incomplete=True, lock_warn_only=True, nolock=True)
            workflow._build_dag()
            for job in workflow.dag.jobs:
                if job.rule.name == "all":
                    continue
                name = f"{job.rule.name}@{_stage_key(dict(job.wildcards.items()))}"
                tracked = getattr(job.params, "tracked", {}) or {}
                records[name] = StageRecord(
                    name=name,
                    cmd=" ".join(job.shellcmd.split()),
                    deps=frozenset(str(p) for p in job.input),
                    outs=frozenset(str(p) for p in job.output),
                    params=frozenset(tracked),
                )
    return records


def dvc_records(workdir: Path) -> dict[str, StageRecord]:
    """Every stage of every dvc.yaml in `workdir`, by name (`evaluate@8b`, whichever file
    holds it), its paths relative to the repository root (a stage's own are relative to its
    wdir: `..` in real/dvc.yaml)."""
    from dvc.dependency.param import ParamsDependency
    from dvc.repo import Repo

    records = {}
    with _cwd(workdir):
        repo = Repo(".")
        root = Path(repo.root_dir)

        def rel(path: str) -> str:
            return Path(os.path.relpath(path, root)).as_posix()

        for stage in repo.index.stages:
            params, deps = set(), set()
            for dep in stage.deps:
                if isinstance(dep, ParamsDependency):
                    # params.yaml's keys, and the harness's method version read from its file
                    # (the key Snakemake tracks it under: dicepipe.deps.HARNESS_METHOD_KEY)
                    if rel(dep.fs_path) == HARNESS_METHOD_FILE:
                        assert list(dep.params) == ["METHOD_VERSION"], (stage.addressing, dep.params)
                        params.add(HARNESS_METHOD_KEY)
                        continue
                    assert rel(dep.fs_path) == "params.yaml", (stage.addressing, dep.fs_path)
                    params.update(dep.params)
                else:
                    deps.add(rel(dep.fs_path))
            assert stage.name not in records, f"{stage.addressing}: a second stage of that name"
            records[stage.name] = StageRecord(
                name=stage.name,
                cmd=" ".join(stage.cmd.split()),
                deps=frozenset(deps),
                outs=frozenset(rel(o.fs_path) for o in stage.outs),
                params=frozenset(params),
                dvcfile=rel(stage.path),
                address=stage.addressing,
            )
        repo.close()
    return records


def dvc_plan(workdir: Path, targets: list[str] | None = None, glob: bool = False) -> list[str]:
    """The stages `dvc repro [targets]` would reproduce, in order, by address: DVC's own
    planning (dvc.repo.reproduce), which with no target collects ./dvc.yaml's stages, as a
    target-less `dvc repro` and `dvc exp run` do, and adds what they depend on."""
    from dvc.repo import Repo
    from dvc.repo.reproduce import collect_stages, get_active_graph, plan_repro

    with _cwd(workdir), Repo(".") as repo:
        stages = collect_stages(repo, targets or [DEFAULT_DVC_FILE], glob=glob)
        return [s.addressing for s in plan_repro(get_active_graph(repo.index.graph), stages)]


def deps_match(snake_inputs: frozenset, dvc_deps: frozenset) -> list[str]:
    """Differences between Snakemake's file inputs and DVC's deps, where a DVC folder dep
    stands for the files under it. Returns human-readable problems (empty = equal)."""
    problems = []

    def covered(path, dep):
        return path == dep or path.startswith(dep.rstrip("/") + "/")

    for path in sorted(snake_inputs):
        if not any(covered(path, dep) for dep in dvc_deps):
            problems.append(f"Snakemake input {path} is not a DVC dep")
    for dep in sorted(dvc_deps):
        if not any(covered(path, dep) for path in snake_inputs):
            problems.append(f"DVC dep {dep} is not a Snakemake input")
    return problems


def stage_module_of(cmd: str) -> str:
    """The dicepipe.stages module a stage command runs (`dicepipe verify-gather ...`)."""
    from dicepipe.cli import STAGES

    words = cmd.split()
    assert words[0] == "dicepipe", cmd
    return STAGES[words[1]][0]


def closure_problems(records: dict[str, StageRecord], package_dir: Path) -> list[str]:
    """Package files a stage runs (its import closure) that its DVC deps do not cover."""
    from dicepipe.deps import stage_code, uncovered

    root = package_dir.parent.parent
    problems = []
    for name, record in sorted(records.items()):
        files = [str(Path(f).relative_to(root))
                 for f in stage_code(stage_module_of(record.cmd), package_dir)]
        problems += [f"{name}: runs {f}, which its DVC deps do not cover"
                     for f in uncovered(files, sorted(record.deps))]
    return problems
