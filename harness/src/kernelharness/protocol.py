"""JSON-lines messages over a pair of pipes between the orchestrator and one worker.

JSON, not pickle: a worker runs untrusted code, and unpickling what it sends would hand that
code the orchestrator. The pipes are dedicated file descriptors, so whatever candidate code
prints to stdout goes to the worker's log file, not into the channel.
"""

from __future__ import annotations

import json
import math
import os
import select
import time


class ChannelClosed(Exception):
    """The other end is gone (worker died, or orchestrator closed the pipe)."""


def _clean(value):
    """JSON has no NaN/inf: encode them as strings the reader turns back."""
    if isinstance(value, float) and not math.isfinite(value):
        return {"__float__": repr(value)}
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _restore(obj):
    if isinstance(obj, dict) and set(obj) == {"__float__"}:
        return float(obj["__float__"])
    return obj


class Channel:
    """One end: `send` writes a line, `recv(deadline)` returns a message or None on timeout."""

    MAX_LINE = 64 * 2**20

    def __init__(self, read_fd: int, write_fd: int):
        self.read_fd = read_fd
        self.write_fd = write_fd
        self._buffer = bytearray()

    def send(self, message: dict) -> None:
        data = (json.dumps(_clean(message)) + "\n").encode()
        view = memoryview(data)
        try:
            while view:
                written = os.write(self.write_fd, view)
                view = view[written:]
        except (BrokenPipeError, OSError) as exc:
            raise ChannelClosed(str(exc)) from exc

    def recv(self, deadline: float | None = None) -> dict | None:
        while True:
            newline = self._buffer.find(b"\n")
            if newline >= 0:
                line = bytes(self._buffer[:newline])
                del self._buffer[: newline + 1]
                try:
                    return json.loads(line, object_hook=_restore)
                except ValueError:
                    continue  # garbage written to the channel: ignored, never trusted
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.read_fd], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(self.read_fd, 1 << 20)
            if not chunk:
                raise ChannelClosed("end of stream")
            self._buffer += chunk
            if len(self._buffer) > self.MAX_LINE:
                raise ChannelClosed("message too long")

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            try:
                os.close(fd)
            except OSError:
                pass
