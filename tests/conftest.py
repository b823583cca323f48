"""Shared fixtures. GPU tests carry @pytest.mark.gpu and skip where no CUDA device is."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kernelharness.testing import has_cuda, private_tempdir

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_KERNELBENCH = REPO_ROOT.parent / "shared" / "data" / "kernelbench" / "kernelbench_levels_1-3.parquet"

os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(config, items):
    if has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def harness_tempdir(request, tmp_path_factory, monkeypatch):
    """The pipeline's harness tests leave nothing in the temporary directory
    (kernelharness.testing.private_tempdir)."""
    if not request.module.__name__.startswith("test_harness_"):
        yield None
        return
    yield from private_tempdir(tmp_path_factory, monkeypatch)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def params() -> dict:
    from dicepipe.config import load_params

    return load_params(REPO_ROOT / "params.yaml")


@pytest.fixture(scope="session")
def build_cache_dir() -> Path:
    """One extension build cache for the whole test session (and shared with the pipeline),
    so each distinct source builds at most once per machine."""
    path = REPO_ROOT / ".cache" / "dicepipe" / "builds"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def kernelbench_parquet() -> Path:
    if not SHARED_KERNELBENCH.is_file():
        pytest.skip("../shared/data/kernelbench is absent")
    return SHARED_KERNELBENCH


@pytest.fixture()
def one_thread():
    """Many tiny training steps: one thread avoids OpenMP spin-waits on a small or busy machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
