"""The harness as a package of its own (harness/, kernelharness): the pipeline's stages that
only judge rows load none of its build or worker code, and the old import path still works,
with a deprecation warning, as the same modules."""

from __future__ import annotations

import subprocess
import sys
import warnings


def _loaded_after(statement: str) -> list[str]:
    code = (f"{statement}\nimport sys\n"
            "print('\\n'.join(sorted(m for m in sys.modules if m.startswith('kernelharness'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_assemble_loads_no_build_or_worker_code():
    loaded = _loaded_after("import dicepipe.stages.assemble, dicepipe.data.assemble, "
                           "dicepipe.judgement")
    heavy = [m for m in loaded if m.startswith(("kernelharness.compilation",
                                                 "kernelharness.worker",
                                                 "kernelharness.session",
                                                 "kernelharness.orchestrator"))]
    assert not heavy, heavy


def test_the_old_import_path_warns_and_gives_the_same_modules():
    import kernelharness
    import kernelharness.compilation.buildspec as buildspec
    from dicepipe import judgement

    for name in [m for m in sys.modules if m.startswith("dicepipe.harness")]:
        del sys.modules[name]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import dicepipe.harness as old
        from dicepipe.harness.build import buildspec as old_buildspec
        from dicepipe.harness.verdict import judge
    assert old.HarnessSettings is kernelharness.HarnessSettings
    assert old_buildspec is buildspec and buildspec.__spec__.name == buildspec.__name__
    assert judge is judgement.judge
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert any("import kernelharness" in m for m in messages), messages
    assert any("dicepipe.judgement" in m for m in messages), messages
