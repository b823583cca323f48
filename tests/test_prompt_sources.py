"""Prompts as KernelBench and the DICE release write them, checked against their own code.

- Evaluation (`prompt: kernelbench`): for 3 KernelBench tasks, the ids the evaluation decodes
  from equal KernelBench 423217d's own `get_prompt_for_backend(ref, "cuda", "one_shot")`
  rendered by SDAR's chat template with `add_generation_prompt=True` (the release's call),
  with the real SDAR-8B-Chat tokenizer. Needs ../shared (KernelBench source, tokenizer, suite).
- RL (`released_prompt: release`): a released stage-2 task's prompt ids equal what the
  release's rollout module itself builds for it, tokenised as its engine does
  (`tokenizer.encode`). Needs a DICE release source: $DICEPIPE_DICE_RELEASE or
  ../shared/reference/DICE-1abe887 (a checkout, or a git mirror read at 1abe887).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parent.parent.parent / "shared"
KERNELBENCH = SHARED / "reference" / "KernelBench-423217d"
SDAR = SHARED / "data" / "sdar-8b-chat"
SUITE = SHARED / "data" / "kernelbench" / "kernelbench_levels_1-3.parquet"
RELEASE = Path(os.environ.get("DICEPIPE_DICE_RELEASE", SHARED / "reference" / "DICE-1abe887"))
RELEASE_COMMIT = "1abe887"


def _need(*paths: Path) -> None:
    for path in paths:
        if not path.exists():
            pytest.skip(f"{path} is absent")


@pytest.fixture(scope="module")
def sdar_tokenizer():
    _need(SDAR / "tokenizer_config.json")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(SDAR))


@pytest.fixture(scope="module")
def kernelbench_constructor():
    """KernelBench's own prompt_constructor_toml (src/ on sys.path, its LLM clients stubbed;
    it reads TOML with `tomli`, whose `load` the stdlib's tomllib has too)."""
    _need(KERNELBENCH / "src" / "kernelbench" / "prompt_constructor_toml.py")
    stubs = {name: types.ModuleType(name) for name in ("openai", "litellm", "dotenv")}
    stubs["dotenv"].load_dotenv = lambda *a, **k: None
    stubs["openai"].OpenAI = object
    stubs["litellm"].completion = None
    saved = {name: sys.modules.get(name) for name in (*stubs, "tomli")}
    sys.modules.update(stubs)
    sys.modules.setdefault("tomli", tomllib)
    sys.path.insert(0, str(KERNELBENCH / "src"))
    cwd = os.getcwd()
    try:
        os.chdir(KERNELBENCH)  # its example paths resolve against the repository top
        import kernelbench.prompt_constructor_toml as constructor

        yield constructor
    finally:
        os.chdir(cwd)
        sys.path.remove(str(KERNELBENCH / "src"))
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _three_tasks() -> list[dict]:
    _need(SUITE)
    import pyarrow.parquet as pq

    rows = pq.read_table(SUITE).to_pylist()
    picked = [next(r for r in rows if int(r["level"]) == level) for level in (1, 2, 3)]
    return [{"level": int(r["level"]), "name": r["name"], "code": r["code"]} for r in picked]


def _kernelbench_params() -> dict:
    return {"prompt_sources": {"kernelbench": {"path": str(KERNELBENCH), "commit": "423217d"},
                               "release": {"path": str(RELEASE), "commit": RELEASE_COMMIT}}}


def _ids(encoded) -> list[int]:
    return list(encoded["input_ids"] if isinstance(encoded, dict) or hasattr(encoded, "keys") else encoded)


def test_kernelbench_evaluation_prompt_equals_kernelbench_and_the_chat_template(
        sdar_tokenizer, kernelbench_constructor):
    from dicepipe.config import schema_defaults
    from dicepipe.data.prompt_sources import evaluation_prompt, kernelbench_prompt, source_tree
    from dicepipe.model.generate import GenerationSettings, prompt_ids_for

    tok, params = sdar_tokenizer, _kernelbench_params()
    # the evaluate defaults: no empty think block
    settings = GenerationSettings.from_params(schema_defaults("evaluate", "defaults"), "test")
    for task in _three_tasks():
        theirs_text = kernelbench_constructor.get_prompt_for_backend(task["code"], "cuda", "one_shot")
        ours_text = evaluation_prompt("kernelbench", params, task["code"], "cuda")
        assert ours_text == theirs_text, task["name"]
        theirs = _ids(tok.apply_chat_template([{"role": "user", "content": theirs_text}],
                                              add_generation_prompt=True, tokenize=True))
        ours = prompt_ids_for(tok, [ours_text], settings)[0]
        assert ours == theirs, task["name"]
        assert tok.decode(ours).endswith("NO testing code!\n<|im_end|>\n<|im_start|>assistant\n")
    # the other precisions and zero_shot compose the same way
    tree = source_tree(params, "kernelbench")
    code = _three_tasks()[0]["code"]
    for option, precision in (("one_shot", "bf16"), ("zero_shot", "fp16")):
        assert kernelbench_prompt(tree, code, "cuda", option, precision) == \
            kernelbench_constructor.get_prompt_for_backend(code, "cuda", option, precision)


def test_empty_think_is_an_option(sdar_tokenizer):
    from dicepipe.config import schema_defaults
    from dicepipe.model.generate import GenerationSettings, prompt_ids_for

    tok, user = sdar_tokenizer, "Write ModelNew."
    settings = GenerationSettings.from_params(
        {**schema_defaults("evaluate", "defaults"), "empty_think": True}, "test")
    with_think = prompt_ids_for(tok, [user], settings)[0]
    templated = tok.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                        add_generation_prompt=True, enable_thinking=False)
    assert tok.decode(with_think) == templated
    assert templated.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_missing_kernelbench_source_names_the_key(tmp_path):
    from dicepipe.data.prompt_sources import evaluation_prompt
    from dicepipe.errors import SourceError

    params = {"prompt_sources": {"kernelbench": {"path": str(tmp_path), "commit": "423217d"}}}
    with pytest.raises(SourceError, match="prompt_sources"):
        evaluation_prompt("kernelbench", params, "x", "cuda")


# ---- the release's rollout -------------------------------------------------------------

def _release_file(relative: str) -> str:
    from dicepipe.data.prompt_sources import SourceTree

    return SourceTree("release", RELEASE, RELEASE_COMMIT).read_text(relative)


_RUN_ROLLOUT = r"""
import json, sys, types
for name in ("termcolor", "omegaconf"):
    module = types.ModuleType(name)
    module.cprint = print
    module.DictConfig = module.ListConfig = module.OmegaConf = object
    sys.modules[name] = module
sys.path.insert(0, sys.argv[1])
import sdar_rl_rollout_kernel as rollout
code = json.loads(open(sys.argv[2]).read())
print(json.dumps(rollout.prompt_generate_custom_cuda_from_prompt_template(code)))
"""


def test_released_stage2_task_renders_as_the_release_rollout(sdar_tokenizer, tmp_path):
    """The release's rollout module, run as shipped (its example programs in the `data/`
    folder it reads, which the release leaves out: KernelBench's, as in its evaluation)."""
    _need(RELEASE, KERNELBENCH)
    from dicepipe.data.prompt_sources import KERNELBENCH_EXAMPLE, KERNELBENCH_EXAMPLE_NEW
    from dicepipe.train.rl_tasks import encode_tasks, tasks_from_released_json

    released = json.loads(_release_file("rl_data/end_to_end_kernel_generation_4000.json"))
    items = [released[0], released[len(released) // 2]]
    data = tmp_path / "end_to_end_kernel_generation_4000.json"
    data.write_text(json.dumps(items))
    tasks = tasks_from_released_json(data, "cuda", "release", _kernelbench_params())
    ours = encode_tasks(tasks, sdar_tokenizer, 100_000)

    top = tmp_path / "RL"
    (top / "sample").mkdir(parents=True)
    (top / "data").mkdir()
    (top / "sample" / "sdar_rl_rollout_kernel.py").write_text(
        _release_file("training/RL/sample/sdar_rl_rollout_kernel.py"))
    for name in (KERNELBENCH_EXAMPLE, KERNELBENCH_EXAMPLE_NEW):
        (top / "data" / Path(name).name).write_text((KERNELBENCH / name).read_text())
    by_id = dict(zip((t.task_id for t in ours.tasks), ours.prompt_ids))
    for item in items:
        code = tmp_path / "code.json"
        code.write_text(json.dumps(item["pytorch_code"]))
        env = {k: v for k, v in os.environ.items() if k != "TORCH_EXTENSIONS_DIR"}
        done = subprocess.run([sys.executable, "-c", _RUN_ROLLOUT, str(top / "sample"), str(code)],
                              capture_output=True, text=True, env=env, cwd=tmp_path, check=True)
        theirs_text = json.loads(done.stdout.strip().splitlines()[-1])
        assert theirs_text.startswith("<|im_start|>user\n")
        assert sdar_tokenizer.encode(theirs_text) == by_id[f"released-{item['idx']}"]


# ---- a source's own prompts ---------------------------------------------------------------

_REFERENCE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(64)]


def get_init_inputs():
    return []
'''
_KERNEL = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x.clamp_min(0)
'''


def test_a_source_prompt_reaches_sft_verbatim():
    """CuKe's prompt/response JSON: the prompt is kept as the source wrote it (SFT trains on
    it); a source without prompts gets the project's wording."""
    from dicepipe.data import assemble
    from dicepipe.data.prompts import end_to_end_prompt
    from dicepipe.judgement import named_protocol
    from dicepipe.stages.ingest import normalise_record

    prompt = ("You write custom CUDA kernels ...  \n\n    You are given the following architecture: \n\n"
              f"```\n{_REFERENCE}```\n Optimize it! ")
    record = {"prompt": prompt, "response": f"Plan.\n```python\n{_KERNEL}```\n"}
    sample, why = normalise_record(record, source="cuke", backend="cuda",
                                   settings={"code_block": "first", "min_code_chars": 40})
    assert why is None and sample["prompt"] == prompt
    bare = dict(sample, sample_id="other", prompt=None, reference_code=_REFERENCE + "# b\n")
    measured = {"compiled": True, "correct": True, "correct_robust": True, "speedup_median": 3.0}
    splits, _ = assemble.assemble([sample, bare], {s["sample_id"]: measured for s in (sample, bare)}, [],
                              {"speedup_threshold": 2.0, "robust": False, "val_fraction": 0.0,
                               "min_val_samples": 0, "seed": 0}, named_protocol("strict"))
    prompts = {row["sample_id"]: row["prompt"] for row in splits["sft"]}
    assert prompts[sample["sample_id"]] == prompt
    assert prompts["other"] == end_to_end_prompt(bare["reference_code"], "cuda")
