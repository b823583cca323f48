"""Golden per-step losses of the tiny scale, from fixed inputs only (no timing, no sampling):

- SFT: the shipped base (data/base/tiny) fine-tuned with the tiny scale's SFT settings on a
  pinned split (the first 8 chains of the shipped corpus, data/seed/chains, as end-to-end
  examples), for GOLDEN_SFT_STEPS steps;
- RL: the shipped base updated with rl_infill's tiny settings on recorded rollouts
  (tests/golden/tiny_rollouts.json: two groups of four fixed infilling answers, the chain's
  kernel, a copy with a wrong constant and no code, as traces a sequential decode commits,
  scored by the harness: rewards that differ in each group, among them a near miss; the
  update computes its own old log-probabilities), the same step replayed
  GOLDEN_RL_STEPS times (each an optimiser update on the same traces, so the loss moves
  only if learning happens).

tests/test_golden_losses.py compares a run with tests/golden/tiny.json within GOLDEN_RTOL.
Re-record after a change that is meant to alter training (a new base, another objective):

    python tests/golden_tiny.py record-rollouts   # scores the fixed answers (harness builds)
    python tests/golden_tiny.py write             # recomputes tests/golden/tiny.json
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
BASE = REPO_ROOT / "data/base/tiny"
CORPUS = REPO_ROOT / "data/seed/chains"
GOLDEN = Path(__file__).resolve().parent / "golden" / "tiny.json"
ROLLOUTS = Path(__file__).resolve().parent / "golden" / "tiny_rollouts.json"
GOLDEN_SFT_STEPS = 4
GOLDEN_RL_STEPS = 3
GOLDEN_RTOL = 2e-3  # relative; float32 on another x86 CPU differs far less (summation order)
PINNED_CHAINS = 8


def _params() -> dict:
    from dicepipe.config import load_params

    return load_params(REPO_ROOT / "params.yaml")


def pinned_split() -> tuple[list[str], list[str]]:
    from dicepipe.data import prompts

    names = sorted(p.stem for p in (CORPUS / "reference").glob("*.py"))[:PINNED_CHAINS]
    refs = [(CORPUS / "reference" / f"{n}.py").read_text() for n in names]
    kernels = [(CORPUS / "kernels" / f"{n}.py").read_text() for n in names]
    return ([prompts.end_to_end_prompt(r, "cpu") for r in refs],
            [prompts.response_text(k) for k in kernels])


def _cpu_env():
    import torch
    from dicepipe.train.parallel import DistEnv

    return DistEnv(0, 1, 0, torch.device("cpu"))


def sft_losses(settings_edit=None) -> list[float]:
    """Per-step SFT losses on the pinned split (settings_edit(settings) may change them)."""
    import torch
    from dicepipe.config import stage_settings
    from dicepipe.model.loading import load_saved
    from dicepipe.train.data import prepare_sft_data
    from dicepipe.train.sft import RunOptions, SFTPaths, run_sft

    settings = dict(stage_settings(_params(), "sft", scale="tiny"))
    if settings_edit:
        settings_edit(settings)
    loaded = load_saved(BASE, dtype=torch.float32)
    prompts, responses = pinned_split()
    data = prepare_sft_data(prompts, responses, loaded.tokenizer, loaded.settings, settings["cutoff_len"],
                            pack=settings["pack"])
    with tempfile.TemporaryDirectory() as tmp:
        paths = SFTPaths(Path(tmp) / "out", Path(tmp) / "metrics", Path(tmp) / "work")
        run_sft(loaded, data, settings, paths, _cpu_env(), RunOptions(stop_after_steps=GOLDEN_SFT_STEPS))
        rows = (Path(tmp) / "work" / "steps.tsv").read_text().splitlines()
    header = rows[0].split("\t")
    return [float(dict(zip(header, r.split("\t")))["loss"]) for r in rows[1:]]


def _rl_settings() -> dict:
    from dicepipe.config import stage_settings

    return {**stage_settings(_params(), "rl", stage="rl_infill", scale="tiny"), "stage": "rl_infill"}


def rl_losses(settings_edit=None, negate_advantages: bool = False) -> list[dict]:
    """Per-step update statistics of the recorded rollouts replayed GOLDEN_RL_STEPS times."""
    import torch
    from dicepipe.model.loading import load_saved
    from dicepipe.train.optim import make_adamw
    from dicepipe.train.rl_reward import Rollout, group_advantages
    from dicepipe.train.rl_tasks import Task
    from dicepipe.train.rl_update import TraceScorer, build_policy, train_on_rollouts

    settings = _rl_settings()
    if settings_edit:
        settings_edit(settings)
    record = json.loads(ROLLOUTS.read_text())
    env = _cpu_env()
    torch.manual_seed(settings["seed"])
    loaded = load_saved(BASE, dtype=torch.float32)
    policy, bf16 = build_policy(loaded.model, loaded.settings.block_size, settings, env)
    scorer = TraceScorer(policy, settings, loaded.settings, env, bf16)
    optimizer = make_adamw(policy, settings["learning_rate"], settings["weight_decay"], fused=False)
    rollouts = [Rollout(Task(r["task_id"], 1, "", ""), r["group"], r["prompt_ids"], r["token_ids"],
                        r["steps"], "", r["text_len"], r["stopped"], reward=r["reward"])
                for r in record["rollouts"]]
    advantages, kept_groups = group_advantages([r.reward for r in rollouts], record["group_size"])
    if negate_advantages:
        advantages = [-a for a in advantages]
    kept = [(r, a) for r, a in zip(rollouts, advantages) if kept_groups[r.group]]
    out = []
    for _ in range(GOLDEN_RL_STEPS):
        stats = train_on_rollouts(scorer, None, optimizer, kept, rollouts[0], settings, env)
        out.append({k: float(stats[k]) for k in ("updates", "loss", "kl", "clip_fraction", "grad_norm")})
    return out


def _wrong_constant(kernel: str) -> str:
    """The kernel with its first C++ constant changed: it builds and computes the wrong thing."""
    import re

    match = re.search(r"((?:v = v|float x\d+ = x\d*) \* )(-?[0-9.]+)f", kernel)
    assert match, "the chain kernels changed shape: update tests/golden_tiny.py"
    return kernel[:match.start(2)] + ("7.0" if match.group(2) != "7.0" else "5.0") + kernel[match.end(2):]


def _trace(loaded, prompt_len: int, text: str) -> tuple[list[int], list[int], int]:
    """Token ids of an answer as the decoder commits them (the text, the end of turn, the rest
    of its last block as pad; blocks counted from position 0, as in decoding) and a commit
    step per token (left to right within each block, one per denoising step), as a sequential
    decode of it would record."""
    from dicepipe.model.tokenizer import chat_format, encode_text

    fmt = chat_format(loaded.tokenizer)
    ids = encode_text(loaded.tokenizer, text + fmt.turn_end)
    block = loaded.settings.block_size
    text_len = len(ids)
    ids += [loaded.settings.pad_token_id] * ((-(prompt_len + len(ids))) % block)
    first = prompt_len // block
    steps = [((prompt_len + i) // block - first) * block + (prompt_len + i) % block for i in range(len(ids))]
    return ids, steps, text_len


def record_rollouts(tasks: int = 2) -> None:
    """Two groups of four fixed infilling answers for two corpus chains (the chain's kernel
    twice, a copy with a wrong constant, one with no code), scored by the harness. Fixed
    answers rather than samples: the tiny run's model rarely writes a right kernel, and the
    golden numbers must come from groups whose rewards differ."""
    import torch
    from dicepipe.data import prompts
    from dicepipe.data.extract import code_from_text
    from dicepipe.data.infill import split_for_infilling
    from kernelharness import HarnessSession, HarnessSettings
    from dicepipe.judgement import named_protocol
    from dicepipe.model.loading import load_saved
    from dicepipe.model.tokenizer import prompt_ids
    from dicepipe.train.rl_reward import KernelReward, Rollout
    from dicepipe.train.rl_tasks import Task

    params = _params()
    settings = _rl_settings()
    loaded = load_saved(BASE, dtype=torch.float32)
    names = sorted(p.stem for p in (CORPUS / "reference").glob("*.py"))[PINNED_CHAINS:PINNED_CHAINS + tasks]
    rollouts = []
    for g, name in enumerate(names):
        ref = (CORPUS / "reference" / f"{name}.py").read_text()
        kernel = (CORPUS / "kernels" / f"{name}.py").read_text()
        prefix, _, suffix = split_for_infilling(kernel)
        task = Task(name, 2, ref, prompts.infilling_prompt(ref, prefix, suffix, "cpu"))
        ids = prompt_ids(loaded.tokenizer, task.prompt)
        for answer in (kernel, _wrong_constant(kernel), kernel, None):
            text = prompts.response_text(answer) if answer else "I cannot write this kernel."
            trace, steps, text_len = _trace(loaded, len(ids), text)
            rollouts.append(Rollout(task, g, ids, trace, steps, text, text_len, True,
                                    code=code_from_text(text)))
    with HarnessSession(HarnessSettings.from_params(params["harness"])) as session:
        reward = KernelReward(session, named_protocol(settings["protocol"], params["protocols"]),
                              robust=True, backend="cpu", latency_weight=0.0, latency_cap_speedup=4.0)
        for r, value in zip(rollouts, reward(rollouts)):
            r.reward = value
    rows = [{"task_id": r.task.task_id, "group": r.group, "prompt_ids": r.prompt_ids,
             "token_ids": r.token_ids, "steps": r.steps, "text_len": r.text_len, "stopped": r.stopped,
             "reward": r.reward, "info": r.info} for r in rollouts]
    print([(r["task_id"], r["reward"], r["info"]) for r in rows])
    ROLLOUTS.parent.mkdir(parents=True, exist_ok=True)
    ROLLOUTS.write_text(json.dumps({"group_size": 4, "rollouts": rows}) + "\n")


def write_golden() -> None:
    golden = {"sft_loss": sft_losses(), "rl": rl_losses(),
              "rtol": GOLDEN_RTOL, "base_sha256": base_digest()}
    GOLDEN.write_text(json.dumps(golden, indent=2) + "\n")
    print(json.dumps(golden, indent=2))


def base_digest() -> str:
    import hashlib

    return hashlib.sha256((BASE / "model.safetensors").read_bytes()).hexdigest()


if __name__ == "__main__":
    sys.path.insert(0, str(REPO_ROOT / "workflow"))
    {"record-rollouts": record_rollouts, "write": write_golden}[sys.argv[1]](*sys.argv[2:])
