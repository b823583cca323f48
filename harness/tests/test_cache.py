"""The content-addressed build cache: keys, reuse across batches, cached failures."""

from __future__ import annotations

import pytest
from kernelharness.errors import HarnessError
from kernelharness import evaluate
from kernelharness.compilation.buildspec import normalize_spec, read_status, spec_key
from kernelharness.testing import HONEST_RELU, RELU_REF, by_id, job, python_candidate, settings

TOOL = {"builder": 1, "torch": "2.11.0", "cxx": "g++ 12", "cpu_flags": "abc", "nvcc": "13.0",
        "cuda_arch": "9.0"}
SPEC = normalize_spec({"name": "a", "cpp_sources": "int f() { return 1; }", "functions": "f",
                       "extra_cflags": ["-O3"]})

# Fails in the compiler within a second: no torch headers are involved.
BROKEN = python_candidate("return x", top='''
from torch.utils.cpp_extension import load_inline
broken = load_inline(name="broken", cpp_sources=["int f( { }"], functions=None,
                     no_implicit_headers=True)
''')


def test_key_ignores_the_extension_name():
    renamed = dict(SPEC, name="b")
    assert spec_key(SPEC, TOOL) == spec_key(renamed, TOOL)


@pytest.mark.parametrize("change", [
    lambda s, t: (dict(s, extra_cflags=["-O2"]), t),
    lambda s, t: (dict(s, cpp_sources=["int f() { return 2; }"]), t),
    lambda s, t: (dict(s, functions=["g"]), t),
    lambda s, t: (s, dict(t, torch="2.12.0")),
    lambda s, t: (s, dict(t, cxx="g++ 13")),
    lambda s, t: (s, dict(t, cpu_flags="other")),
])
def test_key_changes_with_what_decides_the_binary(change):
    spec, tool = change(SPEC, TOOL)
    assert spec_key(spec, tool) != spec_key(SPEC, TOOL)


def test_gpu_arch_matters_only_for_cuda_sources():
    assert spec_key(SPEC, dict(TOOL, cuda_arch="8.0")) == spec_key(SPEC, TOOL)
    cuda = dict(SPEC, cuda_sources=["__global__ void k() {}"])
    assert spec_key(cuda, dict(TOOL, cuda_arch="8.0")) != spec_key(cuda, TOOL)


def test_normalize_spec_reads_load_inline_arguments():
    assert SPEC["cpp_sources"] == ["int f() { return 1; }"] and SPEC["functions"] == ["f"]
    assert SPEC["cuda_sources"] == [] and SPEC["with_pytorch_error_handling"] is True
    with pytest.raises(HarnessError):
        normalize_spec({"name": "x", "cpp_sources": [""], "extra_cflags": ["-wrapper", "sh"]})
    with pytest.raises(HarnessError):
        normalize_spec({"name": "x", "cpp_sources": [1]})


def test_second_batch_reuses_builds(build_cache_dir):
    cfg = settings(build_cache_dir)
    first = by_id(evaluate([job("relu_a", RELU_REF, HONEST_RELU)], cfg, progress=False))["relu_a"]
    assert first["correct"] and first["builds_total"] == 1
    second = by_id(evaluate([job("relu_b", RELU_REF, HONEST_RELU)], cfg, progress=False))["relu_b"]
    assert second["correct"] and second["builds_total"] == 1
    assert second["builds_cached"] == 1 and second["wall_build_s"] == 0.0
    assert list((build_cache_dir / "extract").rglob("*.json")), "extraction is cached too"


def test_build_failure_is_cached_not_retried(tmp_path):
    cfg = settings(tmp_path / "cache")
    rows = by_id(evaluate([job("broken_1", RELU_REF, BROKEN), job("broken_2", RELU_REF, BROKEN)],
                          cfg, progress=False))
    for name in ("broken_1", "broken_2"):
        row = rows[name]
        assert not row["compiled"] and row["error_phase"] == "build"
        assert "error" in row["compile_log_tail"]
    # one build for the two jobs; the second never compiled anything
    assert rows["broken_1"]["builds_cached"] + rows["broken_2"]["builds_cached"] == 1
    again = by_id(evaluate([job("broken_3", RELU_REF, BROKEN)], cfg, progress=False))["broken_3"]
    assert again["builds_cached"] == 1 and again["wall_build_s"] == 0.0
    assert not again["compiled"]
    keys = [p.parent.name for p in (tmp_path / "cache" / "ext").rglob("status.json")]
    assert len(keys) == 1 and read_status(tmp_path / "cache", keys[0])["ok"] is False
