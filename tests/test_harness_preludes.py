"""Minimal headers (kernelharness/compilation/preludes.py): what a prelude holds, that main.cpp's prelude
declares every pybind11 caster <torch/extension.h> does, that a real CPU extension builds
with it and one needing more falls back to the full headers, that a real kernel's device
code (PTX) is the same whichever headers its .cu compiled with (slim operator headers too:
every slim copy compiles, and a unit reaching an original is seen), and that the binding check
fails exactly the main.cpp that fail as written (and lets the rest compile)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from kernelharness.compilation import preludes

CU = """#include <torch/types.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include <torch/extension.h>
__global__ void k(const float* x, float* y, int n) { int i = threadIdx.x; if (i < n) y[i] = x[i]; }
torch::Tensor copy(torch::Tensor x) {
  auto y = torch::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "copy", [&] {});
  return at::matmul(y, y);
}
"""


def _options(**values):
    """Build options: no precompiled headers, light and minimal headers off unless given, the
    build-speed switches on (schema.yaml's defaults)."""
    from kernelharness.compilation.options import BuildOptions

    return BuildOptions(**{"use_pch": False, "light_headers": False, "minimal_headers": False,
                           "slim_op_headers": True, "share_host_objects": True,
                           "wait_for_prelude_header": True, **values})


def test_prelude_names_the_operators_the_source_uses(tmp_path):
    text = preludes.prelude_text(CU, binding=False)
    assert "#include <ATen/core/Tensor.h>" in text
    for op in ("empty_like", "matmul"):
        assert f"#include <ATen/ops/{op}.h>" in text
    assert "#include <ATen/Dispatch.h>" in text
    assert "pybind" not in text  # only main.cpp's prelude binds
    assert "constexpr auto kFloat32 = at::kFloat;" in text
    binding = preludes.prelude_text("torch::Tensor f(torch::Tensor x);", binding=True)
    assert all(f"#include <{h}>" in binding for h in preludes.BINDING_HEADERS)
    assert "ATen/ops/" not in binding and "Dispatch" not in binding


def test_minimal_source_keeps_lines_and_skips_what_it_would_change(tmp_path):
    out = preludes.minimal_source(CU, tmp_path, binding=False)
    assert out is not None and out.count("\n") == CU.count("\n")
    assert "<torch/" not in out
    header = preludes.prelude_path(out)
    assert header is not None and header.is_file() and header.parent == (tmp_path / "preludes").resolve()
    assert out.count(f'#include "{header}"') == 2  # both torch includes, one header (pragma once)
    # a source naming what only torch/all.h declares skips the tier (it could only fail)
    assert preludes.minimal_source(CU + "// torch::nn::functional::relu\n", tmp_path, False) is None
    # the same source, the same header file: named by content
    assert preludes.minimal_source(CU, tmp_path, binding=False) == out
    assert preludes.minimal_source(CU.replace("<torch/types.h>", "<ATen/ATen.h>").replace(
        "#include <torch/extension.h>\n", ""), tmp_path, binding=False) is None  # no torch include
    assert preludes.minimal_source(CU + "// x.requires_grad_(true)\n", tmp_path, False) is None


def _torch_flags() -> list[str]:
    from torch.utils import cpp_extension

    flags = ["-std=c++17", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    for path in cpp_extension.include_paths() + [sysconfig.get_paths()["include"]]:
        flags += ["-isystem", path]
    return flags


def _closure(text: str, tmp_path: Path) -> set[str]:
    unit = tmp_path / f"u{abs(hash(text))}.cpp"
    unit.write_text(text)
    out = subprocess.run(["c++", *_torch_flags(), "-M", str(unit)], capture_output=True,
                         text=True, check=True).stdout
    return {p for p in out.replace("\\\n", " ").split()[1:] if p.endswith(".h") or "/" in p}


@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")
def test_binding_prelude_declares_every_caster_the_full_header_does(tmp_path):
    """A type caster main.cpp's prelude lacked would compile and fail only when called
    (pybind11 takes the type for an unregistered class): every header of <torch/extension.h>'s
    closure that specializes one must be in the prelude's closure too."""
    full = _closure("#include <torch/extension.h>\n", tmp_path)
    header = preludes.write_prelude(preludes.prelude_text("", binding=True), tmp_path)
    light = _closure(f'#include "{header}"\n', tmp_path)
    caster = re.compile(r"\btype_caster<|PYBIND11_DECLARE_HOLDER_TYPE|polymorphic_type_hook<")
    declaring = {p for p in full if caster.search(Path(p).read_text(errors="replace"))}
    assert any("pybind.h" in p for p in declaring)  # the scan sees torch's casters at all
    assert declaring <= light, sorted(declaring - light)
    assert len(light) < len(full) / 2  # and it is a much smaller parse


@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")
def test_every_slim_operator_header_compiles_and_conflicts_are_seen(tmp_path):
    """Every generated operator header of the installed torch has a slim copy that compiles
    after Tensor.h alone (those that add a completing include last, so that no other header
    leans on it); a call needing a completed signature type compiles; and the preprocessed
    text of a unit that also includes the originals names them (slim_conflicts)."""
    include_dir = preludes.torch_include_dir()
    folder = tmp_path / "slim"
    plain, completed, kept = [], [], []
    for name in sorted(preludes._op_names(include_dir)):
        if re.search(r"_(ops|native|dispatch|meta)$", name):
            continue
        copy = preludes._slim_header(f"ATen/ops/{name}.h", include_dir, folder)
        if copy is None:
            kept.append(name)
            continue
        text = copy.read_text()
        (completed if "ATen/core/IListRef.h" in text or "ATen/core/List.h" in text
         else plain).append(copy)
        assert "ATen/Context.h" not in text and f"<ATen/ops/{name}_ops.h>" in text
    assert len(plain) > 1000 and completed and len(kept) < 10, (len(plain), kept)
    unit = tmp_path / "all.cpp"
    unit.write_text("#include <ATen/core/Tensor.h>\n"
                    + "".join(f'#include "{p}"\n' for p in plain + completed)
                    + "at::Tensor two(at::Tensor a) { return at::cat({a, a}, 0); }\n")
    done = subprocess.run(["c++", *_torch_flags(), "-fsyntax-only", str(unit)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]

    source = CU.replace("#include <torch/extension.h>\n", "")
    slim = preludes.minimal_source(source, tmp_path / "cache", binding=False, slim=True)
    originals = preludes.slim_originals(slim)
    assert {"ATen/ops/empty_like.h", "ATen/ops/matmul.h", "ATen/TensorOperators.h"} <= set(
        originals)
    for extra, expected in (("", []), ("#include <ATen/ATen.h>\n", originals)):
        unit = tmp_path / "unit.cpp"
        unit.write_text(slim.replace("#include <cuda.h>\n#include <cuda_runtime.h>\n", extra))
        done = subprocess.run(["c++", *_torch_flags(), "-E", str(unit)], capture_output=True,
                              text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        assert preludes.slim_conflicts(done.stdout, originals) == sorted(expected)


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")
def test_cpu_extension_builds_minimal_and_falls_back_when_it_needs_more(tmp_path):
    import torch
    from kernelharness.compilation.builder import build_spec
    from kernelharness.compilation.buildspec import normalize_spec, so_path

    def spec(body: str) -> dict:
        return normalize_spec({"name": "m", "cpp_sources": [body], "functions": ["twice"]})

    light = spec("torch::Tensor twice(torch::Tensor x) {\n"
                 "  auto y = torch::empty_like(x);\n  y.copy_(x * 2);\n  return y;\n}\n")
    # at::parallel_for (ATen/Parallel.h) is in the full headers only: the minimal compile
    # fails, the one as written runs
    heavy = spec("torch::Tensor twice(torch::Tensor x) {\n"
                 "  auto y = torch::empty_like(x);\n"
                 "  float* o = y.data_ptr<float>(); const float* i = x.data_ptr<float>();\n"
                 "  at::parallel_for(0, x.numel(), 1, [&](int64_t b, int64_t e) {\n"
                 "    for (int64_t k = b; k < e; ++k) o[k] = 2 * i[k]; });\n"
                 "  return y;\n}\n")
    cache = tmp_path / "cache"
    x = torch.arange(6, dtype=torch.float32)
    notes = []
    for k, s in enumerate((light, heavy)):
        key = f"{k}" * 64
        status = build_spec(s, key, cache, _options(minimal_headers=True))
        assert status["ok"], status["log_tail"]
        notes.append(status["pch"])
        module = _load(so_path(cache, key), f"dp_{key[:24]}")
        assert torch.equal(module.twice(x), x * 2)
    assert "host:minimal-headers" in notes[0] and "full-headers" not in notes[0]
    assert "host:full-headers" in notes[1]
    hosts = [s for s in build_spec(heavy, "1" * 64, cache, _options())["steps"]
             if s["step"] == "host"]
    assert [s["ok"] for s in hosts] == [False, True]  # the minimal try, then as written


def test_binding_block_is_read_as_load_inline_writes_it():
    head = "#include <torch/extension.h>\n// forward is defined in cuda_sources\n"
    block = ("PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n"
             'm.def("forward", torch::wrap_pybind_function(forward), "forward");\n'
             'm.def("scale", scale, "doc with \\"quotes\\"");\n}')
    user = 'torch::Tensor scale(torch::Tensor x);\nconst char* s = "forward";\n'
    prefix, names = preludes.binding_block(head + user + "\n" + block)
    assert prefix == head + user + "\n" and names == ["forward", "scale"]
    # spelled only in a comment and a string: not declared
    assert preludes.binding_suspects(prefix, names) == (["forward"], False)
    own = prefix + "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(\"scale\", &scale); }\n"
    assert preludes.binding_suspects(own, names) == (["forward"], True)
    assert preludes.binding_block(head + user) is None  # no generated block
    custom = block.replace('m.def("scale", scale,', 'm.def("scale", &scale,')
    assert preludes.binding_block(head + "\n" + custom) is None  # not load_inline's block
    assert preludes.has_token("x forward_all(y)", "forward_all")
    assert not preludes.has_token("std::forwarding", "forward")


@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")
def test_binding_check_fails_what_fails_as_written_and_nothing_else(tmp_path):
    import torch
    from kernelharness.compilation.builder import build_spec
    from kernelharness.compilation.buildspec import normalize_spec, so_path

    cache = tmp_path / "cache"

    def build(key: str, functions: list[str], source: str) -> dict:
        spec = normalize_spec({"name": "m", "cpp_sources": [source], "functions": functions})
        return build_spec(spec, key * 64, cache, _options(minimal_headers=True))

    def steps(status: dict) -> list[str]:
        return [s["step"] for s in status["steps"]]

    # the classic failure: the bound function lives in cuda_sources (here: nowhere)
    status = build("a", ["scale_rows"], "// scale_rows is in the .cu\n")
    assert not status["ok"] and "binds scale_rows" in status["log_tail"]
    assert "was not declared" in status["log_tail"]
    assert steps(status) == ["host:check"]  # no compile of main.cpp at all
    # a second module block beside load_inline's
    twice = "torch::Tensor twice(torch::Tensor x) { return x * 2; }\n"
    own = twice + "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(\"twice\", &twice); }\n"
    status = build("b", ["twice"], own)
    assert not status["ok"] and "defines its Python module twice" in status["log_tail"]
    assert steps(status) == ["host:check"]
    # a name the headers spell (std::forward) but do not declare here: as written at once,
    # which fails with the compiler's own message
    status = build("c", ["forward"], "// forward is in the .cu\n")
    assert not status["ok"] and "forward" in status["log_tail"]
    assert steps(status) == ["host:check", "host"]
    # what the text does not spell but declares (token pasting), and a block the
    # preprocessor drops: both build, as they do as written
    x = torch.arange(4, dtype=torch.float32)
    pasted = "#define DEFINE(a, b) torch::Tensor a##b(torch::Tensor x) { return x * 2; }\n" \
             "DEFINE(tw, ice)\n"
    for key, source in (("d", pasted), ("e", "#if 0\n" + own + "#endif\n" + twice)):
        status = build(key, ["twice"], source)
        assert status["ok"], status["log_tail"]
        assert steps(status)[0] == "host:check"
        module = _load(so_path(cache, key * 64), "dp_" + key * 24)
        assert torch.equal(module.twice(x), x * 2)


def _ptx(source: str, folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cuda.cu").write_text(source)
    # the one generated c10/cuda header a CPU wheel of torch lacks (as the GPU wheel has it)
    macros = folder / "inc" / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
    macros.parent.mkdir(parents=True, exist_ok=True)
    macros.write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    done = subprocess.run(["nvcc", "-std=c++17", "-O3", "-arch=sm_90", "--ptx", *_torch_flags(),
                           "-I", str(folder / "inc"),
                    "cuda.cu", "-o", "cuda.ptx"], cwd=folder, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return (folder / "cuda.ptx").read_text()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_real_kernel_device_code_is_the_same_with_minimal_headers(tmp_path):
    """The augment templates' attention kernel (its own c10/cuda includes kept), compiled to
    PTX with load_inline's headers and with its minimal prelude: the same device code."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))
    import yaml
    from dicepipe.augment.authors.templates import TemplateAuthor
    from dicepipe.augment.tasks import generate_tasks

    params = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    task = generate_tasks(dict(params["augment"], max_tasks={}), "cuda")[0]
    code = TemplateAuthor().write(task, 0).code
    cuda = re.search(r"r'''\n(.*?)'''", code, re.S).group(1)
    written = "#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n" + cuda
    minimal = preludes.minimal_source(written, tmp_path / "cache", binding=False)
    slim = preludes.minimal_source(written, tmp_path / "cache", binding=False, slim=True)
    assert minimal is not None and preludes.slim_originals(slim)
    full, light = _ptx(written, tmp_path / "full"), _ptx(minimal, tmp_path / "minimal")
    assert ".entry" in full
    def normal(ptx: str) -> str:
        ptx = re.sub(r"^//.*$", "", ptx, flags=re.M)  # nvcc's header comments (tool versions)
        # internal-linkage names carry a hash of the translation unit's text
        return re.sub(r"(_INTERNAL_|_GLOBAL__N__)[0-9a-f]{8}_", r"\1", ptx)

    assert normal(full) == normal(light) == normal(_ptx(slim, tmp_path / "slim"))
