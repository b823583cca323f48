"""`dicepipe benchmark`: materialise a benchmark suite as a table (a DVC output, so a hub
download is tracked like any stage output).

    dicepipe benchmark --name kernelbench --out data/benchmark/kernelbench.parquet

Sources (params.yaml `benchmarks.<name>`): a KernelBench checkout or the shipped suite
(`kernelbench_dir`, level1/<id>_<Name>.py ...), a Parquet with the published dataset's
columns (`parquet`), or the dataset id (`hub`, with an optional `revision`). `levels` and
`tasks` pick a subset; `version` is recorded in every row.
"""

from __future__ import annotations

import logging
from collections import Counter

log = logging.getLogger(__name__)


def add_arguments(parser) -> None:
    parser.add_argument("--name", required=True, help="benchmark name under params.yaml 'benchmarks'")
    parser.add_argument("--out", required=True, help="output table (BENCHMARK_SCHEMA parquet)")


def run(args, params: dict) -> int:
    from ..data.benchmark import load_benchmark
    from ..data.schema import BENCHMARK_SCHEMA, write_table
    from ..errors import ConfigError

    if args.name not in params["benchmarks"]:
        raise ConfigError(f"unknown benchmark {args.name!r}. Expected one of "
                          f"{sorted(params['benchmarks'])} (params.yaml 'benchmarks').")
    spec = params["benchmarks"][args.name]
    table = load_benchmark(spec, source=f"params.yaml benchmarks.{args.name}")
    write_table(table, args.out, BENCHMARK_SCHEMA)
    counts = Counter(table.column("level").to_pylist())
    log.info("benchmark %s (version %s): %d tasks (%s)", args.name, spec.get("version", "unversioned"),
             table.num_rows, ", ".join(f"level {k}: {v}" for k, v in sorted(counts.items())))
    return 0
