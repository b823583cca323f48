"""The harness's one error type: its message says what to fix (a bad job, an unusable
backend, a damaged store). The pipeline's CLI prints it as it prints its own errors."""


class HarnessError(Exception):
    """The kernel harness cannot run (bad job input, unusable backend)."""
