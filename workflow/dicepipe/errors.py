"""One exception type per concern; the CLI catches `DicepipeError` (and the harness's
`HarnessError`) once and prints it."""


class DicepipeError(Exception):
    """Base of every error the pipeline reports to its user (message says what to fix)."""


class ConfigError(DicepipeError):
    """params.yaml is missing, malformed, or fails its schema / cross-checks."""


class SourceError(DicepipeError):
    """A corpus or benchmark source cannot be read."""


# The harness's own error (a package of its own, so not a DicepipeError); the CLI prints it
# as one of ours. Named here so a stage catches it with the pipeline's errors.
from kernelharness.errors import HarnessError  # noqa: E402,F401


class ModelError(DicepipeError):
    """A model or tokenizer cannot be loaded (missing checkpoint, bad spec)."""


class AcquireError(DicepipeError):
    """An external input cannot be fetched, or what is there does not match its pin."""


class StageInputError(DicepipeError):
    """A stage's input file is missing or does not match its schema."""


class CheckpointError(DicepipeError):
    """A model or checkpoint folder is damaged, or the disk has no room to write one."""
