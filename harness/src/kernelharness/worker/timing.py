"""Timing reference and candidate interleaved, in the same process, on rotated inputs.

Each trial takes the next input set from a rotating source (distinct buffers used in rounds,
their values redrawn between rounds, see measure.py), flushes the caches (a read over the
last-level cache on cpu, over twice the L2 on cuda), and times both models in an order that
is random per input slot and alternates from round to round (`balanced_order`): the trial
right after a round's redraw times each model first equally often, so whatever that redraw
leaves behind weighs on both sides alike. An optional check sees a sample of the candidate's
timed outputs. On cpu the clock is the process's CPU time (`cpu_clock: cpu`, every thread
counted, so work moved to another thread is still charged; it leaves out the time a shared
machine takes the core away) or `perf_counter_ns` (`wall`, monotonic). On cuda, events
bracket the call and a device-wide synchronize comes before the closing event, so work a
candidate hides on another stream is counted. In CUDA-graph mode each (model, input set) is
captured once and replays are timed.
The clock functions are bound at import, before any candidate code runs, so a candidate that
replaces `time.perf_counter_ns` or `torch.cuda.Event` does not change what is measured.
"""

from __future__ import annotations

import random
import resource
import time
from pathlib import Path

import torch

_perf_counter_ns = time.perf_counter_ns
_Event = torch.cuda.Event
_synchronize = torch.cuda.synchronize
_CUDAGraph = torch.cuda.CUDAGraph
_getrusage = resource.getrusage
_RUSAGE_SELF = resource.RUSAGE_SELF


def _process_cpu_ns() -> int:
    """CPU time of every thread of the process, in ns (microsecond resolution).

    Not CLOCK_PROCESS_CPUTIME_ID: once RLIMIT_CPU arms the process-wide CPU timer (the
    sandbox sets it), Linux serves that clock from tick-sampled totals (4 ms steps here),
    while getrusage still sums each thread's exact run time.
    """
    usage = _getrusage(_RUSAGE_SELF)
    return round((usage.ru_utime + usage.ru_stime) * 1e9)


def last_level_cache_bytes() -> int:
    for index in (3, 2):
        path = Path(f"/sys/devices/system/cpu/cpu0/cache/index{index}/size")
        try:
            text = path.read_text().strip().upper()
        except OSError:
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            return int(digits) * scale
    return 32 * 2**20


CPU_CLOCKS = ("wall", "cpu")
# The cpu flush reads at most this much: a whole client or workstation last-level cache
# (8-32 MiB), and the private caches of any machine. A server or VM reporting a shared cache
# of hundreds of MiB (480 MiB on the 2-vCPU development machine) would otherwise read 256 MiB
# before every timed call, about 20 ms each against calls of 0.1-5 ms: 18 of a CPU timing
# repeat's 20 s. There, a call's inputs may stay in the shared cache, for both models alike.
CPU_FLUSH_CAP_BYTES = 32 * 2**20


class Clock:
    def __init__(self, device: str, cpu_clock: str = "wall"):
        if cpu_clock not in CPU_CLOCKS:
            raise ValueError(f"cpu_clock {cpu_clock!r}: expected one of {CPU_CLOCKS}")
        self.device = device
        self._now_ns = _process_cpu_ns if cpu_clock == "cpu" else _perf_counter_ns
        self._flush_sink = None
        if device == "cuda":
            l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
            self._flush_buf = torch.empty(max(2 * l2, 2**24), dtype=torch.int8, device="cuda")
        else:  # reading one last-level cache's worth evicts what the last call left there
            size = min(last_level_cache_bytes(), CPU_FLUSH_CAP_BYTES) // 4
            self._flush_buf = torch.ones(size, dtype=torch.float32)

    def flush(self) -> None:
        if self.device == "cuda":
            self._flush_buf.zero_()
        else:
            # Reads, not writes: evicting dirty lines would make the next timed call pay for
            # their write-back, a fixed cost that shrinks every ratio towards 1 and adds noise.
            self._flush_sink = self._flush_buf.sum()

    def time_ms(self, fn, args) -> float:
        """One flushed, timed call; the output is dropped before returning."""
        ms, out = self.time_call(fn, args)
        del out
        return ms

    def time_call(self, fn, args) -> tuple[float, object]:
        """One flushed, timed call: (ms, its output)."""
        self.flush()
        if self.device == "cuda":
            start, end = _Event(enable_timing=True), _Event(enable_timing=True)
            start.record()
            out = fn(*args)
            _synchronize()
            end.record()
            end.synchronize()
            return start.elapsed_time(end), out
        now = self._now_ns
        t0 = now()
        out = fn(*args)
        t1 = now()
        return (t1 - t0) / 1e6, out


class NoCheck:
    """The output check's interface, checking nothing (timing without a reference output)."""

    def wants(self, call: int) -> bool:
        return False

    def expect(self, call: int, args) -> None:
        pass

    def before_candidate(self, call: int) -> None:
        pass

    def candidate_output(self, call: int, out) -> None:
        pass


def capture_graph(fn, args):
    """A CUDA graph replaying fn(*args), or None if the call cannot be captured."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn(*args)
        torch.cuda.current_stream().wait_stream(side)
        graph = _CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn(*args)
        _synchronize()
        return graph, out
    except Exception:
        try:
            _synchronize()
        except Exception:
            pass
        return None


def balanced_order(seed: int, slots: int):
    """call -> whether the reference is timed first. Random per input slot, then alternating
    from round to round, so each slot position (the first after a round's redraw included)
    times either model first equally often (within one), whatever the number of trials."""
    rng = random.Random(seed)
    coins = [rng.random() < 0.5 for _ in range(max(1, slots))]
    return lambda call: coins[call % len(coins)] != bool((call // len(coins)) % 2)


def measure_interleaved(ref_fn, cand_fn, inputs, warmup: int, trials: int, clock: Clock,
                        seed: int, check=None) -> tuple[list, list]:
    """Paired timings (ms). `inputs.next()` gives each call's arguments (one per trial, both
    models on it); `check` sees the candidate's output of the calls it wants."""
    check = check or NoCheck()
    ref_first = balanced_order(seed, len(inputs.slots))
    with torch.no_grad():
        for _ in range(warmup):
            call, args = inputs.next()
            ref_fn(*args)
            cand_fn(*args)
        ref_ms, cand_ms = [], []
        for _ in range(trials):
            call, args = inputs.next()
            checked = check.wants(call)
            if checked:
                check.expect(call, args)
            order = ("ref", "cand") if ref_first(call) else ("cand", "ref")
            kept = None  # a checked trial keeps the reference's output alive (not a free block)
            for which in order:
                if which == "ref" and checked:
                    ms, kept = clock.time_call(ref_fn, args)
                    ref_ms.append(ms)
                elif which == "ref":
                    ref_ms.append(clock.time_ms(ref_fn, args))
                elif checked:
                    check.before_candidate(call)
                    ms, out = clock.time_call(cand_fn, args)
                    cand_ms.append(ms)
                    check.candidate_output(call, out)
                    del out
                else:
                    cand_ms.append(clock.time_ms(cand_fn, args))
            del kept
    return ref_ms, cand_ms


def measure_graphs(ref_fn, cand_fn, inputs, warmup: int, trials: int, clock: Clock,
                   seed: int, check=None) -> tuple[list, list] | None:
    """Like measure_interleaved, but each call is a CUDA-graph replay; None if uncapturable.

    Each input slot's graphs are captured once; a refill writes the slot's buffers in place,
    so a replay computes on the new values (and a capture that recorded no work replays a
    stale output, which the check sees)."""
    check = check or NoCheck()
    graphs = []
    for args in inputs.slots:
        pair = (capture_graph(ref_fn, args), capture_graph(cand_fn, args))
        if pair[0] is None or pair[1] is None:
            return None
        graphs.append((pair[0][0], pair[1][0], pair[1][1]))
    if not _replays_new_values(cand_fn, graphs[0][1], graphs[0][2], inputs):
        return None
    ref_first = balanced_order(seed, len(inputs.slots))
    for _ in range(warmup):
        call, _args = inputs.next()
        ref_graph, cand_graph, _out = graphs[inputs.slot_of(call)]
        ref_graph.replay()
        cand_graph.replay()
    ref_ms, cand_ms = [], []
    for _ in range(trials):
        call, args = inputs.next()
        ref_graph, cand_graph, cand_out = graphs[inputs.slot_of(call)]
        checked = check.wants(call)
        if checked:
            check.expect(call, args)
        for which in (("ref", "cand") if ref_first(call) else ("cand", "ref")):
            if which == "ref":
                ref_ms.append(clock.time_ms(ref_graph.replay, ()))
                continue
            if checked:
                check.before_candidate(call)
            cand_ms.append(clock.time_ms(cand_graph.replay, ()))
            if checked:
                check.candidate_output(call, cand_out)
    return ref_ms, cand_ms


def _replays_new_values(fn, graph, out, inputs) -> bool:
    """Whether a replay computes on the slot's current values. A launch the capture did not
    record (a kernel on the legacy default stream, as most released kernels launch) leaves a
    graph that replays its capture-time output: that candidate is timed eagerly instead,
    which is not a verdict on it (a real stale-output cache is caught in eager timing)."""
    from .correctness import compare

    if not inputs.redraw(0, 55_555):
        return False
    graph.replay()
    _synchronize()
    with torch.no_grad():
        expected = fn(*inputs.slots[0])
    _synchronize()
    return compare(expected, out)[0] <= 1e-3


def measure_kernelbench_style(fn, args, clock: Clock, warmup: int = 3, trials: int = 100) -> float:
    """KernelBench's method, for comparison only: one input reused, mean of the trials."""
    with torch.no_grad():
        for _ in range(warmup):
            fn(*args)
        times = [clock.time_ms(fn, args) for _ in range(trials)]
    return sum(times) / len(times)
