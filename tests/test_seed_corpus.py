"""The shipped seed corpus and benchmark suite (data/seed/): layout, format and correctness.

Static checks parse files only; the references (pure PyTorch) also run once. The one slow test
builds a few kernels with load_inline and compares them with their references.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

SEED = Path(__file__).resolve().parent.parent / "data" / "seed"
CORPUS = SEED / "corpus"
BENCHMARK = SEED / "benchmark"
BENCHMARK_NAME = re.compile(r"^([1-9][0-9]*)_([A-Za-z0-9][A-Za-z0-9_]*)\.py$")
REQUIRED_CFLAGS = ["-O3", "-fopenmp"]
REQUIRED_LDFLAGS = ["-fopenmp"]
# Pairs the slow test builds: one with the shared fast_exp helper, one taking a list of
# tensors, one with an int64 input and a 0-d output.
BUILT_PAIRS = ["swiglu", "deep_narrow_mlp", "cross_entropy_loss"]
TOLERANCE = 1e-4


def pair_names() -> list[str]:
    return sorted(p.stem for p in (CORPUS / "reference").glob("*.py"))


def benchmark_files() -> list[Path]:
    return sorted(BENCHMARK.glob("level*/*.py"))


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def top_level(tree: ast.Module) -> dict[str, ast.AST]:
    return {
        node.name: node for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef))
    }


def method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    found = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert found, f"class {cls.name} has no {name}()"
    return found[0]


def ctor_args(cls: ast.ClassDef) -> list[str]:
    return [a.arg for a in method(cls, "__init__").args.args]


def load_inline_calls(tree: ast.Module) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", getattr(node.func, "attr", "")) == "load_inline"
    ]


def keyword(call: ast.Call, name: str):
    for kw in call.keywords:
        if kw.arg == name:
            return ast.literal_eval(kw.value) if not isinstance(kw.value, ast.Name) else kw.value.id
    return None


def cpp_text(tree: ast.Module) -> str:
    strings = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and "torch/extension.h" in node.value
    ]
    assert len(strings) == 1, (
        "expected exactly one C++ source string with #include <torch/extension.h>"
    )
    return strings[0]


def model_fingerprint(path: Path) -> str:
    """The Model class and get_inputs without docstrings or names: equal for the same task."""
    defs = top_level(parse(path))
    parts = []
    for name in ("Model", "get_inputs"):
        node = defs[name]
        body = [
            n
            for n in node.body
            if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
        ]
        parts.append(ast.dump(ast.Module(body=body, type_ignores=[])))
    return "\n".join(parts)


def normalised_task_name(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def load_meta() -> dict:
    return yaml.safe_load((CORPUS / "meta.yaml").read_text())


# -- corpus ------------------------------------------------------------------------------------


def test_corpus_pairs_have_matching_names():
    references = {p.name for p in (CORPUS / "reference").glob("*.py")}
    kernels = {p.name for p in (CORPUS / "kernels").glob("*.py")}
    assert references == kernels, f"unpaired files: {sorted(references ^ kernels)}"
    assert len(references) >= 20


@pytest.mark.parametrize("name", pair_names())
def test_reference_has_kernelbench_shape(name):
    tree = parse(CORPUS / "reference" / f"{name}.py")
    defs = top_level(tree)
    assert isinstance(defs.get("Model"), ast.ClassDef)
    method(defs["Model"], "forward")
    for func in ("get_inputs", "get_init_inputs"):
        assert isinstance(defs.get(func), ast.FunctionDef), f"{name}: no module-level {func}()"
    assert not load_inline_calls(tree), f"{name}: a reference must be plain PyTorch"
    constants = [n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id.isupper()]
    assert constants, f"{name}: sizes belong in module-level constants"


@pytest.mark.parametrize("name", pair_names())
def test_kernel_builds_cpu_operators_with_load_inline(name):
    reference = top_level(parse(CORPUS / "reference" / f"{name}.py"))
    tree = parse(CORPUS / "kernels" / f"{name}.py")
    defs = top_level(tree)
    assert isinstance(defs.get("ModelNew"), ast.ClassDef), f"{name}: no class ModelNew"
    assert ctor_args(defs["ModelNew"]) == ctor_args(reference["Model"]), (
        f"{name}: ctor signatures differ"
    )
    calls = load_inline_calls(tree)
    assert len(calls) == 1, f"{name}: expected one load_inline call"
    call = calls[0]
    assert keyword(call, "name") == f"seed_{name}"
    assert keyword(call, "cuda_sources") is None, f"{name}: CPU kernels take no cuda_sources"
    assert keyword(call, "extra_cflags") == REQUIRED_CFLAGS
    assert keyword(call, "extra_ldflags") == REQUIRED_LDFLAGS
    assert keyword(call, "verbose") is False
    functions = keyword(call, "functions")
    assert functions, f"{name}: load_inline needs functions=[...]"
    source = cpp_text(tree)
    assert "TORCH_CHECK" in source, f"{name}: inputs must be checked"
    for function in functions:
        assert re.search(rf"torch::Tensor\s+{function}\s*\(", source), (
            f"{name}: {function} not defined"
        )


def test_extension_names_are_unique():
    names = [
        keyword(load_inline_calls(parse(CORPUS / "kernels" / f"{n}.py"))[0], "name")
        for n in pair_names()
    ]
    assert len(names) == len(set(names))


def test_meta_covers_every_pair():
    meta = load_meta()
    assert set(meta) == set(pair_names()), (
        f"meta.yaml mismatch: {sorted(set(meta) ^ set(pair_names()))}"
    )
    for name, info in meta.items():
        assert info["level"] in (1, 2, 3), f"{name}: level must be 1, 2 or 3"
        assert (
            isinstance(info["note"], str)
            and info["note"].strip()
            and "\n" not in info["note"].strip()
        )
    levels = [info["level"] for info in meta.values()]
    assert all(levels.count(level) >= 3 for level in (1, 2, 3))


# -- benchmark ---------------------------------------------------------------------------------


def test_benchmark_layout_follows_kernelbench():
    files = benchmark_files()
    assert len(files) >= 10
    assert {p.parent.name for p in files} == {"level1", "level2", "level3"}
    for level_dir in sorted({p.parent for p in files}):
        ids = []
        for path in level_dir.glob("*.py"):
            match = BENCHMARK_NAME.match(path.name)
            assert match, f"{path.name}: expected <id>_<Name>.py with an unpadded id"
            ids.append(int(match.group(1)))
        assert sorted(ids) == list(range(1, len(ids) + 1)), f"{level_dir.name}: ids must be 1..n"


@pytest.mark.parametrize("path", benchmark_files(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_benchmark_task_is_reference_only(path):
    tree = parse(path)
    defs = top_level(tree)
    assert isinstance(defs.get("Model"), ast.ClassDef) and "ModelNew" not in defs
    for func in ("get_inputs", "get_init_inputs"):
        assert isinstance(defs.get(func), ast.FunctionDef)
    assert not load_inline_calls(tree)


def test_no_benchmark_task_is_a_corpus_task():
    corpus_names = {normalised_task_name(n) for n in pair_names()}
    corpus_prints = {model_fingerprint(CORPUS / "reference" / f"{n}.py") for n in pair_names()}
    for path in benchmark_files():
        task = BENCHMARK_NAME.match(path.name).group(2)
        assert normalised_task_name(task) not in corpus_names, f"{path.name} shares a corpus name"
        assert model_fingerprint(path) not in corpus_prints, (
            f"{path.name} repeats a corpus reference"
        )


def test_task_files_are_distinct():
    paths = [CORPUS / "reference" / f"{n}.py" for n in pair_names()] + benchmark_files()
    prints = [model_fingerprint(p) for p in paths]
    assert len(set(prints)) == len(prints)


# -- references run (plain PyTorch, no compilation) ----------------------------------------------


def exec_file(path: Path) -> dict:
    namespace = {"__name__": f"seed_{path.stem}"}
    exec(compile(path.read_text(), str(path), "exec"), namespace)  # noqa: S102 -- the shipped task files are the code under test
    return namespace


def all_reference_files() -> list[Path]:
    return [CORPUS / "reference" / f"{n}.py" for n in pair_names()] + benchmark_files()


@pytest.mark.parametrize("path", all_reference_files(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_reference_runs_on_inputs_of_both_signs(path):
    torch = pytest.importorskip("torch")
    namespace = exec_file(path)
    torch.manual_seed(0)
    model = namespace["Model"](*namespace["get_init_inputs"]())
    inputs = namespace["get_inputs"]()
    for tensor in inputs:
        assert tensor.device.type == "cpu"
        if tensor.is_floating_point():
            assert tensor.dtype == torch.float32
            assert tensor.min() < 0 < tensor.max(), "inputs of one sign hide wrong branches"
    with torch.inference_mode():
        out = model(*inputs)
    assert isinstance(out, torch.Tensor) and torch.isfinite(out).all()
    # A kernel returning zeros or a constant must fail the harness's allclose.
    out = out.float()
    assert not torch.allclose(torch.zeros_like(out), out, atol=TOLERANCE, rtol=TOLERANCE)
    if out.numel() > 1:
        assert not torch.allclose(
            torch.full_like(out, out.mean().item()), out, atol=TOLERANCE, rtol=TOLERANCE
        )


# -- built kernels -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", BUILT_PAIRS)
def test_kernel_matches_reference(name, build_cache_dir, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(build_cache_dir))
    reference_ns = exec_file(CORPUS / "reference" / f"{name}.py")
    kernel_ns = exec_file(CORPUS / "kernels" / f"{name}.py")
    init_inputs = reference_ns["get_init_inputs"]()
    for seed in range(3):
        torch.manual_seed(seed)
        reference = reference_ns["Model"](*init_inputs)
        torch.manual_seed(seed)
        candidate = kernel_ns["ModelNew"](*init_inputs)
        torch.manual_seed(1000 + seed)
        inputs = reference_ns["get_inputs"]()
        with torch.inference_mode():
            expected = reference(*inputs)
            actual = candidate(*inputs)
        assert actual.shape == expected.shape
        assert torch.allclose(actual, expected, atol=TOLERANCE, rtol=TOLERANCE), (
            f"{name} seed {seed}: max abs error {(actual - expected).abs().max().item():.3g}"
        )
