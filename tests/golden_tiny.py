"""Golden per-step losses of the tiny scale, from fixed inputs only (no timing, no sampling):

- SFT: the shipped base (data/base/tiny) fine-tuned with the tiny scale's SFT settings on a
  pinned split (the first 8 chains of the shipped corpus, data/seed/chains, as end-to-end
  examples), for GOLDEN_SFT_STEPS steps;
- RL: the shipped base updated with rl_infill's tiny settings on recorded rollouts
  (tests/golden/tiny_rollouts.json: two groups decoded from the base at temperature 1 and
  scored by the harness, rewards that differ in each group), the same step replayed
  GOLDEN_RL_STEPS times (each an optimiser update on the same traces, so the loss moves
  only if learning happens).

tests/test_golden_losses.py compares a run with tests/golden/tiny.json within GOLDEN_RTOL.
Re-record after a change that is meant to alter training (a new base, another objective):

    python tests/golden_tiny.py record-rollouts   # decodes and scores (harness builds)
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


def record_rollouts(tasks: int = 2, group_size: int = 4, seed: int = 7) -> None:
    """Decode `tasks` groups from the base at temperature 1 and score them with the harness;
    keep the groups whose rewards differ (tries later seeds until `tasks` are found)."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from dicepipe.data import prompts
    from dicepipe.harness import HarnessSession, HarnessSettings
    from dicepipe.harness.verdict import named_protocol
    from dicepipe.model.loading import load_saved
    from dicepipe.train.rl_reward import KernelReward
    from dicepipe.train.rl_rollout import RolloutModel, decode_settings, roll_out
    from dicepipe.train.rl_tasks import Task, encode_tasks

    params = _params()
    settings = _rl_settings()
    loaded = load_saved(BASE, dtype=torch.float32)
    names = sorted(p.stem for p in (CORPUS / "reference").glob("*.py"))[PINNED_CHAINS:]
    from dicepipe.data.infill import split_for_infilling

    found = []
    with HarnessSession(HarnessSettings.from_params(params["harness"])) as session, \
            ThreadPoolExecutor(1) as pool:
        reward = KernelReward(session, named_protocol(settings["protocol"], params["protocols"]),
                              robust=True, backend="cpu", latency_weight=0.0, latency_cap_speedup=4.0)
        model = RolloutModel(loaded.model, loaded.settings, _cpu_env())
        for attempt in range(8):
            for name in names:
                ref = (CORPUS / "reference" / f"{name}.py").read_text()
                prefix, _, suffix = split_for_infilling((CORPUS / "kernels" / f"{name}.py").read_text())
                task = Task(name, 2, ref, prompts.infilling_prompt(ref, prefix, suffix, "cpu"))
                encoded = encode_tasks([task], loaded.tokenizer, settings["max_prompt_tokens"])
                got, _ = roll_out(model, [(encoded.tasks[0], encoded.prompt_ids[0])], group_size=group_size,
                                  groups_per_call=1, cfg=decode_settings(settings), tokenizer=loaded.tokenizer,
                                  reward=reward, seed=seed + attempt, scorer=pool)
                rewards = [r.reward for r in got]
                print(name, attempt, rewards, flush=True)
                if max(rewards) > min(rewards):
                    found.append(got)
                if len(found) == tasks:
                    break
            if len(found) == tasks:
                break
    if len(found) < tasks:
        raise SystemExit(f"only {len(found)} groups with differing rewards found")
    rows = [{"task_id": r.task.task_id, "group": g, "prompt_ids": r.prompt_ids, "token_ids": r.token_ids,
             "steps": r.steps, "text_len": r.text_len, "stopped": r.stopped, "reward": r.reward,
             "text": r.text}
            for g, group in enumerate(found) for r in group]
    ROLLOUTS.parent.mkdir(parents=True, exist_ok=True)
    ROLLOUTS.write_text(json.dumps({"group_size": group_size, "rollouts": rows}, indent=1) + "\n")


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
    {"record-rollouts": record_rollouts, "write": write_golden}[sys.argv[1]]()
