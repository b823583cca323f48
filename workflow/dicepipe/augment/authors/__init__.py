"""Kernel authors behind one interface, chosen by `augment.author` in params.yaml.

An author has a `name`, a `fingerprint()` (what its output depends on: a cached draft is
reused only under the same fingerprint) and `write(task, attempt) -> Draft | None`: the
candidate file for attempt `attempt` of `task`, a Draft carrying the failure reason when no
file came out, or None when it has nothing further to offer for that task."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import ConfigError

# Failure reasons an author may report (the attempt is then recorded as not compiled).
AUTHOR_FAILURES = (
    "author_timeout",  # the request or generation ran past its time limit
    "author_unreachable",  # connection refused, DNS, reset: nothing answered
    "author_http_error",  # the endpoint answered with an HTTP error status
    "author_bad_response",  # the answer is not the chat-completions JSON expected
    "author_no_code",  # an answer without a fenced code block
)
# Failures that say nothing about the task (the service was away): never cached, so a
# re-run asks again.
TRANSIENT_FAILURES = ("author_timeout", "author_unreachable", "author_http_error")


@dataclass(frozen=True)
class Draft:
    code: str | None = None
    failure: str | None = None  # one of AUTHOR_FAILURES when code is None
    detail: str = ""  # short human-readable note on the failure

    @property
    def transient(self) -> bool:
        return self.failure in TRANSIENT_FAILURES


def make_author(settings: dict, backend: str):
    """The author named by `augment.author` (settings = params['augment'])."""
    kind = settings["author"]
    if kind == "templates":
        from .templates import TemplateAuthor

        return TemplateAuthor()
    if kind == "endpoint":
        from .endpoint import EndpointAuthor

        return EndpointAuthor(settings["endpoint"], backend, seed=settings["seed"])
    if kind == "local":
        from .local import LocalAuthor

        return LocalAuthor(settings["local"], backend, seed=settings["seed"])
    raise ConfigError(f"params.yaml: key 'augment.author' has value {kind!r}. "
                      "Expected one of 'templates', 'endpoint', 'local'.")
