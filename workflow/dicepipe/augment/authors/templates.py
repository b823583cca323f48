"""The `templates` author: built-in operator sources for every family and backend.

A candidate file is: imports, the operator source string, load_inline, the launch settings
of one variant, and `class ModelNew` (same constructor and parameters, created in the same
order, as the reference). The source text does not depend on the task's shape nor on the
variant, so the harness builds each kernel once per backend; attempts differ by variant."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from ..families import FAMILIES
from ..tasks import Task
from . import kernels_cpu, kernels_cuda
from .draft import Draft


@dataclass(frozen=True)
class KernelSpec:
    function: str  # the extension function ModelNew calls
    knobs: tuple[str, ...]  # variant settings, passed after the model arguments in this order
    variants: tuple[dict, ...]  # one per attempt, best guess first


# cpu: THREADS 0 = as many threads as PyTorch uses; a task is ROWS_PER_TASK rows.
_CPU = {
    "attention": KernelSpec("attention_block", ("ROWS_PER_TASK", "THREADS", "FUSE_QKV"), (
        {"ROWS_PER_TASK": 8, "THREADS": 0, "FUSE_QKV": False},
        {"ROWS_PER_TASK": 1 << 30, "THREADS": 1, "FUSE_QKV": False},
        {"ROWS_PER_TASK": 1, "THREADS": 0, "FUSE_QKV": True},
    )),
    "gated_mlp": KernelSpec("gated_mlp", ("ROWS_PER_TASK", "THREADS", "FUSE_GATE_UP"), (
        {"ROWS_PER_TASK": 16, "THREADS": 0, "FUSE_GATE_UP": False},
        {"ROWS_PER_TASK": 1 << 30, "THREADS": 1, "FUSE_GATE_UP": False},
        {"ROWS_PER_TASK": 4, "THREADS": 0, "FUSE_GATE_UP": True},
    )),
    "plain_mlp": KernelSpec("plain_mlp", ("ROWS_PER_TASK", "THREADS", "BIAS_IN_GEMM"), (
        {"ROWS_PER_TASK": 16, "THREADS": 0, "BIAS_IN_GEMM": False},
        {"ROWS_PER_TASK": 1 << 30, "THREADS": 1, "BIAS_IN_GEMM": False},
        {"ROWS_PER_TASK": 4, "THREADS": 0, "BIAS_IN_GEMM": True},
    )),
    "rmsnorm_proj": KernelSpec("rmsnorm_linear", ("ROWS_PER_TASK", "THREADS"), (
        {"ROWS_PER_TASK": 16, "THREADS": 0},
        {"ROWS_PER_TASK": 1 << 30, "THREADS": 1},
    )),
}

# cuda: attention processes ROWS_PER_WARP query rows per warp; elementwise kernels run
# THREADS_PER_BLOCK threads with VECTOR-wide loads.
_CUDA = {
    "attention": KernelSpec("attention_block", ("ROWS_PER_WARP", "FUSE_QKV"), (
        {"ROWS_PER_WARP": 4, "FUSE_QKV": False},
        {"ROWS_PER_WARP": 2, "FUSE_QKV": False},
        {"ROWS_PER_WARP": 4, "FUSE_QKV": True},
        {"ROWS_PER_WARP": 1, "FUSE_QKV": False},
    )),
    "gated_mlp": KernelSpec("gated_mlp", ("THREADS_PER_BLOCK", "FUSE_GATE_UP"), (
        {"THREADS_PER_BLOCK": 256, "FUSE_GATE_UP": False},
        {"THREADS_PER_BLOCK": 256, "FUSE_GATE_UP": True},
        {"THREADS_PER_BLOCK": 512, "FUSE_GATE_UP": False},
    )),
    "plain_mlp": KernelSpec("plain_mlp", ("THREADS_PER_BLOCK", "BIAS_IN_GEMM"), (
        {"THREADS_PER_BLOCK": 256, "BIAS_IN_GEMM": False},
        {"THREADS_PER_BLOCK": 256, "BIAS_IN_GEMM": True},
        {"THREADS_PER_BLOCK": 512, "BIAS_IN_GEMM": False},
    )),
    "rmsnorm_proj": KernelSpec("rmsnorm_linear", ("THREADS_PER_BLOCK",), (
        {"THREADS_PER_BLOCK": 256},
        {"THREADS_PER_BLOCK": 128},
        {"THREADS_PER_BLOCK": 512},
    )),
}

SPECS = {"cpu": _CPU, "cuda": _CUDA}
SOURCES = {"cpu": kernels_cpu.SOURCES, "cuda": kernels_cuda.SOURCES}

def _linear(name: str, args: str) -> str:
    return f"self.{name} = nn.Linear({args})"


# Per family: constructor signature, member lines (parameters created in the reference's
# order, so seeded initialisation matches), and the model arguments of the operator call.
_ATTENTION_CALL = ("x, self.q_proj.weight, self.k_proj.weight, self.v_proj.weight, "
                   "self.o_proj.weight,\n            self.num_heads, {kv}, {causal}")
_MODELS = {
    "attention_mha": (
        "hidden_size, num_heads, head_dim",
        ["self.num_heads = num_heads"]
        + [_linear(n, "hidden_size, num_heads * head_dim, bias=False")
           for n in ("q_proj", "k_proj", "v_proj")]
        + [_linear("o_proj", "num_heads * head_dim, hidden_size, bias=False")],
        _ATTENTION_CALL.replace("{kv}", "self.num_heads"),
    ),
    "attention_gqa": (
        "hidden_size, num_heads, num_kv_heads, head_dim",
        ["self.num_heads = num_heads", "self.num_kv_heads = num_kv_heads",
         _linear("q_proj", "hidden_size, num_heads * head_dim, bias=False")]
        + [_linear(n, "hidden_size, num_kv_heads * head_dim, bias=False")
           for n in ("k_proj", "v_proj")]
        + [_linear("o_proj", "num_heads * head_dim, hidden_size, bias=False")],
        _ATTENTION_CALL.replace("{kv}", "self.num_kv_heads"),
    ),
    "gated_mlp": (
        "hidden_size, intermediate_size",
        [_linear("gate_proj", "hidden_size, intermediate_size, bias=False"),
         _linear("up_proj", "hidden_size, intermediate_size, bias=False"),
         _linear("down_proj", "intermediate_size, hidden_size, bias=False")],
        "x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight, {activation}",
    ),
    "plain_mlp": (
        "hidden_size, intermediate_size",
        [_linear("fc_in", "hidden_size, intermediate_size"),
         _linear("fc_out", "intermediate_size, hidden_size")],
        "x, self.fc_in.weight, self.fc_in.bias, self.fc_out.weight, self.fc_out.bias",
    ),
    "rmsnorm_proj": (
        "hidden_size, out_features, eps",
        ["self.norm_weight = nn.Parameter(torch.ones(hidden_size))", "self.eps = eps",
         _linear("proj", "hidden_size, out_features, bias=False")],
        "x, self.norm_weight, self.proj.weight, self.eps",
    ),
}


def _model_key(family: str) -> str:
    kernel = FAMILIES[family].kernel
    if kernel == "attention":
        return "attention_gqa" if family.startswith("gqa") else "attention_mha"
    return kernel


def extension_name(kernel: str, backend: str) -> str:
    """Stable per source text, so a changed source never loads a stale build."""
    digest = hashlib.sha256(SOURCES[backend][kernel].encode()).hexdigest()[:10]
    return f"dicepipe_{kernel}_{backend}_{digest}"


def _load_inline(kernel: str, backend: str, function: str) -> str:
    name = extension_name(kernel, backend)
    if backend == "cuda":
        return (
            f'{kernel}_decl = "{kernels_cuda.DECLARATIONS[kernel]}"\n\n'
            f'{kernel}_ext = load_inline(\n    name="{name}",\n    cpp_sources={kernel}_decl,\n'
            f'    cuda_sources={kernel}_source,\n    functions=["{function}"],\n'
            f'    extra_cuda_cflags=["-O3"],\n    verbose=False,\n)\n'
        )
    return (
        f'{kernel}_ext = load_inline(\n    name="{name}",\n    cpp_sources={kernel}_source,\n'
        f'    functions=["{function}"],\n    extra_cflags=["-O3", "-fno-trapping-math", "-fopenmp"],\n'
        f'    extra_ldflags=["-fopenmp"],\n    verbose=False,\n)\n'
    )


def candidate_file(task: Task, variant: dict) -> str:
    """The complete candidate file for `task` with the launch settings `variant`."""
    kernel = FAMILIES[task.family].kernel
    spec = SPECS[task.backend][kernel]
    signature, members, call = _MODELS[_model_key(task.family)]
    call = call.format(causal=task.family.endswith("_causal"),
                       activation=0 if task.family == "mlp_gated_silu" else 1)
    knobs = "".join(f"{name} = {variant[name]!r}\n" for name in spec.knobs)
    body = "".join(f"        {line}\n" for line in members)
    return (
        "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n\n"
        f"{kernel}_source = r'''{SOURCES[task.backend][kernel]}'''\n\n"
        f"{_load_inline(kernel, task.backend, spec.function)}\n"
        f"# launch settings of this variant\n{knobs}\n\n"
        f"class ModelNew(nn.Module):\n"
        f"    def __init__(self, {signature}):\n        super().__init__()\n{body}\n"
        f"    def forward(self, x):\n"
        f"        return {kernel}_ext.{spec.function}(\n            {call},\n"
        f"            {', '.join(spec.knobs)})\n"
    )


class TemplateAuthor:
    """Writes variant `attempt` of the built-in kernel for the task's family; None once the
    family has no further variant (a repeated file would only re-roll the measurement)."""

    name = "templates"

    def fingerprint(self) -> str:
        return "templates"

    def write(self, task: Task, attempt: int) -> Draft | None:
        variants = SPECS[task.backend][FAMILIES[task.family].kernel].variants
        if attempt >= len(variants):
            return None
        return Draft(code=candidate_file(task, variants[attempt]))
