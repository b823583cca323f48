"""What an author returns for one attempt: a candidate file, or why none came out. Its own
module, so the authors (submodules of the package) import it without running back up into
the package that chooses among them."""

from __future__ import annotations

from dataclasses import dataclass

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
