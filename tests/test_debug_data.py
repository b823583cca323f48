"""The debug scale's shipped inputs, checked on the CPU: its CUDA corpus is what the generator
writes and holds no chain its base was pretrained on and no benchmark task; its base is the
tiny base in SDAR's layout and loads through the SDAR path with the same outputs; its
benchmark subset and reference copies are the shipped KernelBench Parquet's."""

from __future__ import annotations

import filecmp
import json
import re
from pathlib import Path

import pytest
from dicepipe.data.chains import chain_key, corpus_chains, task_fingerprint

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "data/debug/chains"
BASE = REPO / "data/base/debug"


def _corpus_args() -> tuple[int, int]:
    meta = (CORPUS / "meta.yaml").read_text()
    return (int(re.search(r"--corpus-count (\d+)", meta).group(1)),
            int(re.search(r"--corpus-seed (\d+)", meta).group(1)))


def test_the_debug_corpus_is_what_the_generator_writes(tmp_path):
    from dicepipe.stages.pretrain_base import write_corpus

    count, seed = _corpus_args()
    write_corpus(tmp_path, count, seed, backend="cuda", exclude_base="data/base/tiny")
    for sub in ("reference", "kernels"):
        names = sorted(p.name for p in (CORPUS / sub).glob("*.py"))
        assert len(names) == count
        assert filecmp.cmpfiles(CORPUS / sub, tmp_path / sub, names, shallow=False)[0] == names
    assert (tmp_path / "meta.yaml").read_text().split("\n", 1)[1] == (CORPUS / "meta.yaml").read_text().split("\n", 1)[1]


def _steps_of(reference: str) -> str:
    """A chain reference's forward body (its steps and constants, not its shape)."""
    return reference.split("def forward(self, x):\n", 1)[1].split("        return", 1)[0]


def test_the_debug_corpus_is_held_out_from_its_base_and_from_kernelbench():
    """No chain of the shipped corpus (its reference files, read as they are) is one the base
    (data/base/tiny's weights) was pretrained on in either of its runs, nor of the tiny
    corpus; none is a task of the shipped KernelBench."""
    import pyarrow.parquet as pq
    from dicepipe.data.chains import pretraining_chains
    from dicepipe.stages.pretrain_base import RECIPE

    shipped = {_steps_of(p.read_text()) for p in (CORPUS / "reference").glob("*.py")}
    assert len(shipped) == _corpus_args()[0]
    stages = json.loads((REPO / "data/base/tiny/PRETRAINED.json").read_text())["stages"]
    seen = set()
    for stage in stages:
        recipe = {**RECIPE, **stage["recipe"]}
        tiny_corpus = corpus_chains(recipe["corpus_count"], recipe["corpus_seed"])
        seen |= {_steps_of(c.reference()) for c in tiny_corpus}
        seen |= {_steps_of(c.reference()) for c in pretraining_chains(
            recipe["chains"], recipe["chain_seed"], {chain_key(c) for c in tiny_corpus}, recipe["max_chain_steps"])}
    assert len(seen) > 70_000 and not shipped & seen
    kernelbench = {task_fingerprint(code) for code in
                   pq.read_table(REPO / "data/kernelbench/kernelbench_levels_1-3.parquet", columns=["code"])
                   .column("code").to_pylist()}
    assert not {task_fingerprint(p.read_text()) for p in (CORPUS / "reference").glob("*.py")} & kernelbench


def test_the_cuda_kernel_computes_the_cpu_kernels_loop_body():
    """The two forms differ only around the loop body, so what the base learned in C++ is the
    body of the CUDA kernel it is asked for."""
    def body(code: str) -> list[str]:
        lines = code.splitlines()
        start = next(i for i, line in enumerate(lines) if line.strip() == "float v = px[i];")
        end = next(i for i, line in enumerate(lines) if "po[i] = " in line)
        return lines[start:end + 1]

    for chain in corpus_chains(4, 3):
        cuda = chain.kernel(backend="cuda")
        assert body(cuda) == body(chain.kernel()) and "__global__" in cuda and "cuda_sources=" in cuda
    with pytest.raises(ValueError, match="backend"):
        chain.kernel(backend="metal")


def test_the_debug_base_is_the_tiny_base_in_sdars_layout(tmp_path):
    from dicepipe.stages.export_sdar import export

    export(REPO / "data/base/tiny", tmp_path / "out",
           "dicepipe export-sdar --model data/base/tiny --out data/base/debug --link-weights", link_weights=True)
    assert (BASE / "model.safetensors").is_symlink()  # the tiny base's weights, not a second copy
    assert (BASE / "model.safetensors").resolve() == (REPO / "data/base/tiny/model.safetensors").resolve()
    names = sorted(p.name for p in BASE.iterdir())
    assert names == sorted(p.name for p in (tmp_path / "out").iterdir())
    assert filecmp.cmpfiles(BASE, tmp_path / "out", names, shallow=False)[0] == names
    config = json.loads((BASE / "config.json").read_text())
    assert config["model_type"] == "sdar" and config["architectures"] == ["SDARForCausalLM"]
    assert (config["block_size"], config["mask_token_id"]) == (4, 3)
    assert not (BASE / "block_diffusion.json").exists()  # so loading takes the SDAR path


def test_the_debug_base_loads_as_sdar_with_the_tiny_bases_outputs(params):
    import torch
    from dicepipe.model.loading import load_checkpoint, load_saved
    from dicepipe.model.tokenizer import chat_format

    spec = params["models"][params["scales"]["debug"]["model"]]
    assert spec["kind"] == "sdar"
    sdar = load_checkpoint(spec, "sdar-debug", dtype=torch.float32)
    tiny = load_saved(REPO / "data/base/tiny", dtype=torch.float32)
    assert (sdar.settings.block_size, sdar.settings.mask_token_id, sdar.settings.stop_token_ids) == (
        tiny.settings.block_size, tiny.settings.mask_token_id, tiny.settings.stop_token_ids)
    assert sdar.tokenizer.convert_ids_to_tokens(spec["mask_token_id"]) == "<|MASK|>"
    assert chat_format(sdar.tokenizer).prompt_prefix.startswith("<|im_start|>user")
    ids = torch.arange(5, 70).unsqueeze(0)
    with torch.no_grad():
        assert torch.equal(sdar.model(ids).logits, tiny.model(ids).logits)


def test_the_debug_reference_copies_are_the_subsets_references(params):
    from dicepipe.data.benchmark import load_benchmark, reference_copy

    tasks = load_benchmark(params["benchmarks"]["kernelbench-debug"], REPO).to_pylist()
    assert sorted({t["level"] for t in tasks}) == [1, 2, 3]
    folder = REPO / "data/baselines/debug/reference_copies"
    files = sorted(folder.glob("*.py"))
    assert len(files) == len(tasks)
    for task in tasks:
        path = folder / f"level_{task['level']}_problem_{task['problem_id']}_sample_0_kernel.py"
        assert path.read_text() == reference_copy(task["reference_code"])


def _input_elements(code: str) -> int | None:
    """Elements of a task's get_inputs() tensors, built on the meta device (no memory)."""
    import torch

    namespace: dict = {}
    try:
        with torch.device("meta"):
            exec(compile(code, "<task>", "exec"), namespace)  # noqa: S102 -- the shipped Parquet's tasks
            inputs = namespace["get_inputs"]()
    except Exception:  # noqa: BLE001 - a task that cannot build on meta does not qualify
        return None
    return sum(x.numel() for x in inputs if isinstance(x, torch.Tensor))


def test_the_debug_subset_is_each_levels_two_shortest_prompts_with_small_inputs(params):
    """benchmarks.kernelbench-debug is the rule its comment states, recomputed from the
    Parquet: per level, the two tasks with the fewest prompt tokens (the debug tokenizer, the
    debug scale's evaluation wording, the chat template's generation prompt) among those whose
    inputs hold at most 64M elements. Longer prompts lie past what the debug model has seen."""
    import pyarrow.parquet as pq
    from dicepipe.config import stage_settings
    from dicepipe.data.prompt_sources import evaluation_prompt
    from transformers import AutoTokenizer

    wording = stage_settings(params, "evaluate", scale="debug")["prompt"]
    tokenizer = AutoTokenizer.from_pretrained(BASE)
    section = params["benchmarks"]["kernelbench-debug"]
    ranked: dict[int, list] = {}
    for task in pq.read_table(REPO / section["path"]).to_pylist():
        elements = _input_elements(task["code"])
        if elements is None or elements > 64 * 2**20:
            continue
        chat = [{"role": "user", "content": evaluation_prompt(wording, params, task["code"], "cuda")}]
        text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        ranked.setdefault(task["level"], []).append(
            (len(tokenizer(text)["input_ids"]), task["problem_id"]))
    chosen = [f"L{level}/{pid}" for level in sorted(ranked) for _, pid in sorted(ranked[level])[:2]]
    assert section["tasks"] == chosen
