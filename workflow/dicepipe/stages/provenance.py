"""`dicepipe provenance`: what a scale's results were made from, as one JSON file.

    dicepipe provenance --scale tiny --out results/provenance_tiny.json

Records the params (validated, defaults filled) and their sha256, the versions of the
packages that compute the results (python, torch, transformers, snakemake, dvc, dicepipe),
the pin of every acquired input as params.yaml `acquire:` names it (the acquire stage
refuses content that does not match it; the folder's ACQUIRED.json adds per-file sha256),
and the sha256 of every file shipped in data/kernelbench/. No timestamps or absolute paths:
the same params, packages and files give the same bytes. Package versions differ between
machines, so this file is a record, never compared for reproducibility (DVC keeps it out of
its cache, `cache: false`, and no stage reads it).
"""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path

PACKAGES = ("torch", "transformers", "snakemake", "dvc", "dicepipe")
SHIPPED = Path("data/kernelbench")


def add_arguments(parser) -> None:
    parser.add_argument("--scale", required=True, help="scale name under params.yaml 'scales'")
    parser.add_argument("--out", required=True, help="provenance JSON to write")


def package_versions(names=PACKAGES) -> dict[str, str | None]:
    """Installed versions (None where a package is not installed)."""
    from importlib import metadata

    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def provenance(params: dict, scale: str, shipped: Path = SHIPPED) -> dict:
    """The record for one scale: a pure function of params, installed packages and files."""
    canonical = json.dumps(params, sort_keys=True, default=str)
    spec = params["scales"][scale]
    return {
        "scale": scale,
        "scale_spec": spec,
        "params_sha256": hashlib.sha256(canonical.encode()).hexdigest(),
        "params": params,
        "packages": package_versions(),
        "acquired": {name: entry for name, entry in sorted(params.get("acquire", {}).items())},
        "shipped": {p.as_posix(): sha256_file(p)
                    for p in sorted(shipped.rglob("*")) if p.is_file()} if shipped.is_dir() else {},
    }


def run(args, params: dict) -> int:
    from ..config import scale_name

    scale = scale_name(params, args.scale)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(provenance(params, scale), indent=1, sort_keys=True, default=str) + "\n")
    return 0
