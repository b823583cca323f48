"""Prompts as KernelBench and the DICE release wrote them, read at run time from the sources
params.yaml names under `prompt_sources`: the project ships no copy of their text.

A source is a folder (a checkout, read as it is) or a git repository (a clone or a bare
mirror, read at the named commit with `git show`); `commit` is recorded either way.

- `kernelbench`: KernelBench's `src/kernelbench/prompts/prompts.toml` and the example
  programs it names, composed the way its `prompt_constructor_toml.render_prompt_by_option`
  composes them (the composition is code, re-done here; every word comes from the toml).
- `release` (the DICE release): its prompt constructors are pure functions over module-level
  strings (`evaluation/src/prompt_constructor.py`: the evaluation's user turn;
  `training/RL/sample/sdar_rl_rollout_kernel.py`: the RL rollout's prompt, chat markers
  written into the text). They are taken out of the release's file by name (its imports and
  the rest of the module are never run) and called. Their example programs are KernelBench's
  `model_ex_add.py` / `model_new_ex_add.py` (the release's evaluation ships identical copies;
  the rollout reads them from a `data/` folder the release does not ship).
"""

from __future__ import annotations

import ast
import subprocess
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ..errors import ConfigError, SourceError

KERNELBENCH_PROMPTS = "src/kernelbench/prompts/prompts.toml"
KERNELBENCH_EXAMPLE = "src/kernelbench/prompts/model_ex_add.py"
KERNELBENCH_EXAMPLE_NEW = "src/kernelbench/prompts/model_new_ex_add.py"
RELEASE_EVALUATION = "evaluation/src/prompt_constructor.py"
RELEASE_ROLLOUT = "training/RL/sample/sdar_rl_rollout_kernel.py"
# Every wording a prompt can be asked in: the project's own (data/prompts.py), KernelBench's
# prompts.toml one_shot, the DICE release's constructors.
WORDINGS = ("dicepipe", "kernelbench", "release")


@dataclass(frozen=True)
class SourceTree:
    """A source's files: `path` a folder, or a git repository read at `commit`."""

    name: str
    path: Path
    commit: str

    def _git_dir(self) -> Path | None:
        if (self.path / ".git").exists():
            return self.path / ".git"
        if (self.path / "HEAD").is_file() and (self.path / "objects").is_dir():
            return self.path  # a bare repository (a mirror)
        return None

    def read_text(self, relative: str) -> str:
        return _read(self.path, self.commit, relative, self._git_dir())


@lru_cache(maxsize=64)
def _read(path: Path, commit: str, relative: str, git_dir: Path | None) -> str:
    if git_dir is not None:
        done = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{commit}:{relative}"],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SourceError(f"{path}: no {relative} at commit {commit} ({done.stderr.strip()}). "
                              "Check prompt_sources in params.yaml (path and commit).")
        return done.stdout
    file = path / relative
    if not file.is_file():
        raise SourceError(f"{file}: missing. params.yaml prompt_sources names {path} as the source; "
                          "point `path` at a checkout (or git clone) of it.")
    return file.read_text()


def source_tree(params: dict, name: str) -> SourceTree:
    entry = (params.get("prompt_sources") or {}).get(name)
    if not entry or "path" not in entry:
        raise ConfigError(f"params.yaml prompt_sources.{name}: missing; expected path (a checkout or "
                          "git repository) and commit.")
    return SourceTree(name, Path(entry["path"]).expanduser(), str(entry.get("commit", "")))


# ---- KernelBench prompts.toml -------------------------------------------------------------

def _block(text: str) -> str:
    """One template block as KernelBench's `PromptConfig.compose_blocks([key])` returns it."""
    return text.strip() + "\n"


def kernelbench_prompt(tree: SourceTree, reference_code: str, backend: str = "cuda",
                       option: str = "one_shot", precision: str | None = None) -> str:
    """KernelBench's prompt for `reference_code` (its `get_prompt_for_backend(ref, backend,
    option, precision)`, no hardware blocks): the user turn, no chat markers."""
    cfg = tomllib.loads(tree.read_text(KERNELBENCH_PROMPTS))
    try:
        backend_data = cfg["backends"][backend]
        option_data = cfg["options"][option]
    except KeyError as exc:
        raise ConfigError(f"{tree.path}: prompts.toml has no backends.{backend} / options.{option} "
                          f"(KernelBench prompts exist for {sorted(cfg.get('backends', {}))}; a cpu "
                          "scale takes prompt: dicepipe).") from exc
    shared, common = cfg.get("shared", {}), cfg["templates"]["common"]
    display = backend_data.get("backend_display", backend.upper())
    precision = precision or cfg.get("meta", {}).get("default_precision", "fp32")
    context = {
        "ref_arch_src": reference_code,
        "backend": backend.upper() if backend in ("cuda", "cute") else backend.capitalize(),
        "backend_display": display,
        "problem_statement": shared.get("problem_statement", "").format(backend_display=display),
        "instruction": shared.get("instruction", "").format(backend_display=display),
        "precision_display": cfg["precision"][precision].get("precision_display", precision.upper()),
    }
    if option_data.get("requires_example") == "one_shot":
        example = backend_data.get("few_shot_example_arch") or shared["few_shot_example_arch"]
        entry = _block(common["example_entry_template"]).strip().format(
            example_label="Example:", input_code=tree.read_text(example),
            output_code=tree.read_text(backend_data["one_shot_new_arch"]), backend_display=display)
        context["examples_intro"] = _block(common["example_intro_one_shot"]).strip().format(
            backend_display=display)
        context["examples_entries"] = entry.strip()
    elif option_data.get("requires_example"):
        raise ConfigError(f"KernelBench option {option!r}: only zero_shot and one_shot are rendered here.")
    parts = [context[c] if c in ("problem_statement", "instruction") else _block(common[c])
             for c in option_data["components"]]
    return ("\n".join(parts).strip() + "\n").format(**context).strip() + "\n"


# ---- the DICE release's constructors ----------------------------------------------------

@lru_cache(maxsize=8)
def _release_functions(source: str, wanted: tuple[str, ...]) -> dict:
    """Module-level string constants and the functions `wanted` of a release file, compiled
    alone (no import or other statement of the file runs)."""
    module = ast.parse(source)
    body = []
    for node in module.body:
        wanted_function = isinstance(node, ast.FunctionDef) and node.name in wanted
        text_constant = (isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets)
                         and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str))
        if wanted_function or text_constant:
            body.append(node)
    missing = set(wanted) - {n.name for n in body if isinstance(n, ast.FunctionDef)}
    if missing:
        raise SourceError(f"the release's prompt file lacks {sorted(missing)}; is prompt_sources.release "
                          "a DICE release checkout at its commit?")
    namespace: dict = {"__builtins__": {}}
    # the release's own constructors, run as it runs them (string formatting, no builtins)
    exec(compile(ast.Module(body=body, type_ignores=[]), "<release prompts>", "exec"), namespace)  # noqa: S102
    return namespace


def _release_example(kernelbench: SourceTree) -> tuple[str, str]:
    return kernelbench.read_text(KERNELBENCH_EXAMPLE), kernelbench.read_text(KERNELBENCH_EXAMPLE_NEW)


def release_evaluation_prompt(release: SourceTree, kernelbench: SourceTree, reference_code: str) -> str:
    """The release evaluation's user turn (its `prompt_generate_custom_cuda_from_prompt_template`)."""
    fns = _release_functions(release.read_text(RELEASE_EVALUATION), ("prompt_generate_custom_cuda",))
    return fns["prompt_generate_custom_cuda"](reference_code, *_release_example(kernelbench))


def release_rollout_prompt(release: SourceTree, kernelbench: SourceTree, reference_code: str) -> str:
    """The release's stage-2 RL rollout prompt, chat markers and open assistant turn included
    (its `prompt_generate_custom_cuda_from_prompt_template(pytorch_code)`): tokenise as is."""
    fns = _release_functions(release.read_text(RELEASE_ROLLOUT), ("prompt_generate_custom_cuda",))
    return fns["prompt_generate_custom_cuda"](reference_code, *_release_example(kernelbench))


def release_infilling_prompt(release: SourceTree, reference_code: str, prefix: str, suffix: str) -> str:
    """The release's stage-1 rollout prompt (its Jinja `KERNEL_INFILLING_SYSTEM_PROMPT`), chat
    markers included: tokenise as is."""
    from jinja2 import Template

    fns = _release_functions(release.read_text(RELEASE_ROLLOUT), ())
    return Template(fns["KERNEL_INFILLING_SYSTEM_PROMPT"]).render(
        pytorch_code=reference_code, prefix=prefix, suffix=suffix)


def evaluation_prompt(wording: str, params: dict, reference_code: str, backend: str) -> str:
    """The user turn evaluation sends for a task, in `wording` (one of WORDINGS)."""
    if wording == "dicepipe":
        from .prompts import end_to_end_prompt

        return end_to_end_prompt(reference_code, backend)
    if wording in WORDINGS and backend != "cuda":
        raise ConfigError(f"params.yaml: prompt {wording!r} is a CUDA prompt and this scale's backend is "
                          f"{backend}; set prompt: dicepipe for it (evaluate.overrides.<scale>).")
    kernelbench = source_tree(params, "kernelbench")
    if wording == "kernelbench":
        return kernelbench_prompt(kernelbench, reference_code, backend)
    if wording == "release":
        return release_evaluation_prompt(source_tree(params, "release"), kernelbench, reference_code)
    raise ConfigError(f"prompt wording {wording!r}: expected one of {WORDINGS}.")


def released_task_prompt(wording: str, params: dict, reference_code: str, backend: str) -> tuple[str, bool]:
    """A released stage-2 task's prompt in `wording`: (text, rendered). `release` is the
    rollout's own text with its chat markers (rendered: tokenise as is); the others are user
    turns for the chat template."""
    if wording == "release":
        return release_rollout_prompt(source_tree(params, "release"), source_tree(params, "kernelbench"),
                                      reference_code), True
    return evaluation_prompt(wording, params, reference_code, backend), False
