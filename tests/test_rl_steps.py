"""The RL step's parts, each on its own: task sources and curriculum, code extraction, the
kernel reward through a harness session, group normalisation, the latency term; and the
stage end to end through the CLI on a tiny saved model."""

from __future__ import annotations

import json
import math
from functools import partial

import pyarrow as pa
import pytest
from dicepipe.data.extract import code_from_text
from dicepipe.train.rl_reward import (KernelReward, Rollout, group_advantages,
                                      latency_bonus)
from dicepipe.train.rl_tasks import (Task, curriculum_order, released_difficulty, task_schedule,
                                     tasks_from_released_json, tasks_from_split)

REF = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return {}\n"


def test_curriculum_orders_by_level_then_size():
    tasks = [Task("c", 2, REF.format("x"), "p"), Task("a", 1, REF.format("x") + "\n# more\n", "p"),
             Task("b", 1, REF.format("x"), "p")]
    assert [t.task_id for t in curriculum_order(tasks)] == ["b", "a", "c"]


def test_schedule_sequential_wraps_and_ramp_admits_harder_tasks_gradually():
    assert task_schedule(5, 3, 2, 0, 0) == [[0, 1], [2, 3], [4, 0]]
    ramp = task_schedule(10, 6, 2, 5, seed=1)
    assert ramp == task_schedule(10, 6, 2, 5, seed=1)  # a function of its arguments: resumable
    assert max(ramp[0]) < 2 and max(ramp[1]) < 4  # only the easiest at first
    assert max(i for step in ramp for i in step) >= 8  # all of them by the end of the ramp
    uses = [sum(step.count(i) for step in ramp) for i in range(10)]
    assert max(uses) - min(uses) <= 1  # least-used first: even coverage


def test_released_stage2_file_is_a_task_source(tmp_path):
    items = [{"idx": 0, "level": 1, "pytorch_code": REF.format("torch.relu(x)"), "cuda_code": "",
              "raw_answer": "The difficulty is \\boxed{2}."},
             {"idx": 1, "level": 2, "pytorch_code": REF.format("torch.relu(x) + 1"), "cuda_code": "",
              "raw_answer": "\\boxed{ 3 }"}]
    path = tmp_path / "end_to_end_kernel_generation_4000.json"
    path.write_text(json.dumps(items))
    tasks = tasks_from_released_json(path, "cuda")
    assert [(t.task_id, t.level) for t in tasks] == [("released-0", 1), ("released-1", 2)]
    assert "torch.relu(x) + 1" in tasks[1].prompt and "ModelNew" in tasks[1].prompt
    assert [released_difficulty(i["raw_answer"]) for i in items] == [2, 3]
    path.write_text(json.dumps([{"idx": 0}]))
    with pytest.raises(Exception, match="lacks"):
        tasks_from_released_json(path, "cuda")


def test_split_rows_pick_the_stage_prompt_and_estimate_missing_levels():
    rows = [{"sample_id": "s1", "level": None, "reference_code": REF.format("torch.relu(x)"),
             "prompt": "e2e", "infill_prompt": "infill"},
            {"sample_id": "s2", "level": 2, "reference_code": REF.format("x"), "prompt": "e2e",
             "infill_prompt": None}]
    infill = tasks_from_split(rows, "infill", "cpu")
    assert [(t.task_id, t.prompt, t.level) for t in infill] == [("s1", "infill", 1)]
    assert [t.prompt for t in tasks_from_split(rows, "e2e", "cpu")] == ["e2e", "e2e"]


def test_extract_takes_the_first_fenced_block():
    # rollouts keep the first block as written (the release's extraction)
    first = partial(code_from_text, rule="first", normalise=False)
    assert first("x\n```python\nA = 1  \n```\n```python\nB = 2\n```") == "A = 1  \n"
    assert first("no code here") is None and first("```python\n  \n```") is None


def test_group_advantages_population_std_and_dropped_groups():
    adv, kept = group_advantages([1, 0, 0, 0, 1, 1, 1, 1], 4)
    assert kept == [True, False]
    mean, std = 0.25, math.sqrt(0.25 * 0.75)
    assert adv[:4] == pytest.approx([(1 - mean) / std] + [(0 - mean) / std] * 3)
    assert adv[4:] == [0.0] * 4


def test_latency_bonus_is_bounded_and_needs_a_confident_gain():
    assert latency_bonus(None, 4.0) == 0.0 and latency_bonus(0.9, 4.0) == 0.0
    assert latency_bonus(2.0, 4.0) == pytest.approx(0.5)
    assert latency_bonus(100.0, 4.0) == 1.0


class FakeSession:
    """Rows by the candidate's name (the `load_inline` name in its file)."""

    def __init__(self, rows):
        self.rows, self.calls = rows, []

    def submit(self, jobs, measure_speed=True):
        from concurrent.futures import Future

        jobs = list(jobs)
        self.calls.append((jobs, measure_speed))
        out = []
        for j in jobs:
            future = Future()
            future.set_result(dict(self.rows[j.candidate_code.split("name=")[1].strip("')\n")]))
            out.append(future)
        return out


def _code(name):
    """A file with an extension of its own (no static flag), named `name`."""
    return ("from torch.utils.cpp_extension import load_inline\n"
            f"ext = load_inline(cpp_sources=['int f() {{ return 0; }}'], name={name!r})\n")


def _rollout(code):
    return Rollout(Task("t", 1, REF.format("x"), "p"), 0, [1], [2], [0], "", 1, True,
                   None if code is None else _code(code))


def test_kernel_reward_uses_the_robust_verdict_and_profile():
    from dicepipe.judgement import named_protocol

    base = {"compiled": True, "correct": True, "output_precision": "fp32", "speedup_low": 3.0}
    rows = {"good": {**base, "tolerance_needed": 1e-6, "flag_calls_reference": False},
            "loose": {**base, "tolerance_needed": 5e-3, "flag_calls_reference": False},
            "deceptive": {**base, "tolerance_needed": 0.0, "flag_calls_reference": True},
            "broken": {**base, "compiled": False, "correct": False, "tolerance_needed": None}}
    for row in rows.values():  # KernelBench's 5 trials, each needing what the strict check did
        row["kb_trial_tolerance"] = [row["tolerance_needed"]] * 5
    session = FakeSession(rows)
    reward = KernelReward(session, named_protocol("kernelbench"), robust=True, backend="cpu",
                          latency_weight=0.0, latency_cap_speedup=4.0)
    rollouts = [_rollout(c) for c in ("good", "loose", "deceptive", "broken", None)]
    assert reward(rollouts) == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert len(session.calls[0][0]) == 4 and session.calls[0][1] is False  # correctness only
    v0 = KernelReward(session, named_protocol("kernelbench_v0"), robust=True, backend="cpu",
                      latency_weight=0.5, latency_cap_speedup=9.0)
    assert v0(rollouts)[:2] == pytest.approx([1.25, 1.25])  # 1 + 0.5 x log 3 / log 9
    assert session.calls[-1][1] is True  # a latency term: speed is measured


@pytest.mark.slow
def test_stage_rewards_real_kernels_and_updates_on_them(repo_root, params, tmp_path, build_cache_dir,
                                                        monkeypatch):
    """rl-e2e through the CLI on a tiny saved model whose decoder is a scripted author writing
    real kernels (tests/scripted_policy.py): relu's group holds one right kernel, one that
    compiles and computes the wrong values and two answers without code, so its rewards differ;
    sigmoid's four are right, so its group carries no signal and is dropped. The real harness
    scores them (two builds, cached); the kept group's advantages are the release's; the
    update moves the weights; the stage selects on validation and hands on the trained model."""
    import torch
    import yaml
    from dicepipe.cli import main
    from dicepipe.data.assemble import estimate_level
    from dicepipe.data.prompts import end_to_end_prompt
    from dicepipe.data.schema import RL_E2E_SCHEMA, VAL_SCHEMA, write_table
    from dicepipe.model.loading import build_tiny, save_model
    from dicepipe.model.tokenizer import train_tiny_tokenizer
    from dicepipe.train import rl, rl_rollout
    from safetensors.torch import load_file
    from scripted_policy import (NO_CODE, RIGHT, WRONG_VALUES, ScriptedAuthor, ScriptedDecoder,
                                 answer_kind, relu_kernel, relu_reference, sigmoid_kernel,
                                 sigmoid_reference)

    refs = {"relu": relu_reference(), "sigmoid": sigmoid_reference()}
    rows = [{"sample_id": name, "level": estimate_level(r), "reference_code": r,
             "prompt": end_to_end_prompt(r, "cpu")} for name, r in refs.items()]
    write_table(pa.Table.from_pylist(rows, schema=RL_E2E_SCHEMA), tmp_path / "rl_e2e.parquet", RL_E2E_SCHEMA)
    val = [{**rows[1], "sample_id": "val-sigmoid", "infill_prompt": None}]
    write_table(pa.Table.from_pylist(val, schema=VAL_SCHEMA), tmp_path / "val.parquet", VAL_SCHEMA)
    tokenizer = train_tiny_tokenizer([r["prompt"] for r in rows] * 3 + [relu_kernel(), sigmoid_kernel()] * 3,
                                     512)
    spec = {**params["models"]["tiny-init"], "vocab_size": 512, "num_hidden_layers": 1}
    save_model(tmp_path / "in", build_tiny(spec, tokenizer))
    local = yaml.safe_load((repo_root / "params.yaml").read_text())
    local["harness"]["run"]["cache_dir"] = str(build_cache_dir)
    local["rl"]["overrides"]["tiny"].update(tasks_per_step=2, max_new_tokens=1024, steps=2,
                                            eval_every_steps=1, traces_per_update=2,
                                            micro_batch_traces=2, learning_rate=1e-3)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(local, sort_keys=False))

    author = ScriptedAuthor({refs["relu"]: (relu_kernel(), [RIGHT, WRONG_VALUES, NO_CODE, NO_CODE]),
                             refs["sigmoid"]: (sigmoid_kernel(), [RIGHT])})
    monkeypatch.setattr(rl_rollout, "Decoder", lambda lm, block_settings, compile_layers=False:
                        ScriptedDecoder(author, tokenizer, block_settings))
    decoded, updates = [], []  # what rl_step hands between its parts
    real_roll_out, real_train = rl.roll_out, rl.train_on_rollouts

    def roll_out_spy(*args, **kwargs):
        rollouts, times = real_roll_out(*args, **kwargs)
        decoded.append((kwargs["group_size"], rollouts))
        return rollouts, times

    def train_spy(scorer, *args, **kwargs):
        before = [p.detach().clone() for p in scorer.policy.parameters()]
        stats = real_train(scorer, *args, **kwargs)
        moved = any(not torch.equal(b, p) for b, p in zip(before, scorer.policy.parameters()))
        updates.append((list(args[2]), stats, moved))  # args: ref scorer, optimiser, kept, ...
        # the kept traces' old log-probabilities were computed while scoring went on
        assert {id(r) for r, _a in args[2]} <= set(kwargs["early"].store)
        return stats

    monkeypatch.setattr(rl, "roll_out", roll_out_spy)
    monkeypatch.setattr(rl, "train_on_rollouts", train_spy)
    argv = ["rl-e2e", "--params", str(tmp_path / "params.yaml"), "--scale", "tiny", "--model",
            str(tmp_path / "in"), "--data", str(tmp_path / "rl_e2e.parquet"), "--val",
            str(tmp_path / "val.parquet"), "--out", str(tmp_path / "out"), "--metrics",
            str(tmp_path / "metrics"), "--device", "cpu"]
    assert main(argv) == 0

    # the reward: 1 for the right kernels, 0 for the wrong ones, measured by the harness
    steps = [rollouts for size, rollouts in decoded if size == 4]
    assert len(steps) == 2 and [size for size, _ in decoded].count(1) == 3  # validation: 0, 1, 2
    for rollouts in steps:
        by_task = {}
        for r in rollouts:
            kind = answer_kind(r.text)
            assert r.stopped and r.reward == (1.0 if kind == RIGHT else 0.0), (kind, r.reward, r.info)
            if kind == NO_CODE:
                assert r.code is None
            else:  # scored: both compiled, only the right one correct
                assert r.info == {"compiled": True, "correct": kind == RIGHT}, (kind, r.info)
            by_task.setdefault(r.task.task_id, []).append(r.reward)
        assert by_task == {"relu": [1.0, 0.0, 0.0, 0.0], "sigmoid": [1.0] * 4}
    # the advantages: (r - mean) / population std within relu's group; sigmoid's (all equal) dropped
    assert len(updates) == 2
    right, wrong = math.sqrt(3.0), -1.0 / math.sqrt(3.0)  # sample std would give 1.5 and -0.5
    for kept, stats, moved in updates:
        assert [r.task.task_id for r, _ in kept] == ["relu"] * 4
        assert [a for _, a in kept] == pytest.approx([right if r.reward else wrong for r, _ in kept])
        # the update: two optimiser steps (2 traces each) that move the weights, finite metrics
        assert moved and stats["updates"] == 2 and stats["grad_norm"] > 0, stats
        assert all(math.isfinite(stats[k]) for k in ("loss", "kl", "clip_fraction", "grad_norm")), stats
    summary = json.loads((tmp_path / "metrics" / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["tasks"] == 2 and summary["val_tasks"] == 1
    assert summary["groups_kept_total"] == 2 and summary["steps_without_update"] == 0
    assert summary["mean_reward_first"] == pytest.approx(5 / 8) and "note" not in summary
    # validation writes the right sigmoid greedily: every step ties, the latest is handed on
    assert summary["val_rewards"] == {"0": 1.0, "1": 1.0, "2": 1.0} and summary["best_step"] == 2
    start = load_file(tmp_path / "in" / "model.safetensors")
    trained = load_file(tmp_path / "out" / "model.safetensors")
    assert any(not torch.equal(start[k].float(), trained[k].float()) for k in start)
    lines = (tmp_path / "metrics" / "steps.tsv").read_text().splitlines()
    logged = [dict(zip(lines[0].split("\t"), line.split("\t"))) for line in lines[1:]]
    assert [(r["groups"], r["groups_kept"], r["updates"]) for r in logged] == [("2", "1", "2")] * 2
