"""The kernel-infilling split of a solution file into prefix + core + suffix.

core = the top-level assignment of the operator source string (the string that holds
`#include <torch/extension.h>`, kernels and host functions); prefix = everything before it
(imports, comments), suffix = everything after (declarations, load_inline, ModelNew).
The three pieces concatenate to the original file exactly."""

from __future__ import annotations

import ast

_MARKERS = ("#include", "__global__", "torch::Tensor")


def _is_source_assignment(node: ast.stmt) -> bool:
    if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
        return False
    value = node.value
    return (isinstance(value, ast.Constant) and isinstance(value.value, str)
            and "#include" in value.value and any(m in value.value for m in _MARKERS))


def split_for_infilling(code: str) -> tuple[str, str, str] | None:
    """(prefix, core, suffix) with prefix + core + suffix == code, or None if the file has
    no top-level operator source assignment."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return None
    lines = code.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    for node in tree.body:
        if _is_source_assignment(node):
            start = offsets[node.lineno - 1]
            end = offsets[node.end_lineno - 1] + _char_offset(lines[node.end_lineno - 1], node.end_col_offset)
            # the rest of the closing line (a comment, the newline) belongs to the core
            line_end = offsets[node.end_lineno]
            rest = code[end:line_end].strip()
            if not rest or rest.startswith("#"):
                end = line_end
            return code[:start], code[start:end], code[end:]
    return None


def _char_offset(line: str, utf8_col: int) -> int:
    """ast column offsets count UTF-8 bytes; convert to characters."""
    return len(line.encode()[:utf8_col].decode(errors="ignore"))
