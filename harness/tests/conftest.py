"""The harness's own tests: they need only the kernelharness package (no pipeline).
GPU tests carry @pytest.mark.gpu and skip where no CUDA device is."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kernelharness.testing import has_cuda, private_tempdir

# One extension build cache per checkout, shared with the pipeline's tests (both build the
# same few sources): <checkout>/.cache/dicepipe/builds, or KERNELHARNESS_TEST_CACHE.
HARNESS_ROOT = Path(__file__).resolve().parent.parent
BUILD_CACHE = Path(os.environ.get("KERNELHARNESS_TEST_CACHE")
                   or HARNESS_ROOT.parent / ".cache" / "dicepipe" / "builds")


def pytest_collection_modifyitems(config, items):
    if has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and str(item.path).startswith(str(Path(__file__).parent)):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def harness_tempdir(tmp_path_factory, monkeypatch):
    """Harness tests leave nothing in the temporary directory (testing.private_tempdir)."""
    yield from private_tempdir(tmp_path_factory, monkeypatch)


@pytest.fixture(scope="session")
def build_cache_dir() -> Path:
    """One extension build cache for the whole test session, so each distinct source builds
    at most once per machine."""
    BUILD_CACHE.mkdir(parents=True, exist_ok=True)
    return BUILD_CACHE
