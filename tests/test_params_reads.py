"""Every stage tracks every params key it reads: the keys its code reads, found by
tests/params_reads.py from `run(args, params)` through the stage's import closure, are all
covered by the keys its DVC stage lists under `params:`, in dvc.yaml and real/dvc.yaml alike
(tests/test_parity.py keeps the Snakemake rule's `tracked(...)` equal to those). A stage that
starts reading another key fails here until both runners track it."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml
from dag_tools import DVC_FILES
from dicepipe.deps import HARNESS_METHOD_FILE
from params_reads import STAR, ParamsReads, covered, dotted, schema_holds

# Never tracked by design: where and how fast harness rows are made (harness.run) and what a
# job asks a cluster for (resources). Changing them re-runs nothing.
NEVER_TRACKED = {("harness", "run"), ("resources",)}
# Reads on a path the stage never takes, each with the reason.
NOT_TAKEN = {
    # stages/rl.load_tasks refuses `source: released` for infill prompts before the
    # released tasks' prompts are rendered from prompt_sources
    "rl_infill": {("prompt_sources", STAR)},
}
# Reads that can only refuse, never change an output: ingest checks a file in an acquired
# folder against its pin (acquisition.verify_placed) before reading it; its output depends
# on the file's content, which both runners track.
REFUSE_ONLY = {"ingest": {("acquire", STAR)}}


def _key(text: str) -> tuple:
    return tuple(STAR if "${" in part else part for part in re.split(r"\.(?![^{]*\})", text))


def dvc_tracking(dvc_yaml: Path) -> dict[str, tuple[str, set[tuple]]]:
    """Stage -> (the dicepipe.stages module its command runs, the params keys it tracks);
    a stage that tracks the whole params.yaml (a `params.yaml:` entry or the file as a dep)
    tracks the empty path, which covers every key."""
    from dicepipe.cli import STAGES

    stages = yaml.safe_load(dvc_yaml.read_text())["stages"]
    out = {}
    for name, spec in stages.items():
        body = spec.get("do", spec)
        command = body["cmd"].split()[1]
        tracked = set()
        for entry in body.get("params", []) or []:
            if isinstance(entry, dict):
                if HARNESS_METHOD_FILE in entry:  # the harness's method version, not params.yaml
                    continue
                tracked |= {()} if "params.yaml" in entry else {_key(k) for k in entry}
            else:
                tracked.add(_key(entry))
        if "params.yaml" in (body.get("deps") or []):
            tracked.add(())
        out[name] = (STAGES[command][0], tracked)
    return out


def untracked_reads(package_dir: Path, dvc_yaml: Path) -> list[str]:
    from dicepipe.config import load_schema

    schema = load_schema()
    scan = ParamsReads(package_dir)
    problems = []
    for stage, (module, tracked) in sorted(dvc_tracking(dvc_yaml).items()):
        allowed = tracked | NEVER_TRACKED | NOT_TAKEN.get(stage, set()) | REFUSE_ONLY.get(stage, set())
        for read in sorted(scan.stage(module)):
            if schema_holds(read, schema) and not covered(read, allowed):
                problems.append(f"{stage}: reads {dotted(read)}, which its dvc.yaml params "
                                f"{sorted(dotted(k) for k in tracked)} do not cover")
    return problems


@pytest.fixture(scope="module")
def shipped_reads(repo_root):
    scan = ParamsReads(repo_root / "workflow" / "dicepipe")
    return {stage: scan.stage(module) for name in DVC_FILES
            for stage, (module, _) in dvc_tracking(repo_root / name).items()}


@pytest.mark.parametrize("dvc_file", DVC_FILES)
def test_every_stage_tracks_every_key_it_reads(repo_root, dvc_file):
    problems = untracked_reads(repo_root / "workflow" / "dicepipe", repo_root / dvc_file)
    assert not problems, "\n".join(problems)


def test_the_scan_sees_what_each_stage_reads(shipped_reads):
    """The scan follows params into resolvers, helpers and objects (so it can miss nothing
    the tests above rely on): a few reads each stage is known to make."""
    expected = {
        "verify": {("verify", "repeats"), ("verify", "protocol"), ("harness", "measure"),
                   ("harness", "run"), ("protocols",)},
        # augment and assemble: the section whole, as a corpus's settings are the section
        # merged with its override (config.corpus_settings)
        "augment": {("augment",), ("augment", "overrides", STAR), ("corpora", STAR, "backend"),
                    ("harness", "measure"), ("protocols",)},
        "assemble": {("assemble",), ("assemble", "overrides", STAR), ("verify", "decision_thresholds"),
                     ("protocols",)},
        # through config.stage_settings, the one resolver
        "sft": {("sft", "defaults"), ("sft", "overrides", STAR), ("scales", STAR, "gpus"),
                ("scales", STAR, "launch"), ("scales", STAR, "model"), ("models", STAR, "kind")},
        "rl_infill": {("rl", "defaults"), ("rl", "stages", "rl_infill"), ("rl", "overrides", STAR),
                      ("harness", "measure"), ("scales", STAR, "backend")},
        "rl_e2e": {("rl", "stages", "rl_e2e"), ("prompt_sources", "release")},
        "evaluate": {("evaluate", "defaults"), ("evaluate", "overrides", STAR),
                     ("evaluate", "fast_p"), ("evaluate", "code_block"), ("baselines", STAR),
                     ("prompt_sources", "kernelbench"), ("harness", "measure")},
        "benchmark": {("benchmarks", STAR, "kind"), ("benchmarks", STAR, "path")},
        "curves": set(),
    }
    for stage, reads in expected.items():
        assert reads <= shipped_reads[stage], (stage, sorted(reads - shipped_reads[stage]))
    # what only its own scale's entries hold is never read for other scales or stages
    assert not [r for r in shipped_reads["sft"] if r[:1] in (("rl",), ("evaluate",))]
    assert ("rl", "stages", "rl_e2e") not in shipped_reads["rl_infill"]
    assert shipped_reads["curves"] == set()


@pytest.mark.parametrize("stage_file, line, key", [
    # a direct read
    ("stages/verify.py", 'log.info("%s", params["augment"]["attempts"])', "augment.attempts"),
    # through a helper of another module, bound to the helper's parameter
    ("stages/assemble.py", 'log.info("%s", corpus_spec(params, args.corpus)["source"])',
     "corpora.*.source"),
    # through the resolver: another section's layers
    ("stages/evaluate.py", 'log.info("%s", stage_settings(params, "sft", scale=args.scale))',
     "sft.defaults"),
])
def test_a_stage_reading_an_untracked_key_fails_the_check(repo_root, tmp_path, stage_file,
                                                           line, key):
    package = tmp_path / "workflow" / "dicepipe"
    shutil.copytree(repo_root / "workflow" / "dicepipe", package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    path = package / stage_file
    text = path.read_text()
    imports = ("    from ..config import corpus_spec, stage_settings\n")
    head, body = text.split("\ndef run(args, params", 1)
    signature, rest = body.split("\n", 1)
    path.write_text(f"{head}\ndef run(args, params{signature}\n{imports}    {line}\n{rest}")
    problems = untracked_reads(package, repo_root / "dvc.yaml")
    assert [p for p in problems if f"reads {key}" in p], problems
