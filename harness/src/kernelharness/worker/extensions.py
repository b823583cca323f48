"""Resolving a candidate's `load_inline` calls inside a device worker.

The device worker never compiles (it may not even start a process): a spec whose build is in
the cache is imported from there; one that is not is sent to the orchestrator, which builds
it with its builders and answers when done. Modules already imported by this worker are
reused. Every module handed to the candidate is a call-counting stand-in.
"""

from __future__ import annotations

from ..compilation.buildspec import module_name, read_status, so_path, spec_key
from .loader import CallCounter, counting_module, import_extension


class BuildFailedError(RuntimeError):
    def __init__(self, message: str, log: str):
        super().__init__(message)
        self.log = log


class ExtensionResolver:
    def __init__(self, ctx, counter: CallCounter):
        self.ctx = ctx
        self.counter = counter
        self.used: list[str] = []
        self.requested: list[str] = []
        self.log_tail = ""

    def load(self, spec: dict):
        ctx = self.ctx
        key = spec_key(spec, ctx.toolchain)
        if key not in self.used:
            self.used.append(key)
        module = ctx.extensions.get(key)
        if module is None:
            status = read_status(ctx.cache, key, files=False)  # the host checks the module
            if status is None:
                self.requested.append(key)
                status = ctx.request_build(spec, key)
            if not status.get("ok"):
                self.log_tail = status.get("log_tail", "")
                raise BuildFailedError(f"extension {spec['name']!r} failed to build",
                                       self.log_tail)
            module = import_extension(so_path(ctx.cache, key), module_name(key))
            ctx.extensions[key] = module
        return counting_module(module, self.counter)
