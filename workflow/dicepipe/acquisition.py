"""Fetching external inputs by source and pin into data/external/<name>/ (the `acquire` stage).

Three kinds (params.yaml `acquire.<name>`):
- `github_files`: files of a repository at a commit, each pinned by its git blob id (sha1 of
  "blob <size>\\0" + content: known from the repository's tree without downloading, and what
  `git hash-object <file>` prints), or by `sha256`;
- `github_archive`: a whole repository at a commit (GitHub's tarball), pinned by the commit's
  git tree id, recomputed from the extracted files;
- `hub_model`: a model repository on the Hugging Face hub at a revision
  (`huggingface_hub.snapshot_download` into the hub cache, then hard-linked into the folder);
- `hub_models`: several, each into its own subfolder (a scale's baseline models: one stage,
  one folder that evaluate@<scale> tracks).

Every file already at its target path is used once its pin is verified; one that does not
match is refused, never overwritten. A download goes to a temporary file in the target's
folder, is verified, then renamed: a partial or mismatching download leaves nothing behind.
Without a network the stage fails at once with the URL, the path to put the file at and the
pin. `ACQUIRED.json` in the folder records source, pin and sha256 of every file (sorted keys).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
from pathlib import Path, PurePosixPath

from .errors import AcquireError

log = logging.getLogger(__name__)

ROOT = Path("data/external")
MANIFEST = "ACQUIRED.json"
CHUNK_BYTES = 1 << 20
DEFAULT_BASE_URLS = {
    "github_files": "https://raw.githubusercontent.com",
    "github_archive": "https://codeload.github.com",
}


def target_dir(name: str) -> Path:
    """Where `acquire.<name>` lands (both runners' output of `acquire@<name>`)."""
    return ROOT / name


# ---------------------------------------------------------------- pins


def git_blob_id(path: Path) -> str:
    """The git blob id of a file: sha1 of b"blob <size>\\0" + content."""
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _pin_of(entry: dict) -> tuple[str, str]:
    """(algorithm, value) of a file entry: its git blob id or sha256."""
    if entry.get("git_blob"):
        return "git_blob", entry["git_blob"]
    return "sha256", entry["sha256"]


def _measure(path: Path, algorithm: str) -> str:
    return git_blob_id(path) if algorithm == "git_blob" else sha256_of(path)


def _hash_object(data: bytes, kind: bytes = b"blob") -> bytes:
    return hashlib.sha1(kind + b" " + str(len(data)).encode() + b"\0" + data).digest()


def git_tree_id(folder: Path, *, top: bool = True) -> str:
    """The git tree id of a folder's content (files, executable bits, symlinks): what
    `git rev-parse <commit>^{tree}` prints for the commit the folder was extracted from.
    The stage's own record (ACQUIRED.json at the top) is not content."""
    entries = []
    for child in folder.iterdir():
        if top and child.name == MANIFEST:
            continue
        if child.is_symlink():
            mode, oid = b"120000", _hash_object(os.readlink(child).encode())
        elif child.is_dir():
            mode, oid = b"40000", bytes.fromhex(git_tree_id(child, top=False))
        else:
            mode = b"100755" if os.access(child, os.X_OK) else b"100644"
            oid = bytes.fromhex(git_blob_id(child))
        # git orders a tree's entries by name, a folder's name compared with a trailing "/"
        key = child.name.encode() + (b"/" if mode == b"40000" else b"")
        entries.append((key, mode + b" " + child.name.encode() + b"\0" + oid))
    return _hash_object(b"".join(item for _, item in sorted(entries)), kind=b"tree").hex()


# ---------------------------------------------------------------- downloads


def _offline_hint(url: str, dest: Path, pin: str) -> str:
    return (f"Without a network: download {url} elsewhere and put it at {dest} ({pin}); the "
            f"stage verifies it and uses it. Or set HTTPS_PROXY, or point params.yaml "
            f"`base_url` at a mirror.")


def download(url: str, dest: Path, algorithm: str, expected: str | None, *, timeout_s: float,
             pin_key: str) -> str:
    """Download `url` to `dest` through a temporary file in dest's folder; verify it against
    `expected` (`algorithm`: git_blob or sha256; None = record what arrives) before the
    rename. Returns the measured pin. Nothing is left at `dest` or beside it on failure."""
    from tqdm import tqdm

    dest.parent.mkdir(parents=True, exist_ok=True)
    pin_text = f"{algorithm} {expected}" if expected else "no pin yet"
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as response, open(tmp, "wb") as out:
                total = int(response.headers.get("Content-Length") or 0) or None
                with tqdm(total=total, unit="B", unit_scale=True, desc=dest.name, leave=False) as bar:
                    for chunk in iter(lambda: response.read(CHUNK_BYTES), b""):
                        out.write(chunk)
                        bar.update(len(chunk))
        except urllib.error.HTTPError as exc:
            raise AcquireError(f"{url} answered HTTP {exc.code} ({exc.reason}); expected the file for "
                               f"{dest} ({pin_key}). Check the repository, commit and path there. "
                               + _offline_hint(url, dest, pin_text)) from exc
        except (TimeoutError, urllib.error.URLError, ConnectionError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise AcquireError(f"cannot reach {url} ({reason}). " + _offline_hint(url, dest, pin_text)) from exc
        measured = _measure(tmp, algorithm)
        if expected and measured != expected:
            raise AcquireError(f"{url} arrived with {algorithm} {measured}, expected {expected} "
                               f"({pin_key}); nothing was kept. A changed source or a corrupting "
                               f"proxy: check the URL, or correct the pin if the source is right.")
        os.replace(tmp, dest)
        return measured
    finally:
        tmp.unlink(missing_ok=True)


# ---------------------------------------------------------------- kinds


def _file_url(spec: dict, path: str) -> str:
    base = spec.get("base_url") or DEFAULT_BASE_URLS["github_files"]
    return f"{base.rstrip('/')}/{spec['repo']}/{spec['commit']}/{path}"


def acquire_github_files(name: str, spec: dict, out: Path, *, timeout_s: float) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    records, wanted = {}, {MANIFEST}
    for index, entry in enumerate(spec["files"]):
        file_name = PurePosixPath(entry["path"]).name
        dest, url = out / file_name, _file_url(spec, entry["path"])
        algorithm, expected = _pin_of(entry)
        pin_key = f"params.yaml acquire.{name}.files[{index}].{algorithm}"
        wanted.add(file_name)
        if dest.exists():
            _check_placed_file(dest, algorithm, expected, pin_key, url)
            log.info("%s: %s already there, %s verified", name, dest, algorithm)
            how = "verified"
        else:
            log.info("%s: downloading %s", name, url)
            download(url, dest, algorithm, expected, timeout_s=timeout_s, pin_key=pin_key)
            how = "downloaded"
        records[file_name] = {"url": url, algorithm: expected, "sha256": sha256_of(dest),
                              "bytes": dest.stat().st_size}
        log.info("%s: %s %s (%d bytes)", name, how, dest, dest.stat().st_size)
    for stale in sorted({p.name for p in out.iterdir()} - wanted):
        log.info("%s: removing %s (no longer listed in acquire.%s.files)", name, out / stale, name)
        (out / stale).unlink() if (out / stale).is_file() else shutil.rmtree(out / stale)
    return {"kind": "github_files", "repo": spec["repo"], "commit": spec["commit"], "files": records}


def _check_placed_file(dest: Path, algorithm: str, expected: str, pin_key: str, url: str) -> None:
    found = _measure(dest, algorithm)
    if found != expected:
        raise AcquireError(
            f"{dest} is already there with {algorithm} {found}, expected {expected} "
            f"({pin_key}; source {url}). It is not overwritten: delete it to download "
            f"again, or put the file of that pin there.")


def _check_placed_tree(name: str, spec: dict, out: Path, url: str) -> None:
    found = git_tree_id(out)
    if found != spec["tree"]:
        raise AcquireError(
            f"{out} is already there with git tree {found}, expected {spec['tree']} "
            f"(params.yaml acquire.{name}.tree; source {url}). It is not overwritten: delete the "
            f"folder to download again, or put a checkout of {spec['repo']} at {spec['commit']} "
            f"there (`git -C {out} checkout {spec['commit']}`, without its .git folder).")


def _extract_archive(archive: Path, out: Path) -> None:
    """Extract a GitHub tarball (one top folder) into `out`, dropping that top folder."""
    with tarfile.open(archive, "r:gz") as tar:
        members = [m for m in tar.getmembers() if "/" in m.name.strip("/")]
        for member in members:
            member.name = member.name.split("/", 1)[1]
        tar.extractall(out, members=members, filter="tar")


def acquire_github_archive(name: str, spec: dict, out: Path, *, timeout_s: float) -> dict:
    base = spec.get("base_url") or DEFAULT_BASE_URLS["github_archive"]
    url = f"{base.rstrip('/')}/{spec['repo']}/tar.gz/{spec['commit']}"
    pin_key = f"params.yaml acquire.{name}.tree"
    if out.exists() and any(p.name != MANIFEST for p in out.iterdir()):
        _check_placed_tree(name, spec, out, url)
        log.info("%s: %s already there, git tree verified", name, out)
        how = "verified"
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{name}.", suffix=".part"))
        try:
            archive = staging / "archive.tar.gz"
            log.info("%s: downloading %s", name, url)
            sha256 = download(url, archive, "sha256", None, timeout_s=timeout_s, pin_key=pin_key)
            tree = staging / "tree"
            _extract_archive(archive, tree)
            found = git_tree_id(tree)
            if found != spec["tree"]:
                raise AcquireError(
                    f"{url} (sha256 {sha256}) extracted to git tree {found}, expected "
                    f"{spec['tree']} ({pin_key}); nothing was kept. Check repo and commit.")
            if out.exists():
                shutil.rmtree(out)
            os.replace(tree, out)
        except AcquireError as exc:
            if "cannot reach" in str(exc) or "answered HTTP" in str(exc):
                raise AcquireError(f"{exc} (for the whole repository: put a checkout of "
                                   f"{spec['repo']} at commit {spec['commit']}, git tree "
                                   f"{spec['tree']}, at {out})") from exc
            raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        how = "downloaded"
    log.info("%s: %s %s", name, how, out)
    return {"kind": "github_archive", "repo": spec["repo"], "commit": spec["commit"], "tree": spec["tree"],
            "url": url}


def _verified_manifest(out: Path, identity: dict) -> dict | None:
    """The folder's manifest when it was written for `identity` and every file it lists is
    there with its recorded sha256; else None."""
    try:
        manifest = json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if any(manifest.get(k) != v for k, v in identity.items()):
        return None
    for rel, record in manifest.get("files", {}).items():
        path = out / rel
        if not path.is_file() or path.stat().st_size != record["bytes"] or sha256_of(path) != record["sha256"]:
            return None
    return manifest


def _place(source: Path, dest: Path) -> None:
    """Hard-link a hub cache file into the folder (no second copy of a 16 GB model), or copy."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.part")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)
    os.replace(tmp, dest)


def acquire_hub_model(name: str, spec: dict, out: Path, *, timeout_s: float) -> dict:
    """snapshot_download into the hub cache (HF_HUB_CACHE; it resumes and re-uses), then the
    snapshot's files into the folder. Not `local_dir=`: offline, huggingface_hub returns any
    non-empty local_dir as it is, unverified. A folder whose ACQUIRED.json names this repo and
    revision and whose files match their recorded sha256 is used without the network."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    identity = {"kind": "hub_model", "repo_id": spec["repo_id"], "revision": spec["revision"]}
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    url = f"{endpoint.rstrip('/')}/{spec['repo_id']}/tree/{spec['revision']}"
    pin_key = f"params.yaml acquire.{name}.revision"
    if spec["revision"] == "main":
        log.warning("%s: revision 'main' is no pin (it follows the hub): set %s to a commit id", name, pin_key)
    found = _verified_manifest(out, identity)
    if found is not None:
        log.info("%s: %s already there, %d files verified against %s", name, out, len(found["files"]), MANIFEST)
        return {**identity, "files": found["files"]}
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", str(int(timeout_s)))
    try:
        snapshot = Path(snapshot_download(spec["repo_id"], revision=spec["revision"],
                                          allow_patterns=spec.get("allow_patterns") or None))
    except (RevisionNotFoundError, RepositoryNotFoundError) as exc:
        raise AcquireError(f"{spec['repo_id']} at revision {spec['revision']} does not exist on "
                           f"{endpoint} ({pin_key}): check the id and the revision.") from exc
    except (LocalEntryNotFoundError, OSError) as exc:
        raise AcquireError(
            f"cannot reach {url}, and the hub cache holds no snapshot of {spec['repo_id']} at "
            f"{spec['revision']} ({type(exc).__name__}). Without a network: on a machine with one, "
            f"`hf download {spec['repo_id']} --revision {spec['revision']}` and copy its hub cache "
            f"folder (HF_HUB_CACHE) here; or set HF_ENDPOINT to a mirror. The files land in {out}.") from exc
    if out.exists():
        shutil.rmtree(out)
    files = {}
    for path in sorted(snapshot.rglob("*")):
        if path.is_dir():
            continue
        rel = path.relative_to(snapshot).as_posix()
        _place(path.resolve(), out / rel)
        files[rel] = {"bytes": (out / rel).stat().st_size, "sha256": sha256_of(out / rel)}
    log.info("%s: %d files of %s at %s in %s", name, len(files), spec["repo_id"], spec["revision"], out)
    return {**identity, "files": files}


def acquire_hub_models(name: str, spec: dict, out: Path, *, timeout_s: float) -> dict:
    """Each of `models` as `hub_model` into out/<model name>/ (its own ACQUIRED.json, so a
    model already verified is not fetched again when another is added); folders no longer
    listed are removed."""
    out.mkdir(parents=True, exist_ok=True)
    records = {}
    for index, model in enumerate(spec["models"]):
        sub = out / model["name"]
        entry = {k: v for k, v in model.items() if k != "name"}
        record = acquire_hub_model(f"{name}.models[{index}]", entry, sub, timeout_s=timeout_s)
        (sub / MANIFEST).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        records[model["name"]] = {k: record[k] for k in ("repo_id", "revision")}
    for stale in sorted({p.name for p in out.iterdir()} - set(records) - {MANIFEST}):
        log.info("%s: removing %s (no longer listed in acquire.%s.models)", name, out / stale, name)
        (out / stale).unlink() if (out / stale).is_file() else shutil.rmtree(out / stale)
    return {"kind": "hub_models", "models": records}


KINDS = {
    "github_files": acquire_github_files,
    "github_archive": acquire_github_archive,
    "hub_model": acquire_hub_model,
    "hub_models": acquire_hub_models,
}


def acquire(name: str, spec: dict, out: Path | None = None) -> dict:
    """Fetch (or verify) `acquire.<name>` into `out` (data/external/<name>) and write its
    manifest. Returns the manifest."""
    out = Path(out) if out is not None else target_dir(name)
    manifest = KINDS[spec["kind"]](name, spec, out, timeout_s=float(spec.get("timeout_s", 30)))
    manifest["name"] = name
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def acquired_entry(path: str | Path, entries: dict) -> str | None:
    """The `acquire` entry whose folder (data/external/<name>) holds `path`, or None."""
    parts = Path(path).parts
    if len(parts) >= 3 and Path(*parts[:2]) == ROOT and parts[2] in entries:
        return parts[2]
    return None


def verify_placed(path: str | Path, entries: dict) -> None:
    """Before a stage reads `path`: when it lies in an acquired folder, check what is there
    against the entry's pin, as `acquire` does, without fetching or writing anything. A file
    put there by hand (the offline message says where) is refused with acquire's own message
    when it does not match; the stage that owns the folder need not have run (Snakemake does
    not run it on a folder that is already there). Only refuses: the reading stage's output
    depends on the content, which both runners track, never on the pin's value."""
    name = acquired_entry(path, entries)
    if name is None:
        return
    spec, out = entries[name], target_dir(name)
    what = f"acquire@{name} fetches it (`snakemake -- {out}`, `dvc repro real/dvc.yaml:acquire@{name}`)"
    if spec["kind"] == "github_files":
        for index, entry in enumerate(spec["files"]):
            dest = out / PurePosixPath(entry["path"]).name
            algorithm, expected = _pin_of(entry)
            url = _file_url(spec, entry["path"])
            if not dest.is_file():
                raise AcquireError(f"{dest} is missing: {what}. "
                                   + _offline_hint(url, dest, f"{algorithm} {expected}"))
            _check_placed_file(dest, algorithm, expected,
                               f"params.yaml acquire.{name}.files[{index}].{algorithm}", url)
    elif spec["kind"] == "github_archive":
        base = spec.get("base_url") or DEFAULT_BASE_URLS["github_archive"]
        if not out.is_dir():
            raise AcquireError(f"{out} is missing: {what}.")
        _check_placed_tree(name, spec, out, f"{base.rstrip('/')}/{spec['repo']}/tar.gz/{spec['commit']}")
    else:  # hub models: placed by acquire only (from the hub cache), recorded with their sizes
        models = ([(out, spec)] if spec["kind"] == "hub_model" else
                  [(out / m["name"], m) for m in spec["models"]])
        for folder, model in models:
            identity = {"kind": "hub_model", "repo_id": model["repo_id"], "revision": model["revision"]}
            try:
                manifest = json.loads((folder / MANIFEST).read_text())
            except (OSError, ValueError):
                manifest = {}
            sizes_match = all((folder / rel).is_file() and (folder / rel).stat().st_size == rec["bytes"]
                              for rel, rec in manifest.get("files", {}).items())
            if any(manifest.get(k) != v for k, v in identity.items()) or not sizes_match:
                raise AcquireError(
                    f"{folder} does not hold {model['repo_id']} at {model['revision']} as acquire "
                    f"placed it (its {MANIFEST} is missing, names another revision, or a file's "
                    f"size differs): {what}.")
