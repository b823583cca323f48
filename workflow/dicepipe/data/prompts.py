"""Prompts in the project's own words (the `dicepipe` wording; KernelBench's and the
release's are read from their sources by `data/prompt_sources.py`), with the structure of
KernelBench's one-shot prompt:
task statement, a worked example (a PyTorch program and its custom-operator version),
the target program, and the instruction to answer with code only. The example and
wording follow the corpus's backend (C++/OpenMP on cpu, CUDA on cuda)."""

from __future__ import annotations

_EXAMPLE_REFERENCE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return a + b


def get_inputs():
    return [torch.randn(1024), torch.randn(1024)]


def get_init_inputs():
    return []
'''

_EXAMPLE_CUDA = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

add_source = r"""
#include <torch/extension.h>

__global__ void add_kernel(const float* a, const float* b, float* out, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

torch::Tensor add_cuda(torch::Tensor a, torch::Tensor b) {
    auto out = torch::empty_like(a);
    int64_t n = a.numel();
    int threads = 256;
    add_kernel<<<(n + threads - 1) / threads, threads>>>(
        a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""

add_decl = "torch::Tensor add_cuda(torch::Tensor a, torch::Tensor b);"

add_ext = load_inline(name="add_ext", cpp_sources=add_decl, cuda_sources=add_source,
                      functions=["add_cuda"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return add_ext.add_cuda(a.contiguous(), b.contiguous())
'''

_EXAMPLE_CPU = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

add_source = r"""
#include <torch/extension.h>

torch::Tensor add_cpu(torch::Tensor a, torch::Tensor b) {
    a = a.contiguous();
    b = b.contiguous();
    auto out = torch::empty_like(a);
    const float* pa = a.data_ptr<float>();
    const float* pb = b.data_ptr<float>();
    float* po = out.data_ptr<float>();
    int64_t n = a.numel();
    #pragma omp parallel for
    for (int64_t i = 0; i < n; ++i) po[i] = pa[i] + pb[i];
    return out;
}
"""

add_ext = load_inline(name="add_ext", cpp_sources=add_source, functions=["add_cpu"],
                      extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return add_ext.add_cpu(a, b)
'''

_TASK = {
    "cuda": (
        "You write custom CUDA kernels that replace PyTorch operators to make a program run "
        "faster on an NVIDIA GPU. You may replace some operators and keep others, fuse several "
        "operators into one kernel (for example a matmul followed by an activation), or change "
        "the algorithm (for example an online softmax). Build your kernels inline with "
        "torch.utils.cpp_extension.load_inline."
    ),
    "cpu": (
        "You write custom C++ operators that replace PyTorch operators to make a program run "
        "faster on a multi-core CPU. You may replace some operators and keep others, fuse several "
        "operators into one loop to avoid temporaries, parallelise with OpenMP, or change the "
        "algorithm. Build your operators inline with torch.utils.cpp_extension.load_inline."
    ),
}

# KernelBench programs take float32 and integer tensors (indices, labels, sizes), so the
# prompt names no dtype: it asks to keep whatever get_inputs() produces.
_DTYPES = ("Its inputs are the tensors get_inputs() returns, with their dtypes (floating point "
           "or integer); keep every output's shape and dtype.")

_INSTRUCTION = (
    "Optimise the program above: write a new architecture named ModelNew with the same "
    "constructor arguments and the same outputs, replacing operators with your own custom "
    "{lang} code. Answer with the complete Python file in one fenced code block. It must "
    "compile and run as is. Write no explanation and no tests."
)


def _fence(code: str) -> str:
    return f"```python\n{code.rstrip()}\n```"


def end_to_end_prompt(reference_code: str, backend: str) -> str:
    """The user turn asking for a whole ModelNew file for `reference_code`."""
    example = _EXAMPLE_CUDA if backend == "cuda" else _EXAMPLE_CPU
    lang = "CUDA" if backend == "cuda" else "C++"
    return "\n\n".join([
        _TASK[backend],
        "Here is an example. The program:",
        _fence(_EXAMPLE_REFERENCE),
        "and a version with a custom operator:",
        _fence(example),
        "Now the program to optimise:",
        _fence(reference_code),
        _DTYPES,
        _INSTRUCTION.format(lang=lang),
    ])


def infilling_prompt(reference_code: str, prefix: str, suffix: str, backend: str) -> str:
    """The user turn for kernel infilling: the file's prefix and suffix are given and the
    model writes the missing core (the kernel source), answering with the whole file."""
    lang = "CUDA" if backend == "cuda" else "C++"
    return "\n\n".join([
        _TASK[backend],
        "The program to optimise:",
        _fence(reference_code),
        _DTYPES,
        "A solution file has been started. Its beginning is:",
        _fence(prefix),
        "and its end is:",
        _fence(suffix),
        f"The {lang} source of the custom operators between them is missing. Write it so that "
        "the file compiles, is correct and runs faster than the program, and answer with the "
        "complete Python file (beginning, your source, end) in one fenced code block. Write no "
        "explanation.",
    ])


def response_text(candidate_code: str) -> str:
    """The assistant turn for SFT: the kernel file in one fenced block."""
    return _fence(candidate_code)
