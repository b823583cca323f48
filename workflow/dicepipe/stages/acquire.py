"""`dicepipe acquire`: fetch one external input by source and pin into data/external/<name>/.

    dicepipe acquire --name CuKe --out data/external/CuKe

params.yaml `acquire.<name>` names the source (a GitHub repository's files or tarball at a
commit, a hub model at a revision) and its pin; dicepipe.acquisition does the work. What is
already there is verified and used; a mismatch is refused; without a network the error names
the URL, the path to put the file at and its pin.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def add_arguments(parser) -> None:
    parser.add_argument("--name", required=True, help="entry under params.yaml 'acquire'")
    parser.add_argument("--out", required=True, help="output folder (data/external/<name>)")


def run(args, params: dict) -> int:
    from ..acquisition import acquire
    from ..errors import ConfigError

    entries = params.get("acquire", {})
    if args.name not in entries:
        raise ConfigError(f"unknown acquisition {args.name!r}. Expected one of {sorted(entries)} "
                          "(params.yaml 'acquire').")
    manifest = acquire(args.name, entries[args.name], args.out)
    log.info("acquire %s (%s): done, %s", args.name, manifest["kind"],
             manifest.get("commit") or manifest.get("revision"))
    return 0
