"""The RL loop on a tiny random model (CPU, fp32) with toy rewards: it learns (the mean
reward rises over a few dozen steps; with lr 0 it does not), the loss matches a direct
computation, and a killed run resumes into exactly the uninterrupted run's next step."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch
from dicepipe.model.loading import LoadedModel
from dicepipe.model.settings import BlockSettings
from dicepipe.model.shapes import qwen3_config, random_qwen3
from dicepipe.model.trace import Trace, TracePolicy, build_trace_batch, dense_trace_mask
from dicepipe.train.parallel import init_distributed
from dicepipe.train.rl import RLPaths, RunOptions, run_rl
from dicepipe.train.rl_loss import trace_policy_loss
from dicepipe.train.rl_tasks import EncodedTasks, Task

VOCAB, MASK_ID, PAD_ID, STOP_ID = 97, 96, 0, 1  # as tests/test_rl_trace.py
SHAPE = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 8}
TARGET = 7  # the toy reward's token


class ToyTokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))

    def save_pretrained(self, folder):
        Path(folder, "toy_tokenizer.json").write_text("{}\n")


def _loaded(seed=0) -> LoadedModel:
    lm = random_qwen3(qwen3_config(SHAPE, vocab_size=VOCAB, initializer_range=0.1), seed=seed)
    settings = BlockSettings(block_size=4, mask_token_id=MASK_ID, pad_token_id=PAD_ID, stop_token_ids=(STOP_ID,))
    return LoadedModel(lm, ToyTokenizer(), settings)


def _tasks(n=2) -> EncodedTasks:
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(2, MASK_ID, (5 + i,), generator=gen).tolist() for i in range(n)]
    tasks = [Task(f"t{i}", 1, "ref", "prompt") for i in range(n)]
    return EncodedTasks(tasks, prompts, 0)


def early_target_reward(rollouts):
    """1 when the target token is among the first four committed tokens."""
    return [float(TARGET in r.token_ids[:4]) for r in rollouts]


def _settings(params, **changes) -> dict:
    from dicepipe.config import stage_settings

    s = {**stage_settings(params, "rl", stage="rl_e2e", scale="tiny"), "stage": "rl_e2e"}
    s.update(tasks_per_step=2, group_size=8, max_new_tokens=8, learning_rate=3e-3, traces_per_update=8,
             micro_batch_traces=4, kl_beta=0.0, eval_every_steps=1000, steps=30, strategy="dynamic")
    s.update(changes)
    return s


def _run(tmp, settings, options=RunOptions(), val=None, reward=early_target_reward):
    paths = RLPaths(tmp / "model", tmp / "metrics", tmp / "work")
    val = val or EncodedTasks([], [], 0)
    return run_rl(_loaded(), _tasks(), val, reward, settings, paths, init_distributed("cpu"), options), paths


def _rewards(metrics: Path) -> list[float]:
    lines = (metrics / "steps.tsv").read_text().splitlines()
    col = lines[0].split("\t").index("mean_reward")
    return [float(line.split("\t")[col]) for line in lines[1:]]


def test_mean_reward_rises_with_learning_and_not_without(params, tmp_path, one_thread):
    _run(tmp_path / "learn", _settings(params))
    learned = _rewards(tmp_path / "learn" / "metrics")
    _run(tmp_path / "frozen", _settings(params, learning_rate=0.0))
    frozen = _rewards(tmp_path / "frozen" / "metrics")
    first, last = sum(learned[:5]) / 5, sum(learned[-5:]) / 5
    assert last > first + 0.3, learned
    assert abs(sum(frozen[-5:]) / 5 - sum(frozen[:5]) / 5) < 0.2, frozen


def test_loss_matches_a_direct_computation():
    """Per token: log-probability at its unmask step (a plain forward of the canvas as it was),
    ratio, clipping and k3 KL, summed over tokens / (traces x max_new_tokens)."""
    loaded = _loaded(seed=2)
    traces = [Trace((5, 6, 7), (9, 10, 11, 12, 13), (1, 0, 1, 2, 2)),
              Trace((8, 9, 10, 11, 12, 13), (14, 15), (0, 0))]
    adv = [1.5, -0.7]
    policy = TracePolicy(copy.deepcopy(loaded.model), 4)
    batch = build_trace_batch([[t] for t in traces], 4, MASK_ID, PAD_ID)
    new = policy(batch, dense_trace_mask(batch))
    old = new.detach() + torch.linspace(-0.4, 0.4, len(new))  # off-policy by a known amount
    ref = new.detach() - 0.1
    terms = trace_policy_loss(new, old, ref, torch.tensor(adv)[batch.target_trace], clip_eps=0.2,
                              kl_beta=0.05, normaliser=2 * 8)
    # direct: each token's probability from a full forward of the canvas before its step
    from test_rl_trace import _direct_logprobs

    expected = 0.0
    index = 0
    for t, trace in enumerate(traces):
        direct = _direct_logprobs(loaded.model, trace)
        for k in batch.target_order[batch.target_trace == t].tolist():
            lp = direct[k]
            ratio = float(torch.exp(torch.tensor(lp) - old[index]))
            clipped = min(max(ratio, 0.8), 1.2)
            policy_term = -min(ratio * adv[t], clipped * adv[t])
            d = float(ref[index]) - lp
            expected += policy_term + 0.05 * (torch.exp(torch.tensor(d)).item() - 1 - d)
            index += 1
    assert abs(float(terms.loss.detach()) - expected / 16) < 1e-5


def test_frozen_reference_is_the_starting_policy(params, tmp_path, one_thread):
    """kl_reference frozen with lr 0: the policy never moves, so its KL to the frozen copy is
    exactly 0 in every update (a copy that missed a weight or buffer would not be)."""
    _run(tmp_path / "kl", _settings(params, steps=3, learning_rate=0.0, kl_reference="frozen",
                                    kl_beta=0.05))
    lines = (tmp_path / "kl" / "metrics" / "steps.tsv").read_text().splitlines()
    header = lines[0].split("\t")
    rows = [dict(zip(header, line.split("\t"))) for line in lines[1:]]
    assert sum(int(r["updates"]) for r in rows) > 0, rows
    assert all(abs(float(r["kl"])) < 1e-9 for r in rows), rows


def test_resume_after_a_kill_reproduces_the_next_step(params, tmp_path, one_thread):
    settings = _settings(params, steps=3, kl_reference="frozen", kl_beta=0.01)
    full_summary, _ = _run(tmp_path / "full", settings, RunOptions(keep_checkpoints=True))
    assert _run(tmp_path / "cut", settings, RunOptions(stop_after_steps=1))[0] is None
    # both runners delete a failed job's outputs (the metrics folder) before re-running it
    shutil.rmtree(tmp_path / "cut" / "metrics", ignore_errors=True)
    summary, _ = _run(tmp_path / "cut", settings)
    assert _without_wall_time(summary) == _without_wall_time(full_summary)
    assert (summary["resumes"], summary["resumed_at_steps"]) == (1, [1])
    assert (full_summary["resumes"], full_summary["resumed_at_steps"]) == (0, [])
    full_val = (tmp_path / "full" / "metrics" / "val.tsv").read_text()
    assert (tmp_path / "cut" / "metrics" / "val.tsv").read_text() == full_val
    full = (tmp_path / "full" / "metrics" / "steps.tsv").read_text().splitlines()
    cut = (tmp_path / "cut" / "metrics" / "steps.tsv").read_text().splitlines()
    drop = [i for i, c in enumerate(full[0].split("\t")) if c.startswith(("time_", "gen_tokens_per_s"))]

    def strip(line):
        return [v for i, v in enumerate(line.split("\t")) if i not in drop]

    assert [strip(x) for x in cut] == [strip(x) for x in full]
    from safetensors.torch import load_file

    a = load_file(tmp_path / "full" / "model" / "model.safetensors")
    b = load_file(tmp_path / "cut" / "model" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert summary["best_step"] == 3


def _without_wall_time(summary: dict) -> dict:
    """The summary less what differs between any two runs (wall time) or names the resumes."""
    return {k: v for k, v in summary.items() if k not in ("train_time_s", "resumes", "resumed_at_steps")}


def _tsv_without_wall_time(path: Path) -> list[list[str]]:
    lines = path.read_text().splitlines()
    keep = [i for i, c in enumerate(lines[0].split("\t")) if not c.startswith(("time_", "gen_tokens_per_s"))]
    return [[line.split("\t")[i] for i in keep] for line in lines]


def test_kill_between_checkpoints_resumes_with_the_whole_runs_logs_and_selection(
        params, tmp_path, one_thread, monkeypatch):
    """Checkpoints every 2 steps, validation every step: killed during step 4 (after step 3's
    rows and its validation, which may have saved a new best model), the metrics folder
    deleted as both runners do, resumed and stopped at 3, resumed again. The logs are the
    uninterrupted run's (steps.tsv less its wall-time columns, val.tsv exactly), the selected
    model and the summary too, with both resumes noted."""
    from dicepipe.train import rl as rl_loop
    from test_sft_train import interrupt_at_call

    settings = _settings(params, steps=4, save_every_steps=2, eval_every_steps=1)
    val = EncodedTasks(_tasks(1).tasks, _tasks(1).prompt_ids, 0)
    full_summary, _ = _run(tmp_path / "full", settings, val=val)

    interrupt_at_call(monkeypatch, rl_loop, "rl_step", 4)
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path / "cut", settings, val=val)
    work = tmp_path / "cut" / "work"
    assert json.loads((work / "latest.json").read_text())["step"] == 2
    assert [r[0] for r in _tsv_without_wall_time(work / "steps.tsv")[1:]] == ["1", "2", "3"]
    assert len(list(work.glob("best-*"))) <= 2  # the best so far and the checkpoint's best
    shutil.rmtree(tmp_path / "cut" / "metrics", ignore_errors=True)
    assert _run(tmp_path / "cut", settings, RunOptions(stop_after_steps=3), val=val)[0] is None
    shutil.rmtree(tmp_path / "cut" / "metrics", ignore_errors=True)
    summary, _ = _run(tmp_path / "cut", settings, val=val)

    full, cut = tmp_path / "full" / "metrics", tmp_path / "cut" / "metrics"
    assert (cut / "val.tsv").read_text() == (full / "val.tsv").read_text()
    assert _tsv_without_wall_time(cut / "steps.tsv") == _tsv_without_wall_time(full / "steps.tsv")
    assert _without_wall_time(summary) == _without_wall_time(full_summary)
    assert (summary["resumes"], summary["resumed_at_steps"]) == (2, [2, 3])
    assert json.loads((cut / "summary.json").read_text())["resumed_at_steps"] == [2, 3]
    from safetensors.torch import load_file

    a = load_file(tmp_path / "full" / "model" / "model.safetensors")
    b = load_file(tmp_path / "cut" / "model" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_stage_runs_when_every_group_is_dropped_and_selects_on_validation(params, tmp_path, one_thread):
    """A reward that is always 0: no update, the summary says so, a checkpoint is handed on."""
    settings = _settings(params, steps=2, eval_every_steps=1)
    val = EncodedTasks(_tasks(1).tasks, _tasks(1).prompt_ids, 0)
    summary, paths = _run(tmp_path, settings, val=val, reward=lambda rs: [0.0] * len(rs))
    assert summary["groups_kept_total"] == 0 and "never updated" in summary["note"]
    assert summary["best_step"] == 2 and summary["val_rewards"] == {"0": 0.0, "1": 0.0, "2": 0.0}
    assert (paths.out_dir / "model.safetensors").is_file()
    saved = json.loads((paths.metrics_dir / "summary.json").read_text())
    assert saved["best_step"] == 2
    assert (paths.metrics_dir / "val.tsv").read_text().splitlines()[0] == \
        "step\tval_reward\tval_tasks\tval_compiled"
    samples = json.loads((paths.metrics_dir / "val_samples.json").read_text())
    assert samples["before"]["step"] == 0 and samples["selected"]["step"] == 2
    assert len(samples["before"]["samples"]) == 1 and samples["before"]["samples"][0]["reward"] == 0.0


def test_rollout_copy_is_built_on_the_device_and_computes_the_same():
    from dicepipe.train.rl_rollout import device_copy

    lm = _loaded().model.eval()
    clone = device_copy(lm, torch.device("cpu"), torch.float32).eval()
    assert all(p.data_ptr() != q.data_ptr() for p, q in zip(lm.parameters(), clone.parameters()))
    ids = torch.arange(1, 13).unsqueeze(0) % VOCAB
    with torch.no_grad():
        want = lm(input_ids=ids).logits
        got = clone(input_ids=ids).logits
    assert torch.equal(want, got)  # rotary buffers (non-persistent) included
    with torch.no_grad():
        next(clone.parameters()).add_(1.0)
    assert not torch.equal(next(lm.parameters()), next(clone.parameters()))
