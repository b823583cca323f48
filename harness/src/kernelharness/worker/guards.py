"""Run-time tamper checks in the device worker: patched functions and new threads.

Before any candidate code runs, the guard snapshots the attribute tables of the modules and
classes a cheating candidate would patch (timers, torch and its functional API, the module
call path, the CUDA event and stream API, the harness's own modules). `check()` lists every
entry that changed since and puts the original back, so the rest of the measurement is
honest and the flag records what happened.
"""

from __future__ import annotations

import _thread
import sys
import threading
import time
import types

_MISSING = object()


def _watched_namespaces() -> list[tuple[str, object]]:
    import torch
    import torch.nn.functional as F

    spaces = [("time", time), ("torch", torch), ("torch.nn.functional", F),
              ("torch.Tensor", torch.Tensor), ("torch.nn.Module", torch.nn.Module),
              ("torch.cuda", torch.cuda), ("torch.cuda.Event", torch.cuda.Event),
              ("torch.cuda.Stream", torch.cuda.Stream), ("threading", threading),
              ("threading.Thread", threading.Thread), ("_thread", _thread),
              ("torch.backends.cudnn", torch.backends.cudnn)]
    for name, module in list(sys.modules.items()):
        if (name.startswith(("kernelharness.", "dicepipe."))
                and isinstance(module, types.ModuleType)):
            spaces.append((name, module))
    return spaces


def _global_settings() -> dict:
    """Process-wide switches that change how fast (or how exactly) the reference runs."""
    import torch

    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    return {
        "torch.num_threads": (torch.get_num_threads, torch.set_num_threads),
        "torch.default_dtype": (torch.get_default_dtype, torch.set_default_dtype),
        "torch.deterministic": (torch.are_deterministic_algorithms_enabled,
                                torch.use_deterministic_algorithms),
        "torch.grad_enabled": (torch.is_grad_enabled, torch.set_grad_enabled),
        "cudnn.enabled": (lambda: cudnn.enabled, lambda v: setattr(cudnn, "enabled", v)),
        "cudnn.benchmark": (lambda: cudnn.benchmark, lambda v: setattr(cudnn, "benchmark", v)),
        "cudnn.allow_tf32": (lambda: cudnn.allow_tf32, lambda v: setattr(cudnn, "allow_tf32", v)),
        "matmul.allow_tf32": (lambda: matmul.allow_tf32,
                              lambda v: setattr(matmul, "allow_tf32", v)),
    }


class TamperGuard:
    def __init__(self):
        self._spaces = _watched_namespaces()
        self._saved = [(label, space, dict(vars(space))) for label, space in self._spaces]
        self._settings = _global_settings()
        self._setting_values = {k: get() for k, (get, _set) in self._settings.items()}

    def check(self) -> list[str]:
        """Names changed since the snapshot (each restored)."""
        changed = []
        for name, (get, put) in self._settings.items():
            try:
                if get() != self._setting_values[name]:
                    changed.append(name)
                    put(self._setting_values[name])
            except Exception:
                changed.append(name)
        for label, space, saved in self._saved:
            current = vars(space)
            for key in set(current) | set(saved):
                before = saved.get(key, _MISSING)
                after = current.get(key, _MISSING)
                # additions are harmless (lazily imported submodules land here too)
                if before is after or before is _MISSING or key in ("__dict__", "__weakref__"):
                    continue
                if after is not _MISSING and _benign(before, after):
                    continue
                changed.append(f"{label}.{key}")
                self._restore(space, key, before)
        return sorted(changed)

    @staticmethod
    def _restore(space, key, value) -> None:
        try:
            if value is _MISSING:
                delattr(space, key)
            else:
                setattr(space, key, value)
        except (AttributeError, TypeError):
            pass


def _benign(before, after) -> bool:
    """Plain data that the libraries themselves update (counters, caches, flags)."""
    plain = (int, float, str, bool, type(None), tuple, frozenset)
    if isinstance(before, plain) and isinstance(after, plain):
        return True
    if isinstance(before, (dict, list, set)) and type(before) is type(after):
        return True
    if isinstance(before, types.ModuleType) and isinstance(after, types.ModuleType):
        return before.__name__ == after.__name__
    return False


class ThreadWatch:
    """Counts Python threads started from now on (the harness itself starts none)."""

    def __init__(self):
        self.started = 0
        original = threading.Thread.start
        watch = self

        def start(thread_self, *args, **kwargs):
            watch.started += 1
            return original(thread_self, *args, **kwargs)

        threading.Thread.start = start
        original_new = _thread.start_new_thread

        def start_new_thread(*args, **kwargs):
            watch.started += 1
            return original_new(*args, **kwargs)

        _thread.start_new_thread = start_new_thread
