"""The acquire stage against a loopback HTTP server and an offline hub cache (no network):
a download, a verified re-use, a checksum mismatch, an unreachable host."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import socket
import tarfile
import threading
import time
from pathlib import Path

import pytest

from dicepipe.acquisition import acquire, git_blob_id, git_tree_id
from dicepipe.errors import AcquireError

COMMIT = "1abe88761f7715f82da84c838b387ea282b8b898"
CONTENT = b'[{"instruction": "write a kernel", "output": "```python\\nx\\n```"}]\n'


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@pytest.fixture()
def server():
    """Serves `files` (url path -> bytes); counts requests."""
    state = {"files": {}, "requests": []}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            state["requests"].append(self.path)
            body = state["files"].get(self.path)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{httpd.server_address[1]}"
    yield state
    httpd.shutdown()
    httpd.server_close()


def files_spec(base_url: str, pin: str) -> dict:
    return {"kind": "github_files", "repo": "deadlykitten4/DICE", "commit": COMMIT, "base_url": base_url,
            "timeout_s": 5, "files": [{"path": "training/data/CuKe_dataset.json", "git_blob": pin}]}


def served_path() -> str:
    return f"/deadlykitten4/DICE/{COMMIT}/training/data/CuKe_dataset.json"


def test_download_then_verified_reuse(server, tmp_path):
    server["files"][served_path()] = CONTENT
    out = tmp_path / "data/external/CuKe"
    manifest = acquire("CuKe", files_spec(server["url"], blob_id(CONTENT)), out)
    assert (out / "CuKe_dataset.json").read_bytes() == CONTENT
    assert git_blob_id(out / "CuKe_dataset.json") == blob_id(CONTENT)
    assert manifest["files"]["CuKe_dataset.json"]["sha256"] == hashlib.sha256(CONTENT).hexdigest()
    assert sorted(p.name for p in out.iterdir()) == ["ACQUIRED.json", "CuKe_dataset.json"]
    assert len(server["requests"]) == 1
    first = (out / "ACQUIRED.json").read_bytes()
    # re-run: the file there is verified and used, nothing is fetched, the record is the same
    acquire("CuKe", files_spec(server["url"], blob_id(CONTENT)), out)
    assert len(server["requests"]) == 1
    assert (out / "ACQUIRED.json").read_bytes() == first


def test_file_put_by_hand_is_used_and_a_wrong_one_refused(tmp_path):
    out = tmp_path / "CuKe"
    out.mkdir()
    (out / "CuKe_dataset.json").write_bytes(CONTENT)
    unreachable = "http://127.0.0.1:9"  # never asked: the file is there
    acquire("CuKe", files_spec(unreachable, blob_id(CONTENT)), out)
    (out / "CuKe_dataset.json").write_bytes(CONTENT + b" ")
    with pytest.raises(AcquireError) as err:
        acquire("CuKe", files_spec(unreachable, blob_id(CONTENT)), out)
    message = str(err.value)
    assert "is already there with git_blob" in message and blob_id(CONTENT) in message
    assert "acquire.CuKe.files[0].git_blob" in message and "delete it" in message
    assert (out / "CuKe_dataset.json").read_bytes() == CONTENT + b" "  # never overwritten


def test_checksum_mismatch_leaves_nothing(server, tmp_path):
    server["files"][served_path()] = CONTENT + b"tampered"
    out = tmp_path / "CuKe"
    with pytest.raises(AcquireError) as err:
        acquire("CuKe", files_spec(server["url"], blob_id(CONTENT)), out)
    message = str(err.value)
    assert f"{server['url']}{served_path()} arrived with git_blob {blob_id(CONTENT + b'tampered')}" in message
    assert f"expected {blob_id(CONTENT)}" in message and "nothing was kept" in message
    assert list(out.iterdir()) == []  # no file, no partial download


def test_unreachable_host_fails_at_once_with_url_path_and_pin(tmp_path):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "CuKe"
    start = time.monotonic()
    with pytest.raises(AcquireError) as err:
        acquire("CuKe", files_spec(f"http://127.0.0.1:{port}", blob_id(CONTENT)), out)
    assert time.monotonic() - start < 5
    message = str(err.value)
    assert f"cannot reach http://127.0.0.1:{port}{served_path()}" in message
    assert f"put it at {out / 'CuKe_dataset.json'}" in message
    assert f"git_blob {blob_id(CONTENT)}" in message
    assert list(out.iterdir()) == []


def test_http_error_names_the_status(server, tmp_path):
    with pytest.raises(AcquireError, match="answered HTTP 404"):
        acquire("CuKe", files_spec(server["url"], blob_id(CONTENT)), tmp_path / "CuKe")


def _tarball(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"KernelBench-abc/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_archive_is_checked_against_the_commit_tree(server, tmp_path):
    files = {"KernelBench/prompts.toml": b"[one_shot]\n", "README.md": b"kb\n"}
    reference = tmp_path / "reference"
    for name, data in files.items():
        (reference / name).parent.mkdir(parents=True, exist_ok=True)
        (reference / name).write_bytes(data)
    tree = git_tree_id(reference)
    server["files"][f"/Org/KernelBench/tar.gz/{'c' * 40}"] = _tarball(files)
    spec = {"kind": "github_archive", "repo": "Org/KernelBench", "commit": "c" * 40, "tree": tree,
            "base_url": server["url"]}
    out = tmp_path / "data/external/KernelBench"
    acquire("KernelBench", spec, out)
    assert (out / "KernelBench/prompts.toml").read_bytes() == b"[one_shot]\n"
    acquire("KernelBench", spec, out)  # verified, not fetched again
    assert len(server["requests"]) == 1
    with pytest.raises(AcquireError, match="extracted to git tree"):
        acquire("KernelBench", {**spec, "tree": "0" * 40}, tmp_path / "other")
    assert not (tmp_path / "other").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_git_tree_id_matches_git(tmp_path):
    git = pytest.importorskip("shutil").which("git")
    if git is None:
        pytest.skip("no git")
    import subprocess

    (tmp_path / "a/b").mkdir(parents=True)
    (tmp_path / "a/b/x.py").write_text("x = 1\n")
    (tmp_path / "a.txt").write_text("a\n")
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    (tmp_path / "run.sh").chmod(0o755)
    subprocess.run([git, "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([git, "add", "-A"], cwd=tmp_path, check=True)
    expected = subprocess.run([git, "write-tree"], cwd=tmp_path, check=True, capture_output=True,
                              text=True).stdout.strip()
    import shutil

    shutil.rmtree(tmp_path / ".git")
    assert git_tree_id(tmp_path) == expected


def test_hub_model_from_an_offline_cache(tmp_path, monkeypatch):
    revision = "a" * 40
    snapshot = tmp_path / "hub/models--JetLM--SDAR-tiny/snapshots" / revision
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text('{"model_type": "sdar"}\n')
    (tmp_path / "hub/models--JetLM--SDAR-tiny/refs").mkdir()
    (tmp_path / "hub/models--JetLM--SDAR-tiny/refs/main").write_text(revision)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    spec = {"kind": "hub_model", "repo_id": "JetLM/SDAR-tiny", "revision": revision}
    out = tmp_path / "data/external/sdar-tiny"
    manifest = acquire("sdar-tiny", spec, out)
    assert (out / "config.json").read_text() == '{"model_type": "sdar"}\n'
    assert manifest["files"]["config.json"]["bytes"] == len('{"model_type": "sdar"}\n')
    # the cache gone: the folder is verified against its record and used
    import shutil

    shutil.rmtree(tmp_path / "hub")
    acquire("sdar-tiny", spec, out)
    # a revision not in the cache, offline: a clear failure naming the way out
    with pytest.raises(AcquireError) as err:
        acquire("sdar-tiny", {**spec, "revision": "b" * 40}, tmp_path / "other")
    assert "cannot reach" in str(err.value) and "hf download JetLM/SDAR-tiny --revision" in str(err.value)


def test_cli_reports_the_error_and_exits_2(tmp_path, monkeypatch, repo_root, capfd):
    import yaml

    from dicepipe.cli import main

    params = yaml.safe_load((repo_root / "params.yaml").read_text())
    params["acquire"]["CuKe"]["base_url"] = "http://127.0.0.1:9"
    params["acquire"]["CuKe"]["timeout_s"] = 2
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(tmp_path)
    assert main(["acquire", "--name", "CuKe", "--out", "data/external/CuKe"]) == 2
    err = capfd.readouterr().err
    assert "cannot reach http://127.0.0.1:9/deadlykitten4/DICE/" in err
    assert "put it at data/external/CuKe/CuKe_dataset.json (git_blob d08886353a362f065dcb8774635fa28f7f194cf2)" in err
    assert not Path("data/external/CuKe/CuKe_dataset.json").exists()


def _hub_cache(tmp_path, repo_id: str, revision: str, files: dict) -> None:
    folder = tmp_path / "hub" / ("models--" + repo_id.replace("/", "--"))
    snapshot = folder / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for name, text in files.items():
        (snapshot / name).write_text(text)
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / "main").write_text(revision)


def test_hub_models_fetch_a_scales_baselines_into_subfolders(tmp_path, monkeypatch):
    """acquire@baselines-<scale>: each model into its own subfolder with its own record; a
    model dropped from the list is removed, one kept is verified without the cache."""
    import shutil

    _hub_cache(tmp_path, "Qwen/Qwen3-tiny", "a" * 40, {"config.json": '{"model_type": "qwen3"}\n'})
    _hub_cache(tmp_path, "DeadlyKitt3n/DICE-tiny", "b" * 40, {"config.json": '{"model_type": "sdar"}\n'})
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    spec = {"kind": "hub_models", "models": [
        {"name": "qwen3", "repo_id": "Qwen/Qwen3-tiny", "revision": "a" * 40},
        {"name": "dice", "repo_id": "DeadlyKitt3n/DICE-tiny", "revision": "b" * 40}]}
    out = tmp_path / "data/external/baselines-tiny"
    manifest = acquire("baselines-tiny", spec, out)
    assert manifest["models"] == {"qwen3": {"repo_id": "Qwen/Qwen3-tiny", "revision": "a" * 40},
                                  "dice": {"repo_id": "DeadlyKitt3n/DICE-tiny", "revision": "b" * 40}}
    assert (out / "dice/config.json").read_text() == '{"model_type": "sdar"}\n'
    assert json.loads((out / "qwen3/ACQUIRED.json").read_text())["repo_id"] == "Qwen/Qwen3-tiny"
    shutil.rmtree(tmp_path / "hub")  # verified from the records alone
    acquire("baselines-tiny", {**spec, "models": spec["models"][:1]}, out)
    assert sorted(p.name for p in out.iterdir()) == ["ACQUIRED.json", "qwen3"]
    with pytest.raises(AcquireError, match=r"acquire.baselines-tiny.models\[1\]|hf download Deadly"):
        acquire("baselines-tiny", spec, out)  # dice again, with no cache and no network
    assert (out / "qwen3/config.json").is_file()


def test_every_real_scale_acquires_the_models_its_baselines_read(repo_root):
    """baselines.<scale> of the real scales read only folders under scales.<s>.baselines, and
    that folder is an acquire entry that fetches exactly those models."""
    import yaml

    from dicepipe.config import validate_params

    params = validate_params(yaml.safe_load((repo_root / "params.yaml").read_text()))
    for scale in ("1p7b", "4b", "8b"):
        home = params["scales"][scale]["baselines"]
        name = Path(home).name
        assert home == f"data/external/{name}" and params["acquire"][name]["kind"] == "hub_models"
        fetched = {m["name"] for m in params["acquire"][name]["models"]}
        read = {Path(b["model"]).name for b in params["baselines"][scale]}
        assert read == fetched and {b["paper_system"] for b in params["baselines"][scale]} >= {"SDAR-Chat", "Qwen3", "DICE"}
    # a baseline outside its scale's folder is refused with the key to fix
    params["baselines"]["8b"].append({"name": "mine", "folder": "elsewhere/kernels"})
    with pytest.raises(Exception, match=r"baselines.8b\[4\].*outside 'scales.8b.baselines'"):
        validate_params(params)


def test_a_corpus_runs_from_an_acquired_file(server, tmp_path, monkeypatch, repo_root):
    """The chain from acquisition on: a released-format (CuKe-shaped) prompt/response file of
    the seed corpus's own kernels, served over loopback and fetched by `dicepipe acquire`,
    is what `dicepipe ingest` reads for a corpus that names it."""
    import pyarrow.parquet as pq
    import yaml

    from dicepipe.cli import main

    corpus = repo_root / "data/seed/corpus"
    rows = [{"prompt": "Optimise this program:\n```python\n" + ref.read_text() + "```",
             "response": "```python\n" + (corpus / "kernels" / ref.name).read_text() + "```"}
            for ref in sorted((corpus / "reference").glob("*.py"))[:4]]
    body = json.dumps(rows).encode()
    server["files"][served_path()] = body
    params = yaml.safe_load((repo_root / "params.yaml").read_text())
    params["acquire"]["CuKe"] = files_spec(server["url"], blob_id(body))
    params["corpora"]["concur"]["backend"] = "cpu"
    params["corpora"]["concur"]["source"]["path"] = "data/external/CuKe/CuKe_dataset.json"
    for scale in ("1p7b", "4b", "8b"):
        params["scales"][scale]["backend"] = "cpu"  # a cpu corpus is read by cpu scales
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    monkeypatch.chdir(tmp_path)
    assert main(["acquire", "--name", "CuKe", "--out", "data/external/CuKe"]) == 0
    assert main(["ingest", "--corpus", "concur", "--out", "data/ingest/concur/samples.parquet",
                 "--report", "data/ingest/concur/report.json"]) == 0
    samples = pq.read_table("data/ingest/concur/samples.parquet").to_pylist()
    assert len(samples) == 4 and all("ModelNew" in s["candidate_code"] for s in samples)
