"""The RL step's parts, each on its own: task sources and curriculum, code extraction, the
kernel reward through a harness session, group normalisation, the latency term; and the
stage end to end through the CLI on a tiny saved model."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pytest
from dicepipe.train.rl_reward import (KernelReward, Rollout, extract_code, group_advantages,
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
    assert extract_code("x\n```python\nA = 1\n```\n```python\nB = 2\n```") == "A = 1\n"
    assert extract_code("no code here") is None


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
    def __init__(self, rows):
        self.rows, self.calls = rows, []

    def evaluate(self, jobs, results_path=None, progress=True, measure_speed=True):
        self.calls.append((list(jobs), measure_speed))
        return pa.Table.from_pylist([self.rows[j.candidate_code] for j in jobs])


def _rollout(code):
    return Rollout(Task("t", 1, REF.format("x"), "p"), 0, [1], [2], [0], "", 1, True, code)


def test_kernel_reward_uses_the_robust_verdict_and_profile():
    from dicepipe.harness.verdict import tolerance_profile

    base = {"compiled": True, "correct": True, "output_precision": "fp32", "speedup_low": 3.0}
    rows = {"good": {**base, "tolerance_needed": 1e-6, "flag_calls_reference": False},
            "loose": {**base, "tolerance_needed": 5e-3, "flag_calls_reference": False},
            "deceptive": {**base, "tolerance_needed": 0.0, "flag_calls_reference": True},
            "broken": {**base, "compiled": False, "correct": False, "tolerance_needed": None}}
    session = FakeSession(rows)
    reward = KernelReward(session, tolerance_profile("kernelbench"), robust=True, backend="cpu")
    rollouts = [_rollout(c) for c in ("good", "loose", "deceptive", "broken", None)]
    assert reward(rollouts) == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert len(session.calls[0][0]) == 4 and session.calls[0][1] is False  # correctness only
    v0 = KernelReward(session, tolerance_profile("kernelbench_v0"), robust=True, backend="cpu",
                      latency_weight=0.5, latency_cap_speedup=9.0)
    assert v0(rollouts)[:2] == pytest.approx([1.25, 1.25])  # 1 + 0.5 x log 3 / log 9 and session.calls[-1][1] is True


def test_stage_runs_through_the_cli_on_a_tiny_saved_model(repo_root, params, tmp_path, build_cache_dir):
    """rl-e2e on CPU: the random model writes no kernel, groups are dropped, the stage still
    selects on validation and hands on a checkpoint (the tiny pipeline's situation)."""
    import yaml
    from dicepipe.cli import main
    from dicepipe.data.cuke import estimate_level
    from dicepipe.data.prompts import end_to_end_prompt
    from dicepipe.data.schema import RL_E2E_SCHEMA, VAL_SCHEMA, write_table
    from dicepipe.model.loading import build_tiny, save_model
    from dicepipe.model.tokenizer import train_tiny_tokenizer

    refs = [REF.format(expr) for expr in ("torch.relu(x)", "x * 2", "torch.sigmoid(x) + x")]
    rows = [{"sample_id": f"s{i}", "level": estimate_level(r), "reference_code": r,
             "prompt": end_to_end_prompt(r, "cpu")} for i, r in enumerate(refs)]
    write_table(pa.Table.from_pylist(rows[:2], schema=RL_E2E_SCHEMA), tmp_path / "rl_e2e.parquet", RL_E2E_SCHEMA)
    val = [{**rows[2], "infill_prompt": None}]
    write_table(pa.Table.from_pylist(val, schema=VAL_SCHEMA), tmp_path / "val.parquet", VAL_SCHEMA)
    tokenizer = train_tiny_tokenizer([r["prompt"] for r in rows] * 3, 512)
    spec = {**params["models"]["tiny"], "vocab_size": 512, "num_hidden_layers": 1}
    save_model(tmp_path / "in", build_tiny(spec, tokenizer))
    local = yaml.safe_load((repo_root / "params.yaml").read_text())
    local["harness"]["cache_dir"] = str(build_cache_dir)
    local["rl"]["overrides"]["tiny"].update(max_new_tokens=16, steps=2, eval_every_steps=1)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(local, sort_keys=False))
    argv = ["rl-e2e", "--params", str(tmp_path / "params.yaml"), "--scale", "tiny", "--model",
            str(tmp_path / "in"), "--data", str(tmp_path / "rl_e2e.parquet"), "--val",
            str(tmp_path / "val.parquet"), "--out", str(tmp_path / "out"), "--metrics",
            str(tmp_path / "metrics"), "--device", "cpu"]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "metrics" / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["tasks"] == 2 and summary["val_tasks"] == 1
    assert summary["best_step"] in (0, 1, 2) and set(summary["val_rewards"]) == {"0", "1", "2"}
    assert (tmp_path / "out" / "block_diffusion.json").is_file()
    assert len((tmp_path / "metrics" / "steps.tsv").read_text().splitlines()) == 3
