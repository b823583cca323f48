"""Deprecated import path: the harness is the `kernelharness` package (harness/ in this
repository), and the verdict over its rows is `dicepipe.judgement`. Importing
`dicepipe.harness` or any module under it still works for this release, with a
DeprecationWarning, and gives the new module itself:

    dicepipe.harness               -> kernelharness
    dicepipe.harness.verdict       -> dicepipe.judgement
    dicepipe.harness.build[.x]     -> kernelharness.compilation[.x]
    dicepipe.harness.<x>           -> kernelharness.<x>
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

from kernelharness import *  # noqa: F403
from kernelharness import __all__  # noqa: F401

_OLD = __name__


def new_name(old: str) -> str:
    """The module an old `dicepipe.harness...` name now is."""
    rest = old[len(_OLD):].lstrip(".")
    if rest == "verdict":
        return "dicepipe.judgement"
    if rest == "build" or rest.startswith("build."):
        rest = "compilation" + rest[len("build"):]
    return "kernelharness" + ("." + rest if rest else "")


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`import dicepipe.harness.x` gives the module `new_name` names (the same object)."""

    def find_spec(self, name, path=None, target=None):
        if name.startswith(_OLD + "."):
            return importlib.util.spec_from_loader(name, self)
        return None

    def __init__(self):
        self.specs: dict = {}

    def create_module(self, spec):
        warnings.warn(f"{spec.name} is deprecated: import {new_name(spec.name)}", DeprecationWarning,
                      stacklevel=3)
        module = importlib.import_module(new_name(spec.name))
        self.specs[spec.name] = (module.__spec__, module.__loader__)
        return module

    def exec_module(self, module):
        # the import system set the old name's spec on the module: give it back its own
        module.__spec__, module.__loader__ = self.specs.pop(module.__spec__.name)


if not any(isinstance(f, _Alias) for f in sys.meta_path):
    sys.meta_path.insert(0, _Alias())

warnings.warn("dicepipe.harness is deprecated: import kernelharness (the verdict is "
              "dicepipe.judgement)", DeprecationWarning, stacklevel=2)
