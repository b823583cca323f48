"""Running KernelBench-format files inside a worker, with `load_inline` intercepted.

`intercept_load_inline(handler)` swaps torch's `load_inline` for a function that turns its
arguments into a build spec and asks `handler` for the module; the extractor's handler only
records the spec, the device worker's imports the built module from the cache (or has the
orchestrator build it). Modules are executed from files in the job's own folder so that
tracebacks and `inspect` work as they would for the author.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import sys
import types
from collections.abc import Callable
from pathlib import Path

from ..compilation.buildspec import normalize_spec

_TARGETS = ("load_inline", "load")


def bind_load_inline_args(real, args: tuple, kwargs: dict) -> dict:
    """Keyword view of a load_inline call, as this torch version's signature reads it."""
    bound = inspect.signature(real).bind(*args, **kwargs)
    return dict(bound.arguments)


@contextlib.contextmanager
def intercept_load_inline(handler: Callable[[dict], object]):
    from torch.utils import cpp_extension as ce

    real = ce.load_inline
    saved = {name: getattr(ce, name) for name in _TARGETS}

    def load_inline(*args, **kwargs):
        spec = normalize_spec(bind_load_inline_args(real, args, kwargs))
        return handler(spec)

    def load(*_args, **_kwargs):
        raise RuntimeError("this harness builds extensions from load_inline only; "
                           "torch.utils.cpp_extension.load (source files) is not supported")

    ce.load_inline = load_inline
    ce.load = load
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(ce, name, value)


def exec_module(code: str, name: str, folder: Path) -> types.ModuleType:
    """Execute `code` as module `name` from `folder/<name>.py`; the module stays importable."""
    path = folder / f"{name}.py"
    path.write_text(code)
    module = types.ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module
    try:
        exec(compile(code, str(path), "exec"), module.__dict__)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def forget_module(name: str) -> None:
    sys.modules.pop(name, None)


def import_extension(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, str(path))
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load extension module {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class CallCounter:
    """How often the candidate's compiled functions ran (checked around the timed calls)."""

    def __init__(self):
        self.calls = 0
        self.modules = 0


def counting_module(real: types.ModuleType, counter: CallCounter) -> types.ModuleType:
    """A stand-in for an extension module whose functions count their calls.

    The wrapper costs one Python call (~0.1 us) against a pybind call of several us, and it
    is what lets the harness tell whether the compiled code ran on the timed path at all.
    """
    proxy = types.ModuleType(real.__name__)
    counter.modules += 1
    for attr in dir(real):
        value = getattr(real, attr)
        if callable(value) and not attr.startswith("__") and not isinstance(value, type):
            setattr(proxy, attr, _counted(value, counter))
        else:
            try:
                setattr(proxy, attr, value)
            except (AttributeError, TypeError):
                pass
    return proxy


def _counted(fn, counter: CallCounter):
    def wrapper(*args, **kwargs):
        counter.calls += 1
        return fn(*args, **kwargs)

    wrapper.__name__ = getattr(fn, "__name__", "extension_function")
    wrapper.__doc__ = getattr(fn, "__doc__", None)
    return wrapper


class StubModule(types.ModuleType):
    """What load_inline returns during extraction: every function refuses to run."""

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)

        def unavailable(*_a, **_k):
            raise RuntimeError(f"extension function {attr} is not available during extraction")

        return unavailable
