"""The benchmark stage (shipped suite, the shared KernelBench parquet, task subsets), folder
baselines in both layouts, and `dicepipe evaluate` on a tiny model with a causal
transformers baseline and a folder baseline with a known answer (copies of the reference)."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from dicepipe.cli import main
from dicepipe.data.benchmark import load_benchmark, reference_copy
from dicepipe.errors import SourceError
from dicepipe.evaluation.kernel_files import kernel_file_name, read_folder, write_reference_copies


def test_benchmark_stage_on_the_shipped_suite(repo_root, tmp_path, monkeypatch):
    monkeypatch.chdir(repo_root)
    out = tmp_path / "seed.parquet"
    assert main(["benchmark", "--name", "seed", "--out", str(out)]) == 0
    rows = pq.read_table(out).to_pylist()
    assert [r["level"] for r in rows].count(1) == 5 and len(rows) == 12
    assert {r["version"] for r in rows} == {"seed"}
    assert rows[0]["task_id"] == "L1/1_Sigmoid"
    first = out.read_bytes()
    assert main(["benchmark", "--name", "seed", "--out", str(out)]) == 0
    assert out.read_bytes() == first  # byte-identical on a re-run


def test_task_subset_and_unknown_tasks(repo_root):
    spec = {"kind": "kernelbench_dir", "path": str(repo_root / "data/seed/benchmark"),
            "levels": [1, 2, 3], "tasks": ["L1/1_Sigmoid", "2_Tanh", "L3/2"], "version": "v"}
    table = load_benchmark(spec)
    assert table.column("task_id").to_pylist() == ["L1/1_Sigmoid", "L1/2_Tanh",
                                                   "L3/2_PreNorm_Transformer_Block"]
    with pytest.raises(SourceError, match="L9/1"):
        load_benchmark(dict(spec, tasks=["L9/1"]))


def test_benchmark_from_the_shared_kernelbench_parquet(kernelbench_parquet):
    spec = {"kind": "parquet", "path": str(kernelbench_parquet), "levels": [1, 3],
            "version": "423217d"}
    table = load_benchmark(spec)
    assert table.num_rows == 150
    assert set(table.column("version").to_pylist()) == {"423217d"}
    subset = load_benchmark(dict(spec, tasks=["L1/19", "L3/1"]))
    assert subset.column("name").to_pylist()[0] == "19_ReLU"


def test_reference_copy_renames_every_use_of_model():
    code = "class Model(nn.Module):\n    def __init__(self):\n        super(Model, self).__init__()\n"
    copied = reference_copy(code)
    assert "class ModelNew(nn.Module)" in copied and "super(ModelNew, self)" in copied
    assert reference_copy(copied) == copied  # ModelNew is left alone


def test_folder_baselines_in_both_layouts(repo_root, tmp_path):
    tasks = load_benchmark({"kind": "kernelbench_dir", "path": str(repo_root / "data/seed/benchmark"),
                            "levels": [1, 2]}).to_pylist()
    kb = tmp_path / "kb"
    write_reference_copies(tasks[:3], kb)
    (kb / kernel_file_name(1, 1, 1)).write_text("# second sample of task 1\n")
    found = read_folder(kb, tasks, tmp_path)
    assert len(found) == 2 * len(tasks)  # two samples per task, the folder's maximum
    by_key = {(c.task_id, c.sample): c for c in found}
    assert by_key[("L1/1_Sigmoid", 1)].code.startswith("# second")
    assert by_key[("L1/2_Tanh", 1)].note == "missing_file" and by_key[("L1/2_Tanh", 1)].code is None
    assert by_key[("L1/1_Sigmoid", 0)].kernel_path == "kb/level_1_problem_1_sample_0_kernel.py"
    simple = tmp_path / "simple"
    (simple / "level2").mkdir(parents=True)
    (simple / "level2" / "1_Matmul_Sigmoid_Sum.py").write_text("# kernel\n")
    (simple / "level2" / "notes.py").write_text("# no such task\n")
    found = read_folder(simple, tasks, tmp_path)
    assert [c.task_id for c in found if c.code] == ["L2/1_Matmul_Sigmoid_Sum"]
    with pytest.raises(SourceError, match="no kernel file"):
        read_folder(tmp_path / "kb" / "..", tasks[3:3], tmp_path)


def _save_causal_baseline(folder: Path) -> None:
    """A tiny GPT-2 with a character tokenizer and no chat template: a plain causal LM."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<eos>": 1, **{chr(c): i + 2 for i, c in enumerate(range(32, 127))},
             "\n": 97}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>").save_pretrained(folder)
    config = GPT2Config(vocab_size=len(vocab), n_positions=16384, n_embd=16, n_layer=1, n_head=2,
                        eos_token_id=1, bos_token_id=1)
    GPT2LMHeadModel(config).save_pretrained(folder)


def _save_tiny_block_model(folder: Path, repo_root: Path) -> None:
    from dicepipe.model.loading import build_tiny, save_model
    from dicepipe.model.tokenizer import train_tiny_tokenizer

    texts = [p.read_text() for p in sorted((repo_root / "data/seed/corpus").rglob("*.py"))]
    spec = {"kind": "tiny", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 400,
            "max_position_embeddings": 8192, "block_size": 4, "seed": 0}
    save_model(folder, build_tiny(spec, train_tiny_tokenizer(texts, 400)))


def _read_csv(path: Path) -> list[dict]:
    with open(path) as fh:
        return list(csv.DictReader(fh))


def _scripted_model(monkeypatch, author) -> None:
    """The evaluated model decodes through a scripted author (tests/scripted_policy.py) in
    place of its Decoder, the interface generation calls; baselines load as they are."""
    from dicepipe.model import generate
    from scripted_policy import ScriptedDecoder

    real_load = generate.load_generator

    def load_generator(model_ref, name, *args, **kwargs):
        gen = real_load(model_ref, name, *args, **kwargs)
        if name == "model":
            gen.decoder = ScriptedDecoder(author, gen.tokenizer, gen.settings)
        return gen

    monkeypatch.setattr(generate, "load_generator", load_generator)


@pytest.mark.slow
def test_evaluate_stage_with_model_and_folder_baselines(repo_root, tmp_path, monkeypatch, build_cache_dir):
    """The model writes, per task, two samples (tests/scripted_policy.py): for 1_Sigmoid a real
    kernel and one that compiles but is wrong, for L2/3 prose without code."""
    import torch
    from scripted_policy import (NO_CODE, RIGHT, WRONG_VALUES, ScriptedAuthor, answer_kind,
                                 sigmoid_kernel, sigmoid_reference)

    torch.manual_seed(0)
    params = yaml.safe_load((repo_root / "params.yaml").read_text())
    params["harness"]["measure"].update(correct_trials=2, warmup_trials=1, timing_trials=10,
                                        timing_trials_cpu=10)
    params["harness"]["run"]["cache_dir"] = str(build_cache_dir)
    params["benchmarks"]["seed"].update(path=str(repo_root / "data/seed/benchmark"),
                                        tasks=["L1/1_Sigmoid", "L2/3"])
    params["evaluate"]["overrides"]["tiny"].update(max_new_tokens=1024, samples=2, temperature=1.0)
    params["evaluate"]["pass_k"] = [1, 2]
    # inside scales.tiny.baselines (data/baselines/tiny), the folder evaluate@tiny tracks
    home = params["scales"]["tiny"]["baselines"]
    params["baselines"]["tiny"] = [{"name": "gpt2", "model": f"{home}/gpt2"},
                                   {"name": "copies", "folder": f"{home}/copies"}]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    monkeypatch.chdir(tmp_path)
    _save_tiny_block_model(tmp_path / "models/sft/tiny", repo_root)
    _save_causal_baseline(tmp_path / home / "gpt2")
    assert main(["benchmark", "--name", "seed", "--out", "data/benchmark/seed.parquet"]) == 0
    tasks = pq.read_table("data/benchmark/seed.parquet").to_pylist()
    layer_norm_relu = next(t["reference_code"] for t in tasks if t["task_id"].startswith("L2/3"))
    _scripted_model(monkeypatch, ScriptedAuthor({sigmoid_reference(): (sigmoid_kernel(), [RIGHT, WRONG_VALUES]),
                                                 layer_norm_relu: (None, [NO_CODE])}))
    write_reference_copies(tasks, tmp_path / home / "copies")
    args = ["evaluate", "--scale", "tiny", "--model", "models/sft/tiny",
            "--benchmark", "data/benchmark/seed.parquet", "--out-dir", "results/kernelbench_tiny",
            "--summary", "results/kernelbench_tiny.csv",
            "--compare", "results/kernelbench_compare_tiny.csv", "--metrics", "metrics/evaluate/tiny"]
    assert main(args) == 0
    summary = _read_csv(tmp_path / "results/kernelbench_tiny.csv")
    assert [r["level"] for r in summary] == ["1", "2", "all"]
    assert summary[-1]["samples_per_task"] == "2" and summary[-1]["reference_failed"] == "0"
    generations = pq.read_table("results/kernelbench_tiny/generations.parquet").to_pylist()
    assert len(generations) == 4 and all(g["new_tokens"] <= 1024 and g["stopped"] for g in generations)
    assert [(g["task_id"], answer_kind(g["text"])) for g in generations] == [
        ("L1/1_Sigmoid", RIGHT), ("L1/1_Sigmoid", WRONG_VALUES), ("L2/3_LayerNorm_ReLU_Scale", NO_CODE),
        ("L2/3_LayerNorm_ReLU_Scale", NO_CODE)]
    # the model's kernels are scored: Exec counts the right one of Sigmoid's two samples
    model = {r["level"]: r for r in summary}
    for verdict in ("plain", "robust"):
        assert [model[level][f"kernelbench.{verdict}.exec"] for level in ("1", "2", "all")] == [
            "0.5", "0", "0.25"], verdict
    compare = _read_csv(tmp_path / "results/kernelbench_compare_tiny.csv")
    assert [(r["system"], r["level"]) for r in compare][:3] == [("model", "1"), ("gpt2", "1"), ("copies", "1")]
    copies = {r["level"]: r for r in _read_csv(tmp_path / "results/kernelbench_tiny/baselines/copies.csv")}
    # a copy of the reference: correct under the plain verdict, never robust (no kernel)
    assert copies["all"]["kernelbench.plain.exec"] == "1"
    assert copies["all"]["kernelbench.robust.exec"] == "0"
    per_task = _read_csv(tmp_path / "results/kernelbench_tiny/baselines/copies/tasks.csv")
    assert all("no_kernel" in row["flags"] for row in per_task)
    assert all(row["speedup_median"] for row in per_task)
    assert (tmp_path / "results/kernelbench_tiny/baselines/gpt2/tasks.csv").is_file()
    for name in ("metrics.json", "levels.png", "speedups.png"):
        assert (tmp_path / "metrics/evaluate/tiny" / name).is_file()
    assert b"Software" not in (tmp_path / "metrics/evaluate/tiny/levels.png").read_bytes()
    assert str(tmp_path).encode() not in (tmp_path / "results/kernelbench_tiny/tasks.csv").read_bytes()
    shutil.rmtree(tmp_path / "models")


def test_hub_benchmark_reads_each_level_split(monkeypatch):
    """kind: hub loads split level_<L> of the dataset id at the pinned revision (no network:
    datasets.load_dataset is replaced by the published layout's rows)."""
    import datasets

    calls = []

    def fake_load(dataset_id, split, revision=None):
        calls.append((dataset_id, split, revision))
        level = int(split.split("_")[1])
        return [{"code": f"# level {level} problem {i}\n", "level": level, "name": f"{i}_Op{i}",
                 "problem_id": i} for i in (2, 1)]

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    table = load_benchmark({"kind": "hub", "path": "ScalingIntelligence/KernelBench",
                            "levels": [1, 2], "revision": "abc123", "version": "hub-abc123"})
    assert calls == [("ScalingIntelligence/KernelBench", "level_1", "abc123"),
                     ("ScalingIntelligence/KernelBench", "level_2", "abc123")]
    assert table.column("task_id").to_pylist() == ["L1/1_Op1", "L1/2_Op2", "L2/1_Op1", "L2/2_Op2"]
    assert set(table.column("version").to_pylist()) == {"hub-abc123"}


def test_generation_resumes_from_its_journal(repo_root, tmp_path):
    """Finished batches are journaled; a second run with the same journal decodes nothing."""
    from dicepipe.config import schema_defaults
    from dicepipe.model.generate import GenerationSettings, generate_texts, load_generator

    _save_tiny_block_model(tmp_path / "m", repo_root)
    settings = GenerationSettings.from_params(
        {**schema_defaults("evaluate", "defaults"), "max_new_tokens": 8, "batch_size": 2,
         "dtype": "fp32", "compile": False}, "test")
    gen = load_generator(str(tmp_path / "m"), "m", settings)
    prompts = ["add two tensors", "relu", "softmax over rows"]
    journal = tmp_path / "gen.jsonl"
    first = generate_texts(gen, prompts, settings, progress=False, journal=journal)
    assert len(journal.read_text().splitlines()) == 3

    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded although every batch is in the journal")

    gen.decoder.generate = no_decoding
    assert generate_texts(gen, prompts, settings, progress=False, journal=journal) == first


def test_shipped_tiny_baselines_have_known_answers(repo_root, params):
    """data/baselines/tiny: the reference copies are exactly what write_reference_copies
    writes for the seed suite (they cannot drift from it), and the hand-written kernels
    cover three tasks, the rest counted as missing files."""
    tasks = load_benchmark({"kind": "kernelbench_dir", "path": str(repo_root / "data/seed/benchmark"),
                            "levels": [1, 2, 3]}).to_pylist()
    folders = {b["name"]: repo_root / b["folder"] for b in params["baselines"]["tiny"]}
    assert set(folders) == {"reference_copies", "seed_kernels"}
    for folder in folders.values():  # tracked: inside the scale's data/baselines folder
        assert folder.is_relative_to(repo_root / "data/baselines/tiny") and folder.is_dir()
    shipped = folders["reference_copies"]
    expected = {kernel_file_name(t["level"], t["problem_id"], 0): reference_copy(t["reference_code"])
                for t in tasks}
    assert {p.name: p.read_text() for p in shipped.glob("*.py")} == expected
    kernels = read_folder(folders["seed_kernels"], tasks, repo_root)
    with_code = sorted(c.task_id for c in kernels if c.code is not None)
    assert with_code == ["L1/1_Sigmoid", "L1/3_Max_reduction_over_a_dimension",
                         "L2/4_Hardswish_Residual_Clamp"]
    assert all(c.note == "missing_file" for c in kernels if c.code is None)
    assert all("load_inline" in c.code and "class ModelNew" in c.code for c in kernels if c.code)
