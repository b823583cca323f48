"""Minimal headers: a first compile of each unit against only the torch headers it names.

`load_inline` puts `<torch/extension.h>` on top of main.cpp and `<torch/types.h>` on top of
cuda.cu, and most candidates include `<torch/extension.h>` again in their CUDA source. Those
headers are most of a build: nvcc's two front ends (cudafe++ and cicc) and the host compiler
parse them whole for a kernel that uses a tensor's data pointer, its sizes and `empty_like`.
Measured on this 2-core VM (one relu kernel, sm_90): cudafe++ + cicc + preprocessing of
cuda.cu take 28.1 s with `<torch/types.h>`, 12.5 s with the minimal prelude below; main.cpp
takes 18.6 s with `<torch/extension.h>` (no precompiled header), 5.7 s with its prelude.

The minimal prelude of a unit is, in one header written into the build cache:

- `ATen/core/Tensor.h` (the Tensor class, its methods, ScalarType, TORCH_CHECK);
- `ATen/ops/<name>.h` for every name the unit calls as a free function (`torch::empty(`,
  `at::matmul(`, `cat(`; comments and member calls `x.view(` left out) that names an ATen
  operator: all overloads of that name, so no overload the full headers would offer for a
  call the source makes is missing (a name used another way, say `&at::relu`, fails to
  compile here and the unit compiles with the next tier);
- `ATen/TensorOperators.h` (tensor arithmetic: `x * 2`), read in per-operator mode so that
  it pulls in `empty_like` rather than every operator;
- `ATen/Dispatch.h` where the source uses an `AT_DISPATCH` macro;
- main.cpp only: `torch/csrc/utils/pybind.h` and `torch/csrc/Exceptions.h` (every pybind11
  type caster `<torch/extension.h>` declares comes from these and pybind11's own headers:
  tests/test_harness_preludes.py checks it against the installed torch, because a missing
  caster would compile and fail only when called);
- the `torch` namespace as `<torch/types.h>` makes it: `using namespace at`, std's optional,
  the Dtype alias and the kFloat32-style constants.

For cuda.cu the operator headers are slim copies (`slim_op_text`): each `ATen/ops/<name>.h`
includes ATen's Context, DeviceGuard, TensorUtils and TracerMode headers, which none of its
declarations needs and which are most of what it adds to `ATen/core/Tensor.h` (6.7 MB of
preprocessed text instead of 4.3 MB for a prelude naming `empty`, `linear` and `min`; cudafe++
and cicc 3.6 CPU-s less on a 2-core VM). The copy is the installed header's own text without
those four includes (with `ATen/core/IListRef.h` or `ATen/core/List.h` where its signatures
name those types, so every parameter type is as complete as in the full headers); a header
whose includes are not the generated set is used as it is. A unit that also reaches an
original of a slimmed header through its own includes would define its functions twice: the
first preprocessing pass finds that (`slim_conflicts`) and the unit compiles with the
operators' own headers before cudafe++ runs.

A unit whose minimal compile fails compiles with the next tier (light headers for cuda.cu,
then as written; as written for main.cpp), so a source needing more builds as before, only
later. What changes for a source that compiles both ways: `torch::empty`, `torch::zeros`,
... are ATen's factories (`at::empty`) instead of torch's autograd-aware wrappers of them
(same tensor, no autograd metadata to set: the harness runs candidates under no_grad). A
source that mentions `requires_grad` skips the tier: there the two differ.
"""

from __future__ import annotations

import hashlib
import os
import re
from functools import lru_cache
from pathlib import Path

from .entries import note_repair

# torch/types.h's names in namespace torch, beyond `using namespace at`
_DTYPES = {"kUInt8": "at::kByte", "kInt8": "at::kChar", "kInt16": "at::kShort",
           "kInt32": "at::kInt", "kInt64": "at::kLong", "kUInt16": "at::kUInt16",
           "kUInt32": "at::kUInt32", "kUInt64": "at::kUInt64", "kFloat16": "at::kHalf",
           "kFloat32": "at::kFloat", "kFloat64": "at::kDouble"}
_SHORT = {"kU8": "kUInt8", "kU16": "kUInt16", "kU32": "kUInt32", "kU64": "kUInt64",
          "kI8": "kInt8", "kI16": "kInt16", "kI32": "kInt32", "kI64": "kInt64",
          "kF16": "kFloat16", "kF32": "kFloat32", "kF64": "kFloat64"}

BINDING_HEADERS = ("torch/csrc/utils/pybind.h", "torch/csrc/Exceptions.h")

# `#include <torch/extension.h>` or `<torch/types.h>` on a line of its own
_TORCH_INCLUDE = re.compile(
    r"^[ \t]*#[ \t]*include[ \t]*<torch/(?:extension|types)\.h>[ \t]*(?://[^\n]*)?$", re.M)
# a name called as a free function (`torch::empty(`, `at::matmul (`, `cat(`), not as a member
# (`x.view(`: the Tensor class declares its methods) nor a word of a comment
_CALLED = re.compile(r"(?<![.>\w])([A-Za-z_][A-Za-z0-9_]*)\s*(?:<[^<>;(){}]*>\s*)?\(")
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
# sources where ATen's factories and torch's would differ: leave them to the next tier
_SKIP = re.compile(r"requires_grad")
# what only torch/all.h (torch/extension.h) declares: a source naming it skips both lighter
# tiers, which could only fail
NEEDS_ALL = re.compile(r"\btorch::(?:nn|optim|data|jit|serialize|python|cuda|indexing)\b")
# compiler messages of a declaration the lighter headers lack (EDG's and gcc's wording); a
# lighter tier failing with any other error (a syntax error, an ambiguity) fails for the
# source's own reasons, which more headers do not mend, so the unit goes straight to its
# headers as written (only_missing_declarations)
MISSING_DECLARATION = re.compile(
    r"is undefined|has no member|no instance of|no operator|incomplete type|"
    r"must be a class or namespace|not a class or struct|is not a template|was not declared|"
    r"is not a member|does not name a (?:type|template)|no matching function|no suitable|"
    r"explicit type is missing|has not been declared|no match for")


_ERROR_LINE = re.compile(r"^.*\berror\b[^:\n]*:.*$", re.M | re.I)


def only_missing_declarations(message: str) -> bool:
    """Every error line of a failed compile names a declaration the headers lacked."""
    errors = [line for line in _ERROR_LINE.findall(message)
              if "errors detected" not in line and "error detected" not in line
              and not line.startswith("command failed")]
    return bool(errors) and all(MISSING_DECLARATION.search(line) for line in errors)


@lru_cache(maxsize=4)
def _op_names(include_dir: str) -> frozenset[str]:
    """Names with a public per-operator header, ATen/ops/<name>.h."""
    ops = Path(include_dir) / "ATen" / "ops"
    try:
        return frozenset(name[:-2] for name in os.listdir(ops) if name.endswith(".h"))
    except OSError:
        return frozenset()


def torch_include_dir() -> str:
    from torch.utils import cpp_extension

    return cpp_extension.include_paths()[0]


def prelude_text(source: str, binding: bool, include_dir: str | None = None,
                 slim: Path | None = None) -> str:
    """The minimal prelude for a unit whose text is `source`; with `slim` (a cache folder),
    its operator headers are slim copies written there (`slim_op_text`), each include
    followed by the original it stands for (`slim_originals` reads them back)."""
    include_dir = include_dir or torch_include_dir()
    ops = _op_names(include_dir)
    named = sorted({w for w in _CALLED.findall(_COMMENT.sub(" ", source)) if w in ops})
    lines = ["#pragma once", "// dicepipe: minimal torch headers (harness/build/preludes.py)",
             "#include <ATen/core/Tensor.h>"]
    for name in named:
        copy = _slim_header(f"ATen/ops/{name}.h", include_dir, slim) if slim else None
        lines.append(f'#include "{copy}"{_SLIM_TAG}ATen/ops/{name}.h' if copy
                     else f"#include <ATen/ops/{name}.h>")
    # Tensor arithmetic (x * 2, a + b) with its one operator header, not all of them
    operators = _slim_header("ATen/TensorOperators.h", include_dir, slim) if slim else None
    if operators:
        if "empty_like" not in named:  # the slim copy the operators include, named here too
            empty_like = _slim_header("ATen/ops/empty_like.h", include_dir, slim)
            lines.append(f'#include "{empty_like}"{_SLIM_TAG}ATen/ops/empty_like.h')
        lines.append(f'#include "{operators}"{_SLIM_TAG}ATen/TensorOperators.h')
    else:
        lines += ["#ifndef AT_PER_OPERATOR_HEADERS", "#define AT_PER_OPERATOR_HEADERS",
                  "#include <ATen/TensorOperators.h>", "#undef AT_PER_OPERATOR_HEADERS",
                  "#else", "#include <ATen/TensorOperators.h>", "#endif"]
    if "AT_DISPATCH" in source:
        lines.append("#include <ATen/Dispatch.h>")
    if binding:
        lines += [f"#include <{header}>" for header in BINDING_HEADERS]
    lines += ["#include <optional>", "namespace torch {", "using namespace at;",
              "using std::nullopt;", "using std::optional;", "using Dtype = at::ScalarType;"]
    lines += [f"constexpr auto {name} = {value};" for name, value in _DTYPES.items()]
    lines += [f"constexpr auto {name} = {value};" for name, value in _SHORT.items()]
    lines += ["}  // namespace torch", ""]
    return "\n".join(lines)


def minimal_source(text: str, cache: Path, binding: bool,
                   include_dir: str | None = None, slim: bool = False) -> str | None:
    """`text` with its torch includes replaced by one include of its minimal prelude
    (same line count: compiler messages keep their lines), or None where the tier does not
    apply (no torch include to replace, or a source it would change). `slim`: the prelude's
    operator headers are slim copies (cuda.cu, where the first preprocessing pass checks
    for a second copy: `slim_conflicts`)."""
    if not _TORCH_INCLUDE.search(text) or _SKIP.search(text) or NEEDS_ALL.search(text):
        return None
    folder = cache / "preludes" / "slim" if slim else None
    header = write_prelude(prelude_text(text, binding, include_dir, folder), cache)
    return _TORCH_INCLUDE.sub(f'#include "{header}"', text)


def prelude_path(source: str) -> Path | None:
    """The prelude a source from minimal_source includes (its first quoted include)."""
    match = re.search(r'^#include "([^"\n]+/preludes/[0-9a-f]+\.h)"$', source, re.M)
    return Path(match.group(1)) if match else None


def write_prelude(text: str, cache: Path, folder: Path | None = None) -> Path:
    """The prelude as a file in the cache, named by its content (written once, atomically)."""
    digest = hashlib.sha256(text.encode()).hexdigest()[:24]
    folder = folder or cache / "preludes"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{digest}.h"
    if not path.is_file() or _damaged_prelude(path, digest, cache):
        tmp = folder / f"{digest}.h.{os.getpid()}"
        tmp.write_text(text)
        os.replace(tmp, path)
    return path.resolve()


def _damaged_prelude(path: Path, digest: str, cache: Path) -> bool:
    """A prelude is named by its text's digest, which is its hash: one whose text no longer
    matches its name is noted and written again."""
    try:
        ok = hashlib.sha256(path.read_bytes()).hexdigest()[:24] == digest
    except OSError:
        return True
    if not ok:
        note_repair(cache, path, "its text does not match the digest in its name")
    return not ok


# ------------------------------------------------------------------ slim operator headers

# what every generated ATen/ops/<name>.h includes beyond Tensor.h's own world: no declaration
# of the header needs them (tests compile every slim copy of the installed torch), and they
# are most of its weight (Context.h alone is 1.9 MB preprocessed)
_OPS_HEAVY = ("#include <ATen/Context.h>", "#include <ATen/DeviceGuard.h>",
              "#include <ATen/TensorUtils.h>", "#include <ATen/TracerMode.h>")
# a signature type Tensor.h leaves incomplete -> the header that completes it (DeviceGuard.h
# brought IListRef.h; a call `cat({a, b}, 0)` needs the type complete)
_COMPLETES = ((re.compile(r"ListRef\b"), "#include <ATen/core/IListRef.h>"),
              (re.compile(r"\bc10::List<"), "#include <ATen/core/List.h>"))
_PER_OPERATOR_BLOCK = ("#ifndef AT_PER_OPERATOR_HEADERS\n#include <ATen/Functions.h>\n#else\n"
                       "#include <ATen/ops/empty_like.h>\n#endif\n")
_SLIM_TAG = "  // slim copy of "
_SLIM_LINE = re.compile(r'^#include "[^"\n]+"' + re.escape(_SLIM_TAG) + r"(\S+)$", re.M)
_LINE_MARKER = re.compile(r'^# \d+ "([^"\n]*)"', re.M)


def slim_op_text(text: str) -> str | None:
    """A generated operator header's text without the includes none of its declarations
    needs, or None where its includes are not the generated set (used as it is)."""
    lines = text.split("\n")
    if not set(_OPS_HEAVY) <= set(lines):
        return None
    extra = [include for pattern, include in _COMPLETES if pattern.search(text)]
    out = ["// dicepipe: a slim copy (harness/build/preludes.py slim_op_text)"]
    for line in lines:
        if line in _OPS_HEAVY:
            out += extra
            extra = []
        else:
            out.append(line)
    return "\n".join(out)


@lru_cache(maxsize=4096)
def _installed_slim_text(relative: str, include_dir: str) -> str | None:
    """slim_op_text of an installed operator header, read once a process (builds of one
    builder name the same few operators again and again)."""
    try:
        return slim_op_text((Path(include_dir) / relative).read_text())
    except OSError:
        return None


def _slim_header(relative: str, include_dir: str, folder: Path) -> Path | None:
    """The slim copy of `relative` (under include_dir) written into `folder`, or None."""
    if relative != "ATen/TensorOperators.h":
        slim = _installed_slim_text(relative, include_dir)
        return write_prelude(slim, folder, folder) if slim is not None else None
    try:
        text = (Path(include_dir) / relative).read_text()
    except OSError:
        return None
    empty_like = _slim_header("ATen/ops/empty_like.h", include_dir, folder)
    if empty_like is None or _PER_OPERATOR_BLOCK not in text:
        return None
    return write_prelude(text.replace(_PER_OPERATOR_BLOCK, f'#include "{empty_like}"\n', 1),
                         folder, folder)


def slim_originals(source: str) -> list[str]:
    """The headers (relative to torch's include folder) whose slim copies the prelude that
    `source` includes stands in for."""
    header = prelude_path(source)
    try:
        return _SLIM_LINE.findall(header.read_text()) if header else []
    except OSError:
        return []


def slim_conflicts(preprocessed: str, originals: list[str]) -> list[str]:
    """The originals of slimmed headers that a unit's preprocessed text also includes (each
    would define its functions a second time)."""
    seen = set(_LINE_MARKER.findall(preprocessed))
    return sorted(o for o in originals if any(p.endswith("/" + o) for p in seen))


# ------------------------------------------------------------------ the binding check
#
# The two commonest ways a generated extension fails to build are in main.cpp's bindings:
# `load_inline(functions=[...])` binds a name its cpp_sources never declare (the function is
# defined in cuda_sources only, which main.cpp does not see), or cpp_sources brings its own
# PYBIND11_MODULE beside the one load_inline writes for `functions` (the module is defined
# twice). Either way main.cpp fails with any headers, after parsing all of them, and with the
# minimal headers first it would be compiled twice. The check preprocesses main.cpp as
# written up to its generated binding block (-E -dD: the same text, headers and flags; about
# 2 CPU-s) and decides from the tokens, exactly: a bound name that is no token of the
# result (macro definitions included) is declared nowhere before the block; a result that
# defines the module's own init function (`PyInit_<name>`) meets a second definition in the
# block. Both fail as written, so the build fails there. A bound name the headers spell
# (`forward`: std::forward) sends main.cpp straight to its full headers: the minimal try
# would fail for want of a declaration only they can hold.

_BLOCK_START = "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {"
_BOUND = re.compile(r'^m\.def\("[^"\\\n]*", (?:torch::wrap_pybind_function\(([A-Za-z_]\w*)\)'
                    r'|([A-Za-z_]\w*)), "[^\n]*\);$')
_WORD = re.compile(r"[A-Za-z_]\w*")
_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')


def binding_block(text: str) -> tuple[str, list[str]] | None:
    """(main.cpp's text before the binding block load_inline generates, the names the block
    binds), or None where the source has no such block."""
    start = text.rfind("\n" + _BLOCK_START + "\n")
    if start < 0:
        return None
    lines = text[start + 1:].rstrip("\n").split("\n")[1:]
    if not lines or lines[-1] != "}":
        return None
    names = []
    for line in lines[:-1]:
        match = _BOUND.match(line)
        if match is None:
            return None  # not the block load_inline writes
        names.append(match.group(1) or match.group(2))
    return text[:start + 1], names


def binding_suspects(prefix: str, names: list[str]) -> tuple[list[str], bool]:
    """What the check looks at: the bound names the text before the block never spells
    outside comments and strings (builtins, `__x`, left out), and whether that text names
    PYBIND11_MODULE itself."""
    code = _STRING.sub(" ", _COMMENT.sub(" ", prefix))
    spelled = set(_WORD.findall(code))
    unspelled = sorted({n for n in names if n not in spelled and not n.startswith("__")})
    return unspelled, "PYBIND11_MODULE" in spelled


def has_token(preprocessed: str, name: str) -> bool:
    return re.search(rf"(?<![\w$]){re.escape(name)}(?![\w$])", preprocessed) is not None
