"""The endpoint author against small OpenAI-compatible servers on 127.0.0.1 (started here, in
threads): answers with code, garbage, HTTP errors, answers too late, and no server at all.
The stage must record each failure as an attempt and finish."""

from __future__ import annotations

import argparse
import copy
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pyarrow.parquet as pq
import pytest
from dicepipe.augment import generate_tasks
from dicepipe.augment.authors.endpoint import EndpointAuthor, parse_completion

BROKEN_FILE = "import torch\n\nclass ModelNew(:\n    pass\n"


def _completion(content: str) -> bytes:
    return json.dumps({"id": "x", "object": "chat.completion",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                    "finish_reason": "stop"}]}).encode()


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length))
        self.server.requests.append({"path": self.path, "body": body,
                                     "auth": self.headers.get("Authorization")})
        mode = self.server.mode
        if mode == "slow":
            time.sleep(self.server.delay_s)
        if mode == "error":
            self._send(500, b'{"error": "overloaded"}')
        elif mode == "garbage":
            self._send(200, b"<html>this is not json")
        elif mode == "prose":
            self._send(200, _completion("I would rather not write code today."))
        else:
            self._send(200, _completion(f"Here you go:\n```python\n{BROKEN_FILE}```\nDone."))

    def _send(self, status: int, payload: bytes):
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (timeout test)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    servers = []

    def start(mode: str, delay_s: float = 0.0):
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        httpd.daemon_threads = True
        httpd.mode, httpd.delay_s, httpd.requests = mode, delay_s, []
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return httpd, f"http://127.0.0.1:{httpd.server_address[1]}/v1"

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def _settings(params, base_url: str, timeout_s: float = 5.0) -> dict:
    settings = copy.deepcopy(params["augment"])
    settings["author"] = "endpoint"
    settings["attempts"] = 2
    settings["families"] = ["rmsnorm_proj", "mlp_plain"]
    settings["max_tasks"] = {"cpu": 2}
    settings["endpoint"].update(base_url=base_url, timeout_s=timeout_s, api_key_env="DP_TEST_KEY")
    return settings


def _task(settings):
    return generate_tasks(settings, "cpu")[0]


def test_request_is_a_chat_completion_with_the_one_shot_prompt(params, server, monkeypatch):
    monkeypatch.setenv("DP_TEST_KEY", "sekrit")
    httpd, url = server("code")
    settings = _settings(params, url)
    author = EndpointAuthor(settings["endpoint"], "cpu", seed=0)
    task = _task(settings)
    draft = author.write(task, 0)
    assert draft.code == BROKEN_FILE and draft.failure is None
    (request,) = httpd.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["auth"] == "Bearer sekrit"
    body = request["body"]
    assert body["model"] == settings["endpoint"]["model"]
    assert body["messages"][0]["role"] == "user"
    assert task.reference_code.strip() in body["messages"][0]["content"]
    assert "load_inline" in body["messages"][0]["content"]
    assert author.write(task, 1) and httpd.requests[1]["body"]["seed"] != body["seed"]
    assert "sekrit" not in author.fingerprint()


@pytest.mark.parametrize("mode, reason", [("garbage", "author_bad_response"),
                                          ("prose", "author_no_code"),
                                          ("error", "author_http_error"),
                                          ("slow", "author_timeout")])
def test_failures_become_drafts_with_reasons(params, server, mode, reason):
    _, url = server(mode, delay_s=2.0)
    settings = _settings(params, url, timeout_s=0.3)
    draft = EndpointAuthor(settings["endpoint"], "cpu").write(_task(settings), 0)
    assert draft.code is None and draft.failure == reason and draft.detail


def test_server_down_is_unreachable(params):
    settings = _settings(params, _closed_port_url(), timeout_s=2.0)
    draft = EndpointAuthor(settings["endpoint"], "cpu").write(_task(settings), 0)
    assert draft.failure == "author_unreachable" and draft.transient


def test_a_server_that_does_not_speak_http_is_a_bad_response(params):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def answer_garbage():
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(b"\x00\x01 not http at all\r\n\r\n")
        conn.close()

    thread = threading.Thread(target=answer_garbage, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    settings = _settings(params, url, timeout_s=5.0)
    draft = EndpointAuthor(settings["endpoint"], "cpu").write(_task(settings), 0)
    thread.join(5)
    listener.close()
    assert draft.code is None and draft.failure == "author_bad_response"


def test_parse_completion_takes_the_first_fenced_block():
    raw = _completion("a\n```python\nfirst = 1\n```\nb\n```python\nsecond = 2\n```")
    assert parse_completion(raw).code == "first = 1\n"
    assert parse_completion(b'{"choices": []}').failure == "author_bad_response"
    assert parse_completion(_completion("```\n\n```")).failure == "author_no_code"


def _run_stage(params, settings, out, work):
    from dicepipe.stages import augment

    params = dict(params, augment=settings)
    args = argparse.Namespace(corpus="seed", out=str(out), work_dir=str(work))
    assert augment.run(args, params) == 0
    report = json.loads((out / "report.json").read_text())
    return pq.read_table(out / "attempts.parquet").to_pylist(), report


@pytest.mark.parametrize("mode", ["garbage", "slow", "down"])
def test_stage_records_author_failures_and_finishes(params, server, tmp_path, mode):
    if mode == "down":
        url, httpd = _closed_port_url(), None
    else:
        httpd, url = server(mode, delay_s=2.0)
    settings = _settings(params, url, timeout_s=0.3)
    rows, report = _run_stage(params, settings, tmp_path / "out", tmp_path / "work")
    expected = {"garbage": "author_bad_response", "slow": "author_timeout",
                "down": "author_unreachable"}[mode]
    assert len(rows) == 4  # 2 tasks x 2 attempts, none kept
    assert {r["reason"] for r in rows} == {expected}
    assert not any(r["compiled"] or r["kept"] for r in rows)
    assert report["tasks"] == 2 and report["tasks_with_sample"] == 0
    assert report["tasks_without_sample_by_reason"] == {expected: 2}
    assert pq.read_table(tmp_path / "out" / "structural.parquet").num_rows == 0
    if httpd is not None:
        assert len(httpd.requests) == 4


def test_stage_verifies_answers_and_resumes_without_asking_again(params, server, tmp_path):
    httpd, url = server("code")
    settings = _settings(params, url)
    out, work = tmp_path / "out", tmp_path / "work"
    rows, report = _run_stage(params, settings, out, work)
    assert [r["reason"] for r in rows] == ["not_compiled"] * 4
    assert report["tasks_without_sample_by_reason"] == {"not_compiled": 2}
    assert all(r["job_id"] and r["author"] == "endpoint" for r in rows)
    assert len(httpd.requests) == 4
    first = (out / "attempts.parquet").read_bytes()
    rows_again, _report = _run_stage(params, settings, out, work)
    assert len(httpd.requests) == 4  # drafts came from the journal, verdicts from the harness file
    assert rows_again == rows
    assert (out / "attempts.parquet").read_bytes() == first
