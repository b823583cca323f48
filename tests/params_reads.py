"""Which params.yaml keys a stage reads, found in the code it runs (for
tests/test_params_reads.py; no tests here).

A stage gets the validated params as `run(args, params)`. Starting there, the scan follows
the value through the stage's import closure (dicepipe.deps.import_closure): names bound to a
part of params (`settings = params["augment"]`), subscripts and `.get` (`params["verify"]
["repeats"]`, a key it cannot name statically is `*`), calls into package functions (the
part is bound to the callee's parameter and followed there; string constants too, so
`stage_settings(params, "rl", stage=STAGE)` reads `rl.stages.rl_infill`), and package
objects built from parts (`Scale(model_spec=params["models"][...])`: a part is read only
where an attribute of the object is used). A part is *read* where its value is used as a
whole: passed to code outside the package, iterated, copied, formatted, compared, returned
to a caller that uses it. Not reads: `key in part` (whether a key exists: the stage's own
`foreach`/wildcard decides that), and whatever a `raise` statement builds (an error
message). Paths the schema cannot hold (`sft.stages.*`) are dropped: a resolver that looks
for a layer a section does not have reads nothing there.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

STAR = "*"


@dataclass(frozen=True)
class Part:
    """A part of params at `path`."""

    path: tuple


@dataclass(frozen=True)
class Const:
    value: str


@dataclass(frozen=True)
class Struct:
    """A package object built from parts (its keyword arguments), read attribute by attribute."""

    attrs: tuple  # ((name, value), ...)

    def get(self, name):
        return dict(self.attrs).get(name)


@dataclass
class _Module:
    name: str
    tree: ast.Module
    functions: dict = field(default_factory=dict)  # name -> FunctionDef; "Class.method" too
    classes: set = field(default_factory=set)
    constants: dict = field(default_factory=dict)  # module-level NAME = "text"
    imports: dict = field(default_factory=dict)  # local name -> (module, name)


class ParamsReads:
    """Reads of one stage: `ParamsReads(package_dir).stage("verify")` -> set of paths."""

    def __init__(self, package_dir: Path, harness_dir: Path | None = None):
        from dicepipe.deps import module_file

        self.package_dir = Path(package_dir)
        # the harness package's code is read too (HarnessSettings.from_params reads params)
        self.harness_dir = Path(harness_dir) if harness_dir else (
            Path(__file__).resolve().parent.parent / "harness" / "src" / "kernelharness")

        def find(name: str, package_dir: Path):
            if name.split(".")[0] == "kernelharness":
                base = self.harness_dir.joinpath(*name.split(".")[1:])
                for candidate in (base / "__init__.py", base.with_suffix(".py")):
                    if candidate.is_file():
                        return candidate
                return None
            return module_file(name, package_dir)

        self._module_file = find
        self._modules: dict[str, _Module] = {}

    # --- the package's functions, classes and imports -------------------------------------

    def _module(self, name: str) -> _Module | None:
        if name in self._modules:
            return self._modules[name]
        from dicepipe.deps import _resolve_relative

        path = self._module_file(name, self.package_dir)
        if path is None:
            return None
        tree = ast.parse(path.read_text(), str(path))
        mod = _Module(name, tree)
        is_package = path.name == "__init__.py"
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                mod.functions[node.name] = node
            elif isinstance(node, ast.ClassDef):
                mod.classes.add(node.name)
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        mod.functions[f"{node.name}.{item.name}"] = item
            elif (isinstance(node, ast.Assign) and len(node.targets) == 1
                  and isinstance(node.targets[0], ast.Name)
                  and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
                mod.constants[node.targets[0].id] = node.value.value
        for node in ast.walk(tree):  # function-local imports count (stages import in `run`)
            if isinstance(node, ast.ImportFrom):
                target = (_resolve_relative(name, is_package, node.level, node.module)
                          if node.level else node.module or "")
                for alias in node.names:
                    mod.imports[alias.asname or alias.name] = (target, alias.name)
        self._modules[name] = mod
        return mod

    def _lookup(self, mod: _Module, name: str, depth: int = 0):
        """(module, kind, node) that `name` means in `mod`: kind "function" or "class"."""
        if name in mod.functions:
            return mod, "function", mod.functions[name]
        if name in mod.classes:
            return mod, "class", name
        if name in mod.imports and depth < 5:
            target, original = mod.imports[name]
            other = self._module(target)
            if other is not None:
                return self._lookup(other, original, depth + 1)
            sub = self._module(f"{target}.{original}")  # `from pkg import module`
            if sub is not None:
                return sub, "module", None
        return None

    # --- the scan -----------------------------------------------------------------------------

    def stage(self, stage_module: str) -> set[tuple]:
        from dicepipe.deps import PACKAGE

        mod = self._module(f"{PACKAGE}.stages.{stage_module}")
        self.reads: set[tuple] = set()
        self._done: dict = {}
        self._active: set = set()
        self._call(mod, mod.functions["run"], {"params": Part(())})
        return set(self.reads)

    def _call(self, mod: _Module, func, bound: dict):
        key = (mod.name, func.name, func.lineno, tuple(sorted(bound.items(), key=str)))
        if key in self._done:
            return self._done[key]
        if key in self._active:
            return None
        self._active.add(key)
        args = func.args
        names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
        names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
        scope = _Scope(self, mod, {**dict.fromkeys(names), **bound})
        for stmt in func.body:
            scope.stmt(stmt)
        self._active.discard(key)
        self._done[key] = scope.returned
        return scope.returned

    def _invoke(self, mod: _Module, func, call: ast.Call, scope: _Scope, skip_first: bool):
        """Bind the call's arguments to the callee's parameters and scan the callee."""
        args = func.args
        names = [a.arg for a in args.posonlyargs + args.args]
        if skip_first and names:
            names = names[1:]
        bound = {}
        for name, arg in zip(names, call.args):
            if isinstance(arg, ast.Starred):
                scope.use(arg)
                continue
            bound[name] = scope.expr(arg)
        for arg in call.args[len(names):]:
            scope.use(arg)
        known = set(names) | {a.arg for a in args.kwonlyargs}
        for kw in call.keywords:
            if kw.arg is None or kw.arg not in known:
                scope.use(kw.value)
            else:
                bound[kw.arg] = scope.expr(kw.value)
        bound = {k: v for k, v in bound.items() if v is not None}
        if not any(isinstance(v, (Part, Struct)) for v in bound.values()):
            return None  # nothing of params reaches it
        return self._call(mod, func, bound)


class _Scope:
    """One function body being scanned: local names bound to parts, constants or objects."""

    def __init__(self, scan: ParamsReads, mod: _Module, env: dict):
        self.scan, self.mod, self.env = scan, mod, env
        self.returned = None

    def record(self, value) -> None:
        if isinstance(value, Part):
            self.scan.reads.add(value.path)
        elif isinstance(value, Struct):
            for _, v in value.attrs:
                self.record(v)

    def use(self, node) -> None:
        if node is not None:
            self.record(self.expr(node))

    # statements
    def stmt(self, node) -> None:
        if isinstance(node, ast.Raise):
            return  # an error message reads nothing a result depends on
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = self.expr(node.value) if node.value is not None else None
            if len(targets) == 1 and isinstance(targets[0], ast.Name):
                self.env[targets[0].id] = value
            else:
                self.record(value)
                for target in targets:
                    self._unbind(target)
            return
        if isinstance(node, ast.AugAssign):
            self.use(node.value)
            return
        if isinstance(node, ast.Return):
            value = self.expr(node.value) if node.value is not None else None
            if self.returned is None:
                self.returned = value
            else:
                self.record(value)
            return
        if isinstance(node, (ast.For, ast.AsyncFor)):
            self.use(node.iter)
            self._unbind(node.target)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                self.use(item.context_expr)
                if item.optional_vars is not None:
                    self._unbind(item.optional_vars)
        elif isinstance(node, (ast.If, ast.While)):
            self.use(node.test)
        elif isinstance(node, (ast.Expr, ast.Assert)):
            self.use(node.value if isinstance(node, ast.Expr) else node.test)
        for name in ("body", "orelse", "finalbody", "handlers"):
            for child in getattr(node, name, []) or []:
                if isinstance(child, ast.ExceptHandler):
                    for inner in child.body:
                        self.stmt(inner)
                elif isinstance(child, ast.stmt):
                    self.stmt(child)

    def _unbind(self, target) -> None:
        for node in ast.walk(target):
            if isinstance(node, ast.Name):
                self.env[node.id] = None

    # expressions
    def key(self, node):
        value = self.expr(node)
        if isinstance(value, Const):
            return value.value
        self.record(value)  # a key looked up by a params value reads that value
        return STAR

    def expr(self, node):
        if node is None:
            return None
        if isinstance(node, ast.Name):
            if node.id in self.env:
                return self.env[node.id]
            if node.id in self.mod.constants:
                return Const(self.mod.constants[node.id])
            return None
        if isinstance(node, ast.Constant):
            return Const(node.value) if isinstance(node.value, str) else None
        if isinstance(node, ast.Subscript):
            base = self.expr(node.value)
            if isinstance(base, Part):
                return Part(base.path + (self.key(node.slice),))
            self.use(node.slice)
            return None
        if isinstance(node, ast.Attribute):
            base = self.expr(node.value)
            if isinstance(base, Struct):
                return base.get(node.attr)
            self.record(base)
            return None
        if isinstance(node, ast.BoolOp):
            values = [self.expr(v) for v in node.values]
            parts = [v for v in values if isinstance(v, (Part, Struct))]
            for extra in parts[1:]:
                self.record(extra)
            return parts[0] if parts else None
        if isinstance(node, ast.IfExp):
            self.use(node.test)
            body, orelse = self.expr(node.body), self.expr(node.orelse)
            if isinstance(body, (Part, Struct)) and isinstance(orelse, (Part, Struct)):
                self.record(orelse)
            return body if isinstance(body, (Part, Struct)) else orelse
        if isinstance(node, ast.Compare):
            self.use(node.left)
            for op, right in zip(node.ops, node.comparators):
                value = self.expr(right)
                if not isinstance(op, (ast.In, ast.NotIn)):
                    self.record(value)  # `key in part` asks only whether a key exists
            return None
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, ast.Lambda):
            return None
        for child in ast.iter_child_nodes(node):  # lists, dicts, f-strings, comprehensions...
            if isinstance(child, ast.expr):
                self.use(child)
            elif isinstance(child, ast.comprehension):
                self.use(child.iter)
                self._unbind(child.target)
                for cond in child.ifs:
                    self.use(cond)
        return None

    def call(self, node: ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute):
            base = self.expr(func.value)
            if isinstance(base, Part) and func.attr == "get" and node.args:
                for extra in node.args[1:]:
                    self.use(extra)
                return Part(base.path + (self.key(node.args[0]),))
            if isinstance(base, Part):
                self.record(base)  # .items(), .copy(), ...
            if isinstance(func.value, ast.Name):
                found = self.scan._lookup(self.mod, func.value.id)
                if found and found[1] == "class":
                    mod = found[0]
                    method = mod.functions.get(f"{found[2]}.{func.attr}")
                    if method is not None:
                        return self.scan._invoke(mod, method, node, self, skip_first=True)
                if found and found[1] == "module":
                    target = found[0].functions.get(func.attr)
                    if target is not None:
                        return self.scan._invoke(found[0], target, node, self, skip_first=False)
        elif isinstance(func, ast.Name):
            found = self.scan._lookup(self.mod, func.id)
            if found and found[1] == "function":
                return self.scan._invoke(found[0], found[2], node, self, skip_first=False)
            if found and found[1] == "class":
                for arg in node.args:
                    self.use(arg)
                attrs = []
                for kw in node.keywords:
                    if kw.arg is None:
                        self.use(kw.value)
                    else:
                        attrs.append((kw.arg, self.expr(kw.value)))
                return Struct(tuple(attrs))
        else:
            self.use(func)
        for arg in node.args:
            self.use(arg)
        for kw in node.keywords:
            self.use(kw.value)
        return None


def schema_holds(path: tuple, schema: dict) -> bool:
    """Whether params.yaml can have a key at `path` (`*` stands for any name)."""

    def resolve(node):
        while isinstance(node, dict) and "$ref" in node:
            target = schema
            for part in node["$ref"].split("/")[1:]:
                target = target[part]
            merged = {k: v for k, v in node.items() if k != "$ref"}
            props = {**target.get("properties", {}), **merged.get("properties", {})}
            node = {**target, **merged, "properties": props}
        return node

    node = schema
    for name in path:
        node = resolve(node)
        if not isinstance(node, dict):
            return True
        props = node.get("properties", {})
        extra = node.get("additionalProperties", node.get("unevaluatedProperties"))
        if name == STAR:
            node = extra if isinstance(extra, dict) else {}
        elif name in props:
            node = props[name]
        elif isinstance(extra, dict):
            node = extra
        else:
            return extra is not False  # no schema for it: held only where extra keys may be
    return True


def covered(read: tuple, tracked: set[tuple]) -> bool:
    """A tracked key covers a read of itself or of anything under it (`*` matches any name)."""
    for key in tracked:
        if len(key) <= len(read) and all(k == STAR or k == r for k, r in zip(key, read)):
            return True
    return False


def dotted(path: tuple) -> str:
    return ".".join(path) if path else "<all of params.yaml>"
