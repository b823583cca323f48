"""The harness's method version: what a result row means beyond its measurement settings.

Raise METHOD_VERSION when a change alters any recorded field of a row measured from the same
job and settings (a verdict, a flag, an error's phase, what counts as a build failure, how a
time is taken). Then every stored row of an older version is measured again (never resumed,
never reused), and both of the pipeline's runners re-run every measuring stage: each tracks
this constant (Snakemake as a rule param, DVC as a Python params file) instead of the
harness's source files, so a docstring or a faster build re-runs nothing.
tests/test_golden_rows.py holds the discipline: it fails when the seed suite's recorded
fields change while this number stays. CHANGELOG.md beside the package says what each
raise re-measures.
"""

METHOD_VERSION = 5
