"""What each stage depends on, derived rather than listed by hand: the package files a stage
module runs (its import closure) and the params keys of the harness that change a measurement.

Both runners use these: `workflow/rules/common.smk` turns them into rule inputs and tracked
params; `dvc.yaml` lists the same keys and folders, and tests/test_parity.py checks that its
deps cover every file of the closure, so a stage that starts importing a new module fails a
test until both runners re-run it when that module changes.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
PACKAGE = PACKAGE_DIR.name
# Every stage runs through the CLI, which loads and validates params.yaml with these before
# the stage starts. The dispatcher cli.py itself is left out: adding a subcommand must not
# re-run every stage.
ENTRY_MODULES = (f"{PACKAGE}.config",)
# The dispatcher, also when a stage starts it again (`-m dicepipe.cli` under torchrun).
DISPATCHER = f"{PACKAGE}.cli"


def module_file(name: str, package_dir: Path = PACKAGE_DIR) -> Path | None:
    """The source file of a dotted module name inside the package, or None."""
    parts = name.split(".")
    if parts[0] != PACKAGE:
        return None
    base = Path(package_dir).joinpath(*parts[1:])
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _module_name(path: Path, package_dir: Path) -> str:
    rel = path.relative_to(package_dir).with_suffix("")
    parts = [PACKAGE, *rel.parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve_relative(current: str, is_package: bool, level: int, module: str | None) -> str:
    base = current.split(".") if is_package else current.split(".")[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([module] if module else []))


def direct_imports(path: Path, package_dir: Path = PACKAGE_DIR) -> set[str]:
    """Package modules a file imports anywhere in its body (function-local imports count: a
    stage imports torch-heavy code inside `run`), plus modules it starts by name
    (`python -m kernelharness.worker.main` as a string constant)."""
    name = _module_name(path, package_dir)
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = (_resolve_relative(name, is_package, node.level, node.module)
                      if node.level else node.module or "")
            found.add(target)
            # `from pkg import sub` imports the submodule when `sub` is one
            found.update(f"{target}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            parts = node.value.split(".")
            if parts[0] == PACKAGE and len(parts) > 1 and all(x.isidentifier() for x in parts):
                found.add(node.value)
    return {m for m in found if module_file(m, package_dir) is not None}


def _with_parents(module: str) -> list[str]:
    """Importing a.b.c runs a/__init__, a/b/__init__ and then c."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def import_closure(module: str, package_dir: Path = PACKAGE_DIR) -> tuple[str, ...]:
    """Every package module that importing `module` (and calling into it) can run: sorted names."""
    seen: set[str] = set()
    todo = list(_with_parents(module))
    while todo:
        current = todo.pop()
        path = module_file(current, package_dir)
        if current in seen or current == DISPATCHER or path is None:
            continue
        seen.add(current)
        for imported in direct_imports(path, package_dir):
            todo.extend(_with_parents(imported))
    return tuple(sorted(seen))


def stage_code(stage_module: str, package_dir: Path | str = "workflow/dicepipe") -> list[str]:
    """Files a stage runs, as paths under `package_dir` (the package folder as seen from the
    repository root, where both runners start): the closure of dicepipe.stages.<stage_module>
    and of what the CLI runs before it (config loading)."""
    package_dir = Path(package_dir)
    modules = set(import_closure(f"{PACKAGE}.stages.{stage_module}", package_dir))
    for entry in ENTRY_MODULES:
        modules |= set(import_closure(entry, package_dir))
    return sorted(str(module_file(m, package_dir)) for m in modules)


def uncovered(files: list[str], deps: list[str]) -> list[str]:
    """Files not covered by any dep (a dep covers itself and, as a folder, what lies under it)."""
    return [f for f in files
            if not any(f == d or f.startswith(d.rstrip("/") + "/") for d in deps)]


# What a row means beyond its settings: the harness's method version (kernelharness/method.py),
# tracked by every measuring stage in both runners instead of the harness's source files (a
# package of its own, outside every stage's import closure). Snakemake tracks it as this
# pseudo key among a rule's params; DVC reads the constant from the file, a Python params file.
HARNESS_METHOD_KEY = "kernelharness.METHOD_VERSION"
HARNESS_METHOD_FILE = "harness/src/kernelharness/method.py"


def harness_param_keys() -> list[str]:
    """What a verify/augment/evaluate row or an RL reward depends on, as tracked keys: the
    params of the harness that change a row (`harness.measure`, tracked whole; the key a
    stored row is reused under, kernelharness.session.stored_results) and the harness's
    method version (HARNESS_METHOD_KEY). `harness.run` (cache folder, build workers,
    precompiled headers, build timeout) only changes how a row is made: neither runner tracks
    it, so changing it re-runs nothing. How a row is judged (`robust`) is each judging stage's
    own key, tracked with its section."""
    from kernelharness.schema import settings_schema

    section = settings_schema()["properties"]
    return [f"harness.{name}" for name in section if name == "measure"] + [HARNESS_METHOD_KEY]


def harness_method_version(root: Path | str = ".") -> int:
    """The method version as DVC reads it: the constant in `root`/HARNESS_METHOD_FILE (the
    checkout both runners start in), else the installed package's."""
    path = Path(root) / HARNESS_METHOD_FILE
    if path.is_file():
        for node in ast.parse(path.read_text(), str(path)).body:
            if (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and getattr(node.targets[0], "id", None) == "METHOD_VERSION"):
                return ast.literal_eval(node.value)
    from kernelharness.method import METHOD_VERSION

    return METHOD_VERSION
