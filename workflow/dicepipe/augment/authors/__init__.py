"""Kernel authors behind one interface, chosen by `augment.author` in params.yaml.

An author has a `name`, a `fingerprint()` (what its output depends on: a cached draft is
reused only under the same fingerprint) and `write(task, attempt) -> Draft | None`: the
candidate file for attempt `attempt` of `task`, a Draft carrying the failure reason when no
file came out, or None when it has nothing further to offer for that task."""

from __future__ import annotations

from ...errors import ConfigError
from .draft import AUTHOR_FAILURES, TRANSIENT_FAILURES, Draft  # noqa: F401 (the interface)


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
