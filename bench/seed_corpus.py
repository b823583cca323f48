"""Build, check and time every pair of the shipped seed corpus (data/seed/corpus) on this CPU.

For each pair: build the kernel file (load_inline at import), compare ModelNew with Model on
several seeds (both models built right after the same torch.manual_seed, fresh inputs per seed,
torch.allclose at atol=rtol=1e-4), then time both on one input set: warm-up calls, then `calls`
interleaved calls of each, median wall time per call.

    TORCH_EXTENSIONS_DIR=.cache/dicepipe/seed-check .venv/bin/python bench/seed_corpus.py \
        [--names relu swiglu ...] [--seeds 3] [--calls 30] [--rounds R] [--threads N [--cpu-time]] \
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

CORPUS = Path(__file__).resolve().parent.parent / "data" / "seed" / "corpus"
TOLERANCE = 1e-4


def load_namespace(path: Path) -> dict:
    namespace = {"__name__": f"seed_{path.parent.name}_{path.stem}"}
    exec(compile(path.read_text(), str(path), "exec"), namespace)  # noqa: S102 -- runs the shipped task files
    return namespace


def build_models(ref_ns: dict, new_ns: dict, seed: int):
    init_inputs = ref_ns["get_init_inputs"]()
    torch.manual_seed(seed)
    reference = ref_ns["Model"](*init_inputs)
    torch.manual_seed(seed)
    candidate = new_ns["ModelNew"](*init_inputs)
    return reference, candidate


def make_inputs(ref_ns: dict, seed: int) -> list:
    torch.manual_seed(seed + 1000)
    inputs = ref_ns["get_inputs"]()
    for tensor in inputs:
        if tensor.is_floating_point():
            # Inputs of one sign hide wrong branches (relu == identity on rand()).
            assert tensor.min() < 0 < tensor.max(), "seed inputs must have both signs"
    return inputs


def check_pair(ref_ns: dict, new_ns: dict, seeds: int) -> float:
    worst = 0.0
    for seed in range(seeds):
        reference, candidate = build_models(ref_ns, new_ns, seed)
        inputs = make_inputs(ref_ns, seed)
        expected = reference(*inputs)
        actual = candidate(*inputs)
        assert actual.shape == expected.shape, (
            f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
        )
        worst = max(worst, (actual - expected).abs().max().item())
        assert torch.allclose(actual, expected, atol=TOLERANCE, rtol=TOLERANCE), (
            f"seed {seed}: max abs error {worst:.3g}"
        )
    return worst


def call_times_ms(model, inputs: list, calls: int, clock) -> list[float]:
    times = []
    for _ in range(calls):
        start = clock()
        model(*inputs)
        times.append((clock() - start) * 1e3)
    return times


def time_pair(
    ref_ns: dict, new_ns: dict, calls: int, clock, warmup: int = 5
) -> tuple[float, float]:
    reference, candidate = build_models(ref_ns, new_ns, 0)
    inputs = make_inputs(ref_ns, 0)
    for _ in range(warmup):
        reference(*inputs)
        candidate(*inputs)
    ref_ms, new_ms = [], []
    # Interleaved in small groups so that load from other processes hits both sides alike.
    for _ in range(calls // 5):
        ref_ms += call_times_ms(reference, inputs, 5, clock)
        new_ms += call_times_ms(candidate, inputs, 5, clock)
    return statistics.median(ref_ms), statistics.median(new_ms)


def load_and_check(name: str, seeds: int) -> tuple[dict, dict, dict]:
    ref_ns = load_namespace(CORPUS / "reference" / f"{name}.py")
    start = time.perf_counter()
    new_ns = load_namespace(CORPUS / "kernels" / f"{name}.py")
    build_s = time.perf_counter() - start
    with torch.inference_mode():
        max_abs_error = check_pair(ref_ns, new_ns, seeds)
    return (
        ref_ns,
        new_ns,
        {"name": name, "build_s": round(build_s, 1), "max_abs_error": max_abs_error},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", nargs="*", help="pair names (default: all)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="time every pair this many times, one pair after another, and keep "
        "the median of the per-round medians (spreads each pair over time)",
    )
    parser.add_argument(
        "--threads", type=int, help="torch.set_num_threads (also OpenMP in the kernels)"
    )
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time with the calling thread's CPU clock (needs --threads 1): "
        "blind to time spent descheduled by other processes",
    )
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    if args.cpu_time and args.threads != 1:
        parser.error("--cpu-time needs --threads 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.thread_time if args.cpu_time else time.perf_counter
    names = args.names or sorted(p.stem for p in (CORPUS / "reference").glob("*.py"))
    rows, loaded = {}, {}
    for name in names:
        try:
            ref_ns, new_ns, rows[name] = load_and_check(name, args.seeds)
            loaded[name] = (ref_ns, new_ns)
        except Exception as exc:  # noqa: BLE001 -- report every pair, even after one fails
            rows[name] = {"name": name, "error": f"{type(exc).__name__}: {exc}"[:300]}
    timings = {name: ([], []) for name in loaded}
    loads = []
    for _ in range(args.rounds):
        # Other processes on a 2-core machine distort timings badly; keep the load next to them.
        loads.append(os.getloadavg()[0])
        for name, (ref_ns, new_ns) in loaded.items():
            with torch.inference_mode():
                ref_ms, new_ms = time_pair(ref_ns, new_ns, args.calls, clock)
            timings[name][0].append(ref_ms)
            timings[name][1].append(new_ms)
    for name, (ref_rounds, new_rounds) in timings.items():
        ref_ms, new_ms = statistics.median(ref_rounds), statistics.median(new_rounds)
        rows[name].update(
            ref_ms=ref_ms, new_ms=new_ms, speedup=ref_ms / new_ms, load_1min=max(loads)
        )
    for name in names:
        print(json.dumps(rows[name]), flush=True)
    if args.json:
        args.json.write_text(json.dumps([rows[n] for n in names], indent=1) + "\n")


if __name__ == "__main__":
    main()
