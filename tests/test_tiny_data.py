"""The tiny scale's data: the shipped corpus is what its generator writes, the base model's
pretraining data holds no corpus chain, and nothing the tiny scale trains, pretrains or
selects on is a benchmark task or a benchmark solution.

The held-out rule (data/chains.task_fingerprint): two programs are the same task when the
normalised source (ast.unparse) of their `Model` class and `get_inputs` function is equal;
a solution is the same when its normalised file text is equal."""

from __future__ import annotations

import filecmp
import re
from pathlib import Path

from dicepipe.data.chains import corpus_chains, task_fingerprint
from dicepipe.data.extract import normalise_code
from dicepipe.stages.pretrain_base import RECIPE, pretraining_pairs, write_corpus

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "data/seed/chains"
BENCHMARK = REPO / "data/seed/benchmark"
SOLUTIONS = REPO / "data/baselines/tiny"
FENCED = re.compile(r"```python\n(.*?)```", re.DOTALL)


def benchmark_fingerprints() -> set[str]:
    prints = {task_fingerprint(p.read_text()) for p in BENCHMARK.rglob("*.py")}
    assert None not in prints and len(prints) == len(list(BENCHMARK.rglob("*.py")))
    return prints


def benchmark_solutions() -> set[str]:
    return {normalise_code(p.read_text()) for p in SOLUTIONS.rglob("*.py")}


def corpus_fingerprints() -> set[str]:
    return {task_fingerprint(c.reference()) for c in corpus_chains(RECIPE["corpus_count"], RECIPE["corpus_seed"])}


def programs_in(text: str) -> list[str]:
    """Every fenced program of a prompt or response."""
    return FENCED.findall(text or "")


# A program without either definition has no fingerprint (task_fingerprint returns None):
# such programs (the kernels) skip the parse.
DEFINES_A_TASK = re.compile(r"\bclass\s+Model\b|\bdef\s+get_inputs\b")


def fingerprint(program: str) -> str | None:
    return task_fingerprint(program) if DEFINES_A_TASK.search(program) else None


def leaks(texts, fingerprints: set | None = None) -> list[str]:
    """The programs among `texts` (whole programs or prompts holding fenced ones) that are a
    benchmark task or a benchmark solution. `fingerprints`, when given, collects every
    program's task fingerprint (None left out)."""
    tasks, solutions = benchmark_fingerprints(), benchmark_solutions()
    found = []
    for text in texts:
        for program in programs_in(text) or [text]:
            found_print = fingerprint(program)
            if fingerprints is not None and found_print is not None:
                fingerprints.add(found_print)
            if found_print in tasks or normalise_code(program) in solutions:
                found.append(program[:200])
    return found


def test_shipped_corpus_is_what_the_generator_writes(tmp_path):
    meta = (CORPUS / "meta.yaml").read_text()
    count = int(re.search(r"--corpus-count (\d+)", meta).group(1))
    seed = int(re.search(r"--corpus-seed (\d+)", meta).group(1))
    write_corpus(tmp_path, count, seed)
    for sub in ("reference", "kernels"):
        names = sorted(p.name for p in (CORPUS / sub).glob("*.py"))
        assert names == sorted(p.name for p in (tmp_path / sub).glob("*.py"))
        assert filecmp.cmpfiles(CORPUS / sub, tmp_path / sub, names, shallow=False)[0] == names
    assert (tmp_path / "meta.yaml").read_text().split("\n", 1)[1] == meta.split("\n", 1)[1]


def test_pretraining_data_holds_no_corpus_chain_and_no_benchmark_task():
    recipe = dict(RECIPE, chains=300)
    pairs = pretraining_pairs(recipe)
    corpus_refs = corpus_fingerprints()
    seen = set()
    for prompt, response in pairs:
        target = programs_in(prompt)[0 if "A solution file" in prompt else -1]
        assert "def forward" in target and "ModelNew" not in target
        seen.add(task_fingerprint(target))
    assert len(seen) == len(pairs) and not seen & corpus_refs
    assert not leaks(text for pair in pairs for text in pair)


def test_corpus_and_its_prompts_hold_no_benchmark_task_or_solution():
    files = [p.read_text() for p in CORPUS.rglob("*.py")]
    assert files and not leaks(files)


def test_the_rule_catches_a_benchmark_task_and_a_solution_in_any_wording():
    task = next(BENCHMARK.rglob("*.py")).read_text()
    reworded = "# a comment\n" + task.replace("    ", "  ") + "\n\n"
    assert leaks([reworded])
    solution = next(SOLUTIONS.rglob("*.py")).read_text()
    assert leaks([f"Answer:\n\n```python\n{solution}```\n"])


def test_the_shipped_base_was_pretrained_on_data_the_generator_makes_and_that_holds_no_task():
    """Each run of data/base/tiny/PRETRAINED.json that today's generator can make again (its
    recipe gives the recorded data digest) is checked whole by the held-out rule; the last run,
    the one whose weights ship, must be one of them. Runs of an earlier generator say so in
    their note."""
    import json

    from dicepipe.stages.pretrain_base import data_digest

    stages = json.loads((REPO / "data/base/tiny/PRETRAINED.json").read_text())["stages"]
    corpus_refs = corpus_fingerprints()
    checked = []
    for i, stage in enumerate(stages):
        pairs = pretraining_pairs(dict(RECIPE, **stage["recipe"]))
        if data_digest(pairs) != stage["data_sha256"]:
            assert "earlier" in stage.get("note", ""), f"run {i + 1} is neither regenerable nor noted"
            continue
        refs: set = set()  # every program's fingerprint: the references' (kernels have none)
        assert not leaks((text for pair in pairs for text in pair), refs), f"run {i + 1} holds a benchmark task"
        assert len(refs) >= len(pairs) and not refs & corpus_refs, f"run {i + 1} pretrained on a corpus chain"
        checked.append(i)
    assert checked and checked[-1] == len(stages) - 1
