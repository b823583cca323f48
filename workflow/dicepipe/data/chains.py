"""Elementwise chains: the tiny scale's learnable kernel family.

A chain is a short sequence of elementwise steps (an affine map, ReLU, a clamp, ...) with
constants, applied to one float32 tensor. Each step is one line of the PyTorch reference's
`forward` and one line of the C++ kernel's loop body (under the reference line as a
comment), so a reference and its kernel are aligned line for line: a small model can learn
the copy and the translation, and a held-out chain differs
from the trained ones only in ways it can generalise (other constants, another order, another
shape). The kernel fuses the chain into one pass over memory where PyTorch eager makes a pass
and a temporary per operator, so with four or more eager operators it is several times faster
on a CPU (data/seed/README.md).

Everything here is deterministic for a seed: `corpus_chains` writes the shipped corpus
(data/seed/chains, `dicepipe pretrain-base --write-corpus`), `pretraining_examples` the base
model's pretraining data, which never holds a corpus chain (`chain_key`).
"""

from __future__ import annotations

import ast
import hashlib
import random
from dataclasses import dataclass

# name -> (reference line, kernel line, eager operators it costs PyTorch). The kernel lines
# are branch-free (std::max/min/abs) and build with -fno-trapping-math, under which GCC
# vectorises every chain (with the default -ftrapping-math it turns some clamps and ReLUs
# next to other steps into branches, and such a kernel is slower than eager). A slope
# below 1 makes max(v, s * v) exactly leaky_relu. Constants are
# filled in from the step's draw: a = scale, sign and b = shift, s = slope, lo/hi = clamp bounds;
# i and o are the step's input and output names (x, x1, x2, ...: `Step.line`).
STEPS: dict[str, tuple[str, str, int]] = {
    "affine": ("{o} = {i} * {a} {sign} {b}", "float {o} = {i} * {a}f {sign} {b}f;", 2),
    "scale": ("{o} = {i} * {a}", "float {o} = {i} * {a}f;", 1),
    "shift": ("{o} = {i} {sign} {b}", "float {o} = {i} {sign} {b}f;", 1),
    "relu": ("{o} = torch.relu({i})", "float {o} = std::max({i}, 0.0f);", 1),
    "leaky_relu": ("{o} = torch.nn.functional.leaky_relu({i}, {s})", "float {o} = std::max({i}, {i} * {s}f);", 1),
    "clamp": ("{o} = torch.clamp({i}, {lo}, {hi})", "float {o} = std::min(std::max({i}, {lo}f), {hi}f);", 1),
    "abs": ("{o} = torch.abs({i})", "float {o} = std::abs({i});", 1),
    "square": ("{o} = {i} * {i}", "float {o} = {i} * {i};", 1),
}
SCALES = ("0.25", "0.5", "0.75", "1.5", "2.0", "3.0", "-0.5", "-2.0")
SHIFTS = ("0.1", "0.5", "1.0", "2.0")
SLOPES = ("0.01", "0.05", "0.1", "0.2")
LOWS = ("-3.0", "-2.0", "-1.0", "-0.5", "0.0")
HIGHS = ("0.5", "1.0", "2.0", "3.0")
SHAPES = ((128, 1024), (256, 512), (256, 1024), (512, 512), (64, 2048), (128, 2048))
# The CUDA corpus's shapes, one for each of SHAPES (same draws, 64x the elements): 32-64 MB
# a tensor, so PyTorch eager's passes over memory, not its kernel launches, set its time
# (a five-operator reference takes about 0.1-0.2 ms on an H100, at or above the harness's
# launch-bound floor), while drawing the inputs on the host stays quick.
CUDA_SHAPES = ((1024, 8192), (2048, 4096), (2048, 8192), (4096, 4096), (512, 16384), (1024, 16384))


@dataclass(frozen=True)
class Step:
    op: str
    constants: tuple[tuple[str, str], ...] = ()  # (name, value) in the templates' names

    def line(self, index: int, which: int, named: bool) -> str:
        """Step `index` (1-based) of a chain as its reference line (which=0) or kernel line
        (which=1). Named: it reads x{index-1} (x for the first step) and writes x{index}, and
        the kernel declares it (`float x2 = ...`); in place: `x = ...` in the reference,
        `v = ...` in the kernel."""
        if named:
            names = {"i": f"x{index - 1}" if index > 1 else "x", "o": f"x{index}"}
            return STEPS[self.op][which].format(**dict(self.constants), **names)
        var = "v" if which else "x"
        return STEPS[self.op][which].removeprefix("float ").format(**dict(self.constants), i=var, o=var)


@dataclass(frozen=True)
class Chain:
    steps: tuple[Step, ...]
    shape: tuple[int, int]

    @property
    def eager_ops(self) -> int:
        return sum(STEPS[s.op][2] for s in self.steps)

    @property
    def name(self) -> str:
        """A file stem: the ops in order and a short digest of the whole chain."""
        digest = hashlib.sha256(repr(self).encode()).hexdigest()[:6]
        return "_".join(s.op for s in self.steps) + "_" + digest

    @property
    def level(self) -> int:
        return 1 if len(self.steps) == 1 else 2

    def reference(self, named: bool = False) -> str:
        body = "".join(f"        {s.line(k, 0, named)}\n" for k, s in enumerate(self.steps, 1))
        rows, cols = self.shape
        return (
            "import torch\nimport torch.nn as nn\n\n\n"
            "class Model(nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n\n"
            "    def forward(self, x):\n"
            f"{body}"
            f"        return x{len(self.steps) if named else ''}\n\n\n"
            "def get_inputs():\n"
            f"    return [torch.randn({rows}, {cols})]\n\n\n"
            "def get_init_inputs():\n"
            "    return []\n"
        )

    def kernel(self, named: bool = False, backend: str = "cpu") -> str:
        """The fused kernel file: C++ with OpenMP on cpu, a CUDA kernel on cuda. Both have
        the same loop body, line for line (the step lines are valid host and device code:
        load_inline compiles CUDA with --expt-relaxed-constexpr, so std::max/min run on the
        device), so what a model learned on one form carries to the other."""
        # each C++ line under the reference line it computes, as a comment: the model copies
        # the reference's step, then translates the line right above (named: with the
        # reference's names, so step k is found by its name xk, a one-hop copy)
        body = "".join(f"        // {s.line(k, 0, named)}\n        {s.line(k, 1, named)}\n"
                       for k, s in enumerate(self.steps, 1))
        arg, var, last = ("input", "x", f"x{len(self.steps)}") if named else ("x", "v", "v")
        if backend == "cuda":
            return _cuda_kernel(body, arg, var, last)
        if backend != "cpu":
            raise ValueError(f"no chain kernel form for backend {backend!r} (cpu or cuda)")
        return (
            "import torch\nimport torch.nn as nn\n"
            "from torch.utils.cpp_extension import load_inline\n\n"
            'chain_source = r"""\n'
            "#include <torch/extension.h>\n\n"
            f"torch::Tensor chain_cpu(torch::Tensor {arg}) {{\n"
            f"    {arg} = {arg}.contiguous();\n"
            f"    auto out = torch::empty_like({arg});\n"
            f"    const float* px = {arg}.data_ptr<float>();\n"
            "    float* po = out.data_ptr<float>();\n"
            f"    int64_t n = {arg}.numel();\n"
            "    #pragma omp parallel for\n"
            "    for (int64_t i = 0; i < n; ++i) {\n"
            f"        float {var} = px[i];\n"
            f"{body}"
            f"        po[i] = {last};\n"
            "    }\n"
            "    return out;\n"
            "}\n"
            '"""\n\n'
            'chain_ext = load_inline(name="chain_ext", cpp_sources=chain_source, functions=["chain_cpu"],\n'
            '                        extra_cflags=["-O3", "-fno-trapping-math", "-fopenmp"],\n'
            '                        extra_ldflags=["-fopenmp"], verbose=False)\n\n\n'
            "class ModelNew(nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n\n"
            "    def forward(self, x):\n"
            "        return chain_ext.chain_cpu(x)\n"
        )


def _cuda_kernel(body: str, arg: str, var: str, last: str) -> str:
    """The CUDA form of a chain's kernel file, in the layout of the prompt's CUDA example
    (data/prompts.py): one thread per element, the C++ form's loop body inside `if (i < n)`."""
    return (
        "import torch\nimport torch.nn as nn\n"
        "from torch.utils.cpp_extension import load_inline\n\n"
        'chain_source = r"""\n'
        "#include <torch/extension.h>\n\n"
        "__global__ void chain_kernel(const float* px, float* po, int64_t n) {\n"
        "    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;\n"
        "    if (i < n) {\n"
        f"        float {var} = px[i];\n"
        f"{body}"
        f"        po[i] = {last};\n"
        "    }\n"
        "}\n\n"
        f"torch::Tensor chain_cuda(torch::Tensor {arg}) {{\n"
        f"    {arg} = {arg}.contiguous();\n"
        f"    auto out = torch::empty_like({arg});\n"
        f"    int64_t n = {arg}.numel();\n"
        "    int threads = 256;\n"
        "    chain_kernel<<<(n + threads - 1) / threads, threads>>>(\n"
        f"        {arg}.data_ptr<float>(), out.data_ptr<float>(), n);\n"
        "    return out;\n"
        "}\n"
        '"""\n\n'
        'chain_decl = "torch::Tensor chain_cuda(torch::Tensor x);"\n\n'
        'chain_ext = load_inline(name="chain_ext", cpp_sources=chain_decl, cuda_sources=chain_source,\n'
        '                        functions=["chain_cuda"], verbose=False)\n\n\n'
        "class ModelNew(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n\n"
        "    def forward(self, x):\n"
        "        return chain_ext.chain_cuda(x)\n"
    )


def draw_step(rng: random.Random, op: str) -> Step:
    if op in ("affine", "scale"):
        constants = [("a", rng.choice(SCALES))]
        if op == "affine":
            constants += [("sign", rng.choice("+-")), ("b", rng.choice(SHIFTS))]
    elif op == "shift":
        constants = [("sign", rng.choice("+-")), ("b", rng.choice(SHIFTS))]
    elif op == "leaky_relu":
        constants = [("s", rng.choice(SLOPES))]
    elif op == "clamp":
        constants = [("lo", rng.choice(LOWS)), ("hi", rng.choice(HIGHS))]
    else:
        constants = []
    return Step(op, tuple(constants))


def draw_chain(rng: random.Random, min_steps: int, max_steps: int) -> Chain:
    ops = sorted(STEPS)
    length = rng.randint(min_steps, max_steps)
    steps = []
    for _ in range(length):
        choices = [o for o in ops if not steps or o != steps[-1].op]  # no op twice in a row
        steps.append(draw_step(rng, rng.choice(choices)))
    return Chain(tuple(steps), rng.choice(SHAPES))


def chain_key(chain: Chain) -> tuple:
    """What makes two chains the same task for the held-out rule: the steps and constants
    (the shape is not part of it: a kernel reads sizes from its input)."""
    return chain.steps


def corpus_chains(count: int = 20, seed: int = 0, min_eager_ops: int = 5, backend: str = "cpu",
                  exclude: frozenset | set = frozenset()) -> list[Chain]:
    """A shipped corpus: `count` distinct chains of 3-4 steps, each costing PyTorch eager at
    least `min_eager_ops` operators (so its fused kernel clears assemble's threshold), none
    whose key is in `exclude`. On cuda, the same draws at CUDA_SHAPES."""
    rng = random.Random(f"chains-corpus:{seed}")
    chains: dict[tuple, Chain] = {}
    while len(chains) < count:
        chain = draw_chain(rng, 3, 4)
        if chain.eager_ops >= min_eager_ops and chain_key(chain) not in exclude:
            if backend == "cuda":
                chain = Chain(chain.steps, CUDA_SHAPES[SHAPES.index(chain.shape)])
            chains.setdefault(chain_key(chain), chain)
    return sorted(chains.values(), key=lambda c: c.name)


def pretraining_chains(count: int, seed: int, exclude: set[tuple], max_steps: int = 4) -> list[Chain]:
    """`count` distinct chains of 1 to `max_steps` steps, none of whose keys is in `exclude`."""
    rng = random.Random(f"chains-pretrain:{seed}")
    chains: dict[tuple, Chain] = {}
    while len(chains) < count:
        chain = draw_chain(rng, 1, max_steps)
        key = chain_key(chain)
        if key not in exclude:
            chains.setdefault(key, chain)
    return list(chains.values())


def task_fingerprint(reference_code: str) -> str | None:
    """The held-out rule's identity of a KernelBench-format program: the normalised source
    (ast.unparse, so comments, blank lines and quoting do not count) of its `Model` class and
    `get_inputs` function. None when the code does not parse or defines neither."""
    try:
        tree = ast.parse(reference_code)
    except (SyntaxError, ValueError):
        return None
    parts = [ast.unparse(node) for node in tree.body
             if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name in ("Model", "get_inputs")]
    if not parts:
        return None
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()
