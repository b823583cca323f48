"""`dicepipe wheelhouse`: the wheels a machine without network needs to run this project (not
a pipeline stage).

Compute nodes of many clusters, and the GPU machines this project is measured on, reach no
package registry. They have their own CUDA build of torch (which stays) and some of the
project's other dependencies; what they lack is fetched here, where the registry is reachable,
for their Python and platform, and carried over:

    # on the offline machine: what it has
    python3 -m pip list --format=freeze > have.txt
    # here: resolve what it lacks against what it has, download wheels for its Python/platform
    dicepipe wheelhouse --out wheelhouse --have have.txt --python-version 3.12
    # there, from the repository: install offline
    python3 -m pip install --no-index --find-links wheelhouse -r wheelhouse/requirements.txt
    python3 -m pip install --no-index --no-deps --no-build-isolation -e ./harness -e .

What is resolved: the project's own dependencies (pyproject.toml, with `--extra` groups)
that `--have` lacks or holds at a version outside the requirement, with pip's resolver run
for the target (`--python-version`, `--platform`, binary wheels only) and constrained to
`--have`'s versions, so a dependency the target already has is taken as it is there and not
downloaded. `--keep` names are never resolved nor downloaded (default: torch, whose CUDA
build the target brings; a dependency needing it is satisfied there). The folder gets the
wheels, `requirements.txt` (name==version of each, what the install line reads) and
`WHEELHOUSE.json` (the target, every wheel with its size and sha256, the total). A bare name
in `--have` (no version) counts as present at any version.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from ..errors import DicepipeError

log = logging.getLogger(__name__)

DEFAULT_PLATFORMS = ["manylinux_2_28_x86_64", "manylinux2014_x86_64"]
DEFAULT_KEEP = ["torch"]


class WheelhouseError(DicepipeError):
    """The wheelhouse cannot be resolved or downloaded."""


def add_arguments(parser) -> None:
    parser.add_argument("--out", required=True, help="folder for the wheels (created)")
    parser.add_argument("--have", default=None,
                        help="the target's `python3 -m pip list --format=freeze` (or bare names); "
                             "without it every dependency is fetched")
    parser.add_argument("--python-version", default="3.12",
                        help="the target's Python, major.minor (default 3.12)")
    parser.add_argument("--platform", action="append", default=None,
                        help=f"a wheel platform tag the target takes (repeatable; default "
                             f"{' '.join(DEFAULT_PLATFORMS)})")
    parser.add_argument("--extra", action="append", default=[],
                        help="an optional-dependency group of pyproject.toml to include (repeatable)")
    parser.add_argument("--keep", action="append", default=None,
                        help=f"a package the target brings itself, never fetched (repeatable; "
                             f"default {' '.join(DEFAULT_KEEP)})")
    parser.add_argument("--pyproject", default="pyproject.toml")
    parser.add_argument("--dry-run", action="store_true",
                        help="resolve and print what would be fetched; download nothing")


def canonical(name: str) -> str:
    """PEP 503 name normalisation."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_have(text: str) -> dict[str, str | None]:
    """`pip list --format=freeze` (or `pip freeze`) lines -> {name: version or None}. Local
    version labels are dropped (`torch==2.11.0+cu130` -> 2.11.0: the registry has no local
    versions); editable, URL and comment lines are skipped; a bare name has no version."""
    have: dict[str, str | None] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-") or " @ " in line:
            continue
        if "==" in line:
            name, version = line.split("==", 1)
            have[canonical(name.strip())] = version.strip().split("+", 1)[0]
        elif re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", line):
            have[canonical(line)] = None
    return have


# Packages of this repository the project depends on (installed from their folder with the
# project, never fetched): each is replaced by its own dependencies.
LOCAL_PACKAGES = {"kernelharness": "harness/pyproject.toml"}


def project_requirements(pyproject: Path, extras: list[str]) -> list[str]:
    import tomllib

    from packaging.requirements import Requirement

    try:
        project = tomllib.loads(pyproject.read_text())["project"]
    except (OSError, KeyError, tomllib.TOMLDecodeError) as exc:
        raise WheelhouseError(f"cannot read [project] of {pyproject}: {exc}") from exc
    requirements = []
    for text in project.get("dependencies", []):
        local = LOCAL_PACKAGES.get(canonical(Requirement(text).name))
        requirements += (project_requirements(pyproject.parent / local, [])
                         if local else [text])
    groups = project.get("optional-dependencies", {})
    for extra in extras:
        if extra not in groups:
            raise WheelhouseError(f"pyproject.toml has no optional-dependency group {extra!r} "
                                  f"(it has: {', '.join(sorted(groups))})")
        requirements += groups[extra]
    return list(dict.fromkeys(requirements))


def missing_requirements(requirements: list[str], have: dict[str, str | None],
                         keep: list[str]) -> list[str]:
    """The requirements the target does not meet: absent there, or there at a version outside
    the specifier. Kept packages are left out whatever their state."""
    from packaging.requirements import Requirement

    kept = {canonical(k) for k in keep}
    missing = []
    for text in requirements:
        req = Requirement(text)
        name = canonical(req.name)
        if name in kept:
            continue
        if name in have and (have[name] is None or req.specifier.contains(have[name], prereleases=True)):
            continue
        missing.append(text)
    return missing


def target_flags(python_version: str, platforms: list[str]) -> list[str]:
    flags = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp"]
    for platform in platforms:
        flags += ["--platform", platform]
    return flags


def constraints_text(have: dict[str, str | None], keep: list[str]) -> str:
    """The target's pinned versions, for the resolver (kept packages are never resolved)."""
    kept = {canonical(k) for k in keep}
    return "".join(f"{name}=={version}\n" for name, version in sorted(have.items())
                   if version is not None and name not in kept)


def resolve_command(requirements: list[str], flags: list[str], constraints: Path, report: Path,
                    target: Path, find_links: Path | None = None) -> list[str]:
    """pip's resolver, nothing installed: for the target with `flags`, for this machine with
    none (sdists allowed); `find_links` adds wheels built here."""
    links = ["--find-links", str(find_links)] if find_links else []
    return [sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
            "--report", str(report), "--target", str(target), "-c", str(constraints),
            *links, *flags, *requirements]


def sdist_only(report: dict) -> list[tuple[str, str]]:
    """(name, version) of each resolved package that came as a source archive."""
    return sorted((canonical(item["metadata"]["name"]), item["metadata"]["version"])
                  for item in report.get("install", [])
                  if not item["download_info"]["url"].split("#", 1)[0].endswith(".whl"))


def build_wheels(pins: list[tuple[str, str]], folder: Path) -> None:
    """Wheels of source-only packages, built here; each must be pure Python (py3-none-any),
    the one kind a wheel built on this machine is sure to install on the target."""
    if not pins:
        return
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(folder),
          *[f"{name}=={version}" for name, version in pins]], "building wheels of source-only packages")
    for wheel in folder.glob("*.whl"):
        if not wheel.name.endswith("-none-any.whl"):
            raise WheelhouseError(
                f"{wheel.name} is built for this machine, not the target: build it there (or on "
                f"a machine of its platform and Python) and add it to the wheelhouse")


def to_fetch(report: dict, have: dict[str, str | None], keep: list[str]) -> list[tuple[str, str]]:
    """(name, version) of each resolved package the target lacks, sorted; a kept package in
    the resolution is an error (a missing requirement needs it and it would be fetched)."""
    kept = {canonical(k) for k in keep}
    fetch = []
    for item in report.get("install", []):
        name, version = canonical(item["metadata"]["name"]), item["metadata"]["version"]
        if name in kept:
            raise WheelhouseError(
                f"the resolution pulls in {name} {version}, which --keep says the target brings: "
                f"list it in --have with its version (pip list --format=freeze there), or drop "
                f"it from --keep to fetch it")
        if name in have and (have[name] is None or have[name] == version):
            continue
        fetch.append((name, version))
    return sorted(set(fetch))


def download_command(pins: list[tuple[str, str]], flags: list[str], out: Path,
                     find_links: Path | None = None) -> list[str]:
    links = ["--find-links", str(find_links)] if find_links else []
    return [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(out),
            *links, *flags, *[f"{name}=={version}" for name, version in pins]]


def _run(command: list[str], what: str) -> None:
    log.info("%s: %s", what, " ".join(command))
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise WheelhouseError(f"{what} failed (pip exit {result.returncode}):\n"
                              f"{(result.stderr or result.stdout)[-3000:]}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(out: Path, pins: list[tuple[str, str]], target: dict) -> dict:
    names = {name for name, _ in pins}  # wheels of earlier runs left in the folder are not listed
    wheels = sorted(w for w in out.glob("*.whl") if canonical(w.name.split("-", 1)[0]) in names)
    manifest = {
        "target": target,
        "requirements": [f"{name}=={version}" for name, version in pins],
        "wheels": [{"file": w.name, "bytes": w.stat().st_size, "sha256": _sha256(w)} for w in wheels],
    }
    manifest["total_bytes"] = sum(w["bytes"] for w in manifest["wheels"])
    (out / "requirements.txt").write_text("".join(f"{r}\n" for r in manifest["requirements"]))
    (out / "WHEELHOUSE.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def run(args, params: dict) -> int:
    platforms = args.platform or DEFAULT_PLATFORMS
    keep = args.keep if args.keep is not None else DEFAULT_KEEP
    have: dict[str, str | None] = {}
    if args.have:
        try:
            have = parse_have(Path(args.have).read_text())
        except OSError as exc:
            raise WheelhouseError(f"cannot read --have {args.have}: {exc}") from exc
    requirements = missing_requirements(project_requirements(Path(args.pyproject), args.extra),
                                        have, keep)
    if not requirements:
        print("the target meets every requirement: nothing to fetch")
        return 0
    flags = target_flags(args.python_version, platforms)
    out = Path(args.out)
    with tempfile.TemporaryDirectory(prefix="wheelhouse-") as tmp:
        tmp_path = Path(tmp)
        constraints, built = tmp_path / "constraints.txt", tmp_path / "built"
        constraints.write_text(constraints_text(have, keep))
        built.mkdir()
        # 1. here, sdists allowed: which dependencies exist only as source (built here, pure Python)
        _run(resolve_command(requirements, [], constraints, tmp_path / "here.json", tmp_path / "t1"),
             "finding source-only dependencies")
        sources = sdist_only(json.loads((tmp_path / "here.json").read_text()))
        build_wheels(sources, built)
        # 2. for the target, wheels only (those just built among them)
        _run(resolve_command(requirements, flags, constraints, tmp_path / "target.json",
                             tmp_path / "t2", built), "resolving for the target")
        pins = to_fetch(json.loads((tmp_path / "target.json").read_text()), have, keep)
        print(f"requirements the target lacks: {', '.join(requirements)}")
        print(f"wheels to fetch ({len(pins)}): {', '.join(f'{n}=={v}' for n, v in pins)}"
              + (f"; built here from source: {', '.join(n for n, _ in sources)}" if sources else ""))
        if args.dry_run:
            return 0
        out.mkdir(parents=True, exist_ok=True)
        _run(download_command(pins, flags, out, built), "downloading")
    target = {"python_version": args.python_version, "platforms": platforms, "keep": sorted(keep),
              "extras": sorted(args.extra)}
    manifest = write_manifest(out, pins, target)
    print(f"{len(manifest['wheels'])} wheels, {manifest['total_bytes'] / 2**20:.1f} MiB in {out}; "
          f"there: python3 -m pip install --no-index --find-links {out} -r {out}/requirements.txt")
    return 0
