"""Small programs and settings for testing the harness and code built on it (the harness's
own tests and the pipeline's use them).

Every test that needs a compiled extension uses the one C++ source below, so the whole
harness test set builds a single extension (once per machine, in the shared build cache).
The isolation cases need no extension at all: misbehaving Python is enough.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from .settings import HarnessSettings, Job


def has_cuda() -> bool:
    """A CUDA device is usable here (GPU tests skip otherwise)."""
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def private_tempdir(tmp_path_factory, monkeypatch):
    """Generator for an autouse fixture: the test's temporary folders (tempfile and TMPDIR, so
    in the processes it starts too) go to a private directory, which must be empty when the
    test ends: a harness run, even a killed one (cleaned by the next), leaves nothing behind."""
    import os
    import tempfile

    private = tmp_path_factory.mktemp("tempdir")
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    monkeypatch.setenv("TMPDIR", str(private))
    yield private
    left = sorted(os.listdir(private))
    assert not left, f"the harness left {left} in the temporary directory"


def settings(cache_dir: Path, **overrides) -> HarnessSettings:
    """Small, fast settings: few trials, one builder, no precompiled header (one build only)."""
    values = dict(correct_trials=5, warmup_trials=1, timing_trials=10, timing_trials_cpu=10,
                  repeats=1, run_timeout_s=60, build_timeout_s=600, build_workers=1, use_pch=False,
                  memory_limit_mb=4096, cache_dir=str(cache_dir))
    values.update(overrides)
    return HarnessSettings.with_defaults(**values)


def reference(expr: str, shape: str = "64, 256", init: str = "[]", ctor: str = "") -> str:
    return textwrap.dedent(f"""
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self{ctor}):
                super().__init__()

            def forward(self, x):
                return {expr}

        def get_inputs():
            return [torch.rand({shape})]

        def get_init_inputs():
            return {init}
        """)


RELU_REF = reference("torch.relu(x)")
IDENTITY_REF = reference("x * 1.0")
TINY_REF = reference("x * 1e-6")  # every output far below atol: zeros would pass
SELU_LIKE_REF = reference("torch.where(x > 0, x, 0.5 * x)")

# The single extension of the test set: a ReLU in plain C++ with OpenMP.
RELU_CPP = r'''
torch::Tensor relu_fwd(torch::Tensor x) {
    auto input = x.contiguous();
    auto out = torch::empty_like(input);
    const float* src = input.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    const int64_t n = input.numel();
#pragma omp parallel for if (n > 65536)
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i] > 0.0f ? src[i] : 0.0f;
    return out;
}
'''

_PRELUDE = f'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_source = r"""{RELU_CPP}"""
ext = load_inline(name="harness_test_relu", cpp_sources=[relu_source], functions=["relu_fwd"],
                  extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"])
'''


def extension_candidate(init_body: str, forward_body: str, extra: str = "") -> str:
    """A candidate file that builds the shared extension; ModelNew's body is given."""
    init = textwrap.indent(textwrap.dedent(init_body).strip() or "pass", " " * 8)
    fwd = textwrap.indent(textwrap.dedent(forward_body).strip(), " " * 8)
    return (_PRELUDE + textwrap.dedent(extra) + "\n\nclass ModelNew(nn.Module):\n"
            "    def __init__(self):\n        super().__init__()\n" + init + "\n\n"
            "    def forward(self, x):\n" + fwd + "\n")


def python_candidate(forward_body: str, top: str = "") -> str:
    """A candidate with no extension (isolation cases): ModelNew.forward is given."""
    fwd = textwrap.indent(textwrap.dedent(forward_body).strip(), " " * 8)
    return ("import os\nimport sys\nimport torch\nimport torch.nn as nn\n" + textwrap.dedent(top)
            + "\n\nclass ModelNew(nn.Module):\n    def __init__(self):\n"
            "        super().__init__()\n\n    def forward(self, x):\n" + fwd + "\n")


HONEST_RELU = extension_candidate("", "return ext.relu_fwd(x)")


def job(job_id: str, ref: str, cand: str, backend: str = "cpu") -> Job:
    return Job(job_id=job_id, reference_code=ref, candidate_code=cand, backend=backend)


def by_id(table) -> dict:
    return {row["job_id"]: row for row in table.to_pylist()}
