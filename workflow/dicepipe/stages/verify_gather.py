"""`dicepipe verify-gather`: join the verify shards of a corpus into one measurements table,
sorted by sample id (the same table whatever the number of shards). Its own module, so the
gather step depends on none of the harness code that only the shards run."""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from ..data.schema import read_parquet, write_table
from ..errors import StageInputError

log = logging.getLogger(__name__)


def add_arguments(parser) -> None:
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--shards-dir", required=True,
                        help="folder holding <shard>.parquet for every id in verify.shards")
    parser.add_argument("--out", required=True, help="joined measurements parquet")


def run(args, params: dict) -> int:
    tables = []
    for shard in params["verify"]["shards"]:
        path = Path(args.shards_dir) / f"{shard}.parquet"
        if not Path(path).is_file():
            raise StageInputError(f"{path}: missing shard; run `dicepipe verify` for it first.")
        tables.append(read_parquet(path))
    table = pa.concat_tables(tables, promote_options="default") if tables else pa.table({})
    ids = table.column("job_id").to_pylist()
    if len(ids) != len(set(ids)):
        raise StageInputError("verify shards overlap (a sample measured twice): re-run them with one N.")
    table = table.take(pc.sort_indices(table.column("job_id")))
    write_table(table, args.out)
    log.info("gathered %d shards of corpus %s: %d measurements", len(tables), args.corpus, table.num_rows)
    return 0
