"""The `endpoint` author: any OpenAI-compatible chat-completions API (a hosted strong
generator, as the paper used Mercury Coder, or a local vLLM/llama.cpp server).

The prompt is the pipeline's KernelBench-style one-shot prompt for the backend (the same
words assemble trains on); the candidate is the answer's first fenced code block, as in
the released recipe. Every failure (HTTP error, timeout, refused connection, an answer
that is not chat-completions JSON, an answer without code) becomes a Draft with a reason:
the stage records it as a failed attempt and goes on."""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import urllib.error
import urllib.request

from ...data import extract, prompts
from ..tasks import Task
from .draft import Draft

log = logging.getLogger(__name__)
DETAIL_CHARS = 300


def _seed(seed: int, task_id: str, attempt: int) -> int:
    digest = hashlib.sha256(f"{seed}:{task_id}:{attempt}".encode()).hexdigest()
    return int(digest[:8], 16)


class EndpointAuthor:
    name = "endpoint"

    def __init__(self, settings: dict, backend: str, seed: int = 0):
        self.base_url = settings["base_url"].rstrip("/")
        self.model = settings["model"]
        # validated params: the schema filled every default
        self.timeout_s = float(settings["timeout_s"])
        self.max_tokens = int(settings["max_tokens"])
        self.temperature = float(settings["temperature"])
        self.concurrency = int(settings["concurrency"])
        self.backend = backend
        self.seed = seed
        key_env = settings.get("api_key_env", "")
        self.api_key = os.environ.get(key_env, "") if key_env else ""
        if key_env and not self.api_key:
            log.warning("environment variable %s is unset: calling %s without an API key",
                        key_env, self.base_url)

    def fingerprint(self) -> str:
        # the key is left out: it changes who pays, not what comes back
        parts = [self.base_url, self.model, self.max_tokens, self.temperature, self.backend]
        return "endpoint:" + json.dumps(parts)

    def request_body(self, task: Task, attempt: int) -> dict:
        return {
            "model": self.model,
            "messages": [{"role": "user",
                          "content": prompts.end_to_end_prompt(task.reference_code, self.backend)}],
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            # servers that honour it make a re-run reproducible; others ignore it
            "seed": _seed(self.seed, task.task_id, attempt),
        }

    def write(self, task: Task, attempt: int) -> Draft:
        body = json.dumps(self.request_body(task, attempt)).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(f"{self.base_url}/chat/completions", data=body,
                                         headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            return Draft(failure="author_http_error", detail=f"HTTP {exc.code}: {_tail(exc)}")
        except TimeoutError as exc:
            return Draft(failure="author_timeout", detail=f"no answer in {self.timeout_s:g} s: {exc}")
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                return Draft(failure="author_timeout",
                             detail=f"no answer in {self.timeout_s:g} s: {exc.reason}")
            return Draft(failure="author_unreachable", detail=str(exc.reason)[:DETAIL_CHARS])
        except http.client.HTTPException as exc:  # not HTTP at all, or cut short
            return Draft(failure="author_bad_response", detail=repr(exc)[:DETAIL_CHARS])
        except (ConnectionError, OSError) as exc:
            return Draft(failure="author_unreachable", detail=str(exc)[:DETAIL_CHARS])
        return parse_completion(raw)


def _tail(exc: urllib.error.HTTPError) -> str:
    try:
        return exc.read().decode(errors="replace")[:DETAIL_CHARS]
    except OSError:
        return ""


def parse_completion(raw: bytes) -> Draft:
    """The candidate file in a chat-completions answer, or why there is none. Pure."""
    try:
        content = json.loads(raw)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return Draft(failure="author_bad_response",
                     detail=raw[:DETAIL_CHARS].decode(errors="replace"))
    if not isinstance(content, str):
        return Draft(failure="author_bad_response", detail=f"content is {type(content).__name__}")
    code = extract.code_from_text(content, "first")
    if code is None:
        return Draft(failure="author_no_code", detail=content[:DETAIL_CHARS])
    return Draft(code=code)
