"""Task families: KernelBench-format reference programs written the way decoder blocks of
mainstream LLMs are written in eager PyTorch (projections, explicit softmax attention with a
built mask and repeated kv heads, gated or plain MLPs, RMSNorm before a projection).

A reference program is a module-level block of size constants, `class Model`,
`get_inputs()` and `get_init_inputs()`. Everything shape-dependent is in the constants, so
one family's programs differ only there."""

from __future__ import annotations

from dataclasses import dataclass

from .shapes import BlockShape

RMS_EPS = 1e-6

_ATTENTION_INIT_GQA = '''
    def __init__(self, hidden_size, num_heads, num_kv_heads, head_dim):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)
'''

_ATTENTION_INIT_MHA = '''
    def __init__(self, hidden_size, num_heads, head_dim):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)
'''

_ATTENTION_FORWARD = '''
    def forward(self, x):
        batch, seq, _ = x.shape
        q = self.q_proj(x).view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, seq, {kv}, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq, {kv}, self.head_dim).transpose(1, 2){repeat}
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim){mask}
        probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs, v)
        out = out.transpose(1, 2).reshape(batch, seq, self.num_heads * self.head_dim)
        return self.o_proj(out)
'''

_REPEAT_KV = '''
        # every group of query heads shares one key/value head
        group = self.num_heads // self.num_kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)'''

_CAUSAL_MASK = '''
        future = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=x.device), diagonal=1)
        scores = scores.masked_fill(future, float("-inf"))'''

_MLP_GATED = '''
    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj({act} * self.up_proj(x))
'''

_MLP_PLAIN = '''
    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.fc_in = nn.Linear(hidden_size, intermediate_size)
        self.fc_out = nn.Linear(intermediate_size, hidden_size)

    def forward(self, x):
        return self.fc_out(F.gelu(self.fc_in(x)))
'''

_RMSNORM_PROJ = '''
    def __init__(self, hidden_size, out_features, eps):
        super().__init__()
        self.norm_weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.proj = nn.Linear(hidden_size, out_features, bias=False)

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        normed = x * torch.rsqrt(variance + self.eps)
        return self.proj(self.norm_weight * normed)
'''

_IMPORTS = "import math\n\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"


@dataclass(frozen=True)
class Family:
    name: str
    kernel: str  # which kernel source (templates) serves it
    level: int  # KernelBench level: 3 = whole block, 2 = a fusion of a few operators
    summary: str


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("mha", "attention", 3, "multi-head self-attention block"),
    Family("mha_causal", "attention", 3, "causal multi-head self-attention block"),
    Family("gqa", "attention", 3, "grouped-query self-attention block"),
    Family("gqa_causal", "attention", 3, "causal grouped-query self-attention block"),
    Family("mlp_gated_silu", "gated_mlp", 3, "gated MLP with SiLU (SwiGLU)"),
    Family("mlp_gated_gelu", "gated_mlp", 3, "gated MLP with tanh-GELU (GeGLU)"),
    Family("mlp_plain", "plain_mlp", 3, "two-layer MLP with GELU and biases"),
    Family("rmsnorm_proj", "rmsnorm_proj", 2, "RMSNorm followed by the fused QKV projection"),
)}


def applies(family: str, shape: BlockShape) -> bool:
    """Grouped-query families need fewer kv heads than query heads."""
    if family.startswith("gqa"):
        return shape.kv_heads < shape.heads
    return True


def relevant_dims(family: str, shape: BlockShape) -> dict[str, int]:
    """The dims a family's program depends on (task identity, the `shape` record)."""
    dims = {"batch": shape.batch, "seq": shape.seq, "hidden": shape.hidden}
    kernel = FAMILIES[family].kernel
    if kernel == "attention":
        dims.update(heads=shape.heads, head_dim=shape.head_dim)
        if family.startswith("gqa"):
            dims["kv_heads"] = shape.kv_heads
    elif kernel in ("gated_mlp", "plain_mlp"):
        dims["intermediate"] = shape.intermediate
    else:
        dims["out_features"] = qkv_width(shape)
    return dims


def qkv_width(shape: BlockShape) -> int:
    return (shape.heads + 2 * shape.kv_heads) * shape.head_dim


def _constants(names_values: list[tuple[str, object]]) -> str:
    return "".join(f"{name} = {value!r}\n" for name, value in names_values)


def _attention_program(family: str, shape: BlockShape, source: str) -> str:
    grouped = family.startswith("gqa")
    consts = [("batch_size", shape.batch), ("seq_len", shape.seq), ("hidden_size", shape.hidden),
              ("num_heads", shape.heads)]
    if grouped:
        consts.append(("num_kv_heads", shape.kv_heads))
    consts.append(("head_dim", shape.head_dim))
    init_args = "[hidden_size, num_heads, num_kv_heads, head_dim]" if grouped else \
        "[hidden_size, num_heads, head_dim]"
    forward = _ATTENTION_FORWARD.format(
        kv="self.num_kv_heads" if grouped else "self.num_heads",
        repeat=_REPEAT_KV if grouped else "",
        mask=_CAUSAL_MASK if family.endswith("_causal") else "",
    )
    body = (_ATTENTION_INIT_GQA if grouped else _ATTENTION_INIT_MHA) + forward
    return _program(FAMILIES[family].summary, source, consts, body,
                    "torch.randn(batch_size, seq_len, hidden_size)", init_args)


def _program(summary: str, source: str, consts, body: str, inputs: str, init_args: str) -> str:
    return (
        f'"""{summary[0].upper()}{summary[1:]} ({source} shapes)."""\n\n'
        f"{_IMPORTS}\n{_constants(consts)}\n\n"
        f"class Model(nn.Module):{body}\n\n"
        f"def get_inputs():\n    return [{inputs}]\n\n\n"
        f"def get_init_inputs():\n    return {init_args}\n"
    )


def reference_program(family: str, shape: BlockShape, source: str) -> str:
    """The KernelBench reference program of `family` at `shape` (`source` names the config)."""
    kernel = FAMILIES[family].kernel
    if kernel == "attention":
        return _attention_program(family, shape, source)
    x = "torch.randn(batch_size, seq_len, hidden_size)"
    summary = FAMILIES[family].summary
    base = [("batch_size", shape.batch), ("seq_len", shape.seq), ("hidden_size", shape.hidden)]
    if kernel == "gated_mlp":
        act = ("F.silu(self.gate_proj(x))" if family == "mlp_gated_silu"
               else 'F.gelu(self.gate_proj(x), approximate="tanh")')
        return _program(summary, source, base + [("intermediate_size", shape.intermediate)],
                        _MLP_GATED.format(act=act), x, "[hidden_size, intermediate_size]")
    if kernel == "plain_mlp":
        return _program(summary, source, base + [("intermediate_size", shape.intermediate)],
                        _MLP_PLAIN, x, "[hidden_size, intermediate_size]")
    consts = base + [("out_features", qkv_width(shape)), ("eps", RMS_EPS)]
    return _program(summary, source, consts, _RMSNORM_PROJ, x, "[hidden_size, out_features, eps]")
