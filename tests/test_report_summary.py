"""The run's one-page summary (evaluation/summary_page.py, written by `dicepipe curves`) and
the reasons the plots write into an empty or flat panel. Small fixtures, no pipeline run."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
from dicepipe.cli import main
from dicepipe.evaluation import run_facts as rf
from dicepipe.evaluation import summary_page as sp

PROTOCOLS = ("kernelbench_v0", "kernelbench", "strict")
METRICS = ("exec", "fast_1_point", "fast_1_interval", "fast_2_point", "fast_2_interval",
           "geomean_speedup", "launch_bound_share", "pass_at_1")


def _summary_row(system: str, level: str, exec_: float, with_code: float, compiled: float) -> dict:
    row = {"system": system, "level": level, "tasks": 4, "reference_failed": 0,
           "samples_per_task": 1, "with_code": with_code, "compiled": compiled}
    for protocol in PROTOCOLS:
        row[f"{protocol}.reference_limited"] = 0
        for verdict_name in ("plain", "robust"):
            value = exec_ if verdict_name == "plain" or protocol != "strict" else exec_ / 2
            for metric in METRICS:
                row[f"{protocol}.{verdict_name}.{metric}"] = (
                    "" if metric == "geomean_speedup" and not value else
                    1.3 if metric == "geomean_speedup" else value)
    return row


def _write_csv(path: Path, rows: list[dict], columns: list[str] | None = None) -> None:
    columns = columns or list(rows[0])
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def _write_tsv(path: Path, header: str, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([header, *lines]) + "\n")


STEP_HEADER = "step\ttasks\trollouts\tmean_reward\tgroups\tgroups_kept\tupdates\tloss\tkl"


def make_run(root: Path, *, e2e_updates: bool = True, val_rows: bool = True,
             model_code: float = 0.0) -> dict[str, Path]:
    """The files `curves` reads: sft and both RL stages (rl_infill never updates; rl_e2e
    updates in two of three steps unless e2e_updates is False) and both evaluation tables."""
    m = root / "metrics"
    _write_tsv(m / "sft/steps.tsv", "step\tepoch\tloss\tlearning_rate\tgrad_norm",
               ["1\t1\t7.62\t0.001\t2.0", "2\t1\t7.1\t0.001\t1.5", "3\t2\t6.81\t0.0005\t1.2"])
    (m / "sft/summary.json").write_text('{"steps": 3, "loss_first": 7.62, "loss_final": 6.81}')
    infill = m / "rl_infill"
    _write_tsv(infill / "steps.tsv", STEP_HEADER,
               ["1\t2\t8\t0.0\t2\t0\t0\t\t", "2\t2\t8\t0.0\t2\t0\t0\t\t"])
    _write_tsv(infill / "val.tsv", "step\tval_reward\tval_tasks",
               ["0\t0.0\t3", "2\t0.0\t3"] if val_rows else [])
    (infill / "summary.json").write_text(
        '{"steps": 2, "best_step": 0, "best_val_reward": 0.0, "groups_kept_total": 0,'
        ' "note": "no group had rewards that differed, so the policy was never updated"}')
    e2e = m / "rl_e2e"
    if e2e_updates:
        _write_tsv(e2e / "steps.tsv", STEP_HEADER,
                   ["1\t2\t8\t0.125\t2\t1\t2\t0.1\t0.001", "2\t2\t8\t0.0\t2\t0\t0\t\t",
                    "3\t2\t8\t0.375\t2\t2\t3\t0.2\t0.004"])
        _write_tsv(e2e / "val.tsv", "step\tval_reward\tval_tasks",
                   ["0\t0.0\t3", "2\t0.333333\t3", "3\t0.333333\t3"] if val_rows else [])
        (e2e / "summary.json").write_text('{"steps": 3, "best_step": 3, "groups_kept_total": 3,'
                                          ' "best_val_reward": 0.333333}')
    else:
        _write_tsv(e2e / "steps.tsv", STEP_HEADER, ["1\t2\t8\t0.0\t2\t0\t0\t\t"])
        _write_tsv(e2e / "val.tsv", "step\tval_reward\tval_tasks", ["0\t\t0", "1\t\t0"])
        (e2e / "summary.json").write_text('{"steps": 1, "best_step": 1, "best_val_reward": null,'
                                          ' "groups_kept_total": 0}')
    results = root / "results/kernelbench_tiny.csv"
    model = [_summary_row("tiny", lv, 0.0, model_code, 0.0) for lv in ("1", "2", "all")]
    _write_csv(results, model)
    compare_rows = []
    for level in ("1", "2", "all"):
        for system, exec_, code in (("tiny", 0.0, model_code), ("reference_copies", 1.0, 1.0),
                                    ("seed_kernels", 0.5, 0.75)):
            compare_rows.append({"source": "run", "paper_system": "", "size": "",
                                 "protocol": ";".join(PROTOCOLS),
                                 **_summary_row(system, level, exec_, code, code)})
        compare_rows.append({"source": "DICE paper (arXiv 2602.11715), Table 1",
                             "system": "DICE-8B",
                             "paper_system": "DICE-8B", "size": "8B", "protocol": "kernelbench_v0",
                             "level": level, "kernelbench_v0.plain.exec": 0.64,
                             "kernelbench_v0.plain.fast_1_point": 0.2})
    columns = list(sp.LABEL_NOTES)[:6] + [c for c in model[0] if c not in ("system", "level")]
    _write_csv(root / "results/kernelbench_compare_tiny.csv", compare_rows, columns)
    return {"sft": m / "sft", "rl_infill": infill, "rl_e2e": e2e, "results": results,
            "compare": root / "results/kernelbench_compare_tiny.csv"}


def _curves(ws: Path, run: dict[str, Path], out: str = "curves") -> list[str]:
    return ["curves", "--scale", "tiny", "--sft", str(run["sft"].relative_to(ws)),
            "--rl-infill", str(run["rl_infill"].relative_to(ws)),
            "--rl-e2e", str(run["rl_e2e"].relative_to(ws)),
            "--results", str(run["results"].relative_to(ws)),
            "--compare", str(run["compare"].relative_to(ws)), "--out", out]


@pytest.fixture()
def ws(repo_root, tmp_path, monkeypatch):
    import shutil

    shutil.copy(repo_root / "params.yaml", tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _text(page: str) -> str:
    """The page's visible text, tags dropped, whitespace collapsed."""
    import html

    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page.split("<body>")[1])).split())


def test_summary_page_says_what_happened_and_is_deterministic(ws):
    run = make_run(ws)
    assert main(_curves(ws, run)) == 0
    page_path = ws / "curves/summary.html"
    first = page_path.read_bytes()
    page = first.decode()
    text = _text(page)
    # SFT loss at the start and the end
    assert "training loss 7.62 at the start, 6.81 at the end" in text
    # a stage that never updated says so; one that did counts its updates
    assert "rl_infill : 2 steps, no policy update : no group's rewards differed" in text
    assert "rl_e2e : 3 steps, 5 policy updates in 2 of them" in text
    assert "validation reward 0 before the first update (step 0" in text.lower()
    assert "selected step 3: validation reward 0.333" in text
    assert "selected step 0, the input checkpoint" in text
    # the evaluation row in words, the model beside its baselines, headline columns marked
    assert "it wrote no code" in text
    assert "reference_copies 100% kernelbench_v0, 50% strict robust" in text
    assert "kernelbench_v0, plain: the paper's protocol" in text
    assert "strict, robust: the one to trust" in text
    assert 'class="tag paper">kernelbench_v0.plain.*' in page
    assert "DICE-8B" in text and "64%" in text
    # the curves inline, nothing external, no paths outside the workspace
    assert page.count('src="data:image/png;base64,') == 3
    assert not re.search(r'(src|href)="(?!data:)', page)
    assert str(ws) not in page and "<script" not in page
    tables = (ws / "curves/kernelbench_tables.html").read_bytes()
    assert main(_curves(ws, run)) == 0
    assert page_path.read_bytes() == first
    assert (ws / "curves/kernelbench_tables.html").read_bytes() == tables


def test_tables_page_marks_the_headline_columns(ws):
    run = make_run(ws)
    assert main(_curves(ws, run)) == 0
    page = (ws / "curves/kernelbench_tables.html").read_text()
    text = _text(page)
    assert text.startswith("KernelBench tables: scale tiny")
    # every column of both files is a row of the transposed tables, explained
    for column in ("kernelbench_v0.plain.exec", "strict.robust.fast_2_interval", "with_code"):
        assert f">{column}<" in page or f">{column}<span" in page
    assert '<tr class=\'paper\'><td class="l">kernelbench_v0.plain.exec<span class="tag paper">' in page
    assert '<tr class=\'trust\'><td class="l">strict.robust.exec<span class="tag trust">' in page
    assert "kernelbench_v0 — KernelBench's own check as the paper and the release ran it" in text
    assert "compiled and correct (share of tasks); no deception flag allowed" in text
    assert "level 1" in text and "DICE-8B (paper)" in text
    assert "<img" not in page and "<script" not in page


def test_summary_page_handles_missing_val_rows_and_no_value(ws):
    run = make_run(ws, e2e_updates=False, val_rows=False, model_code=0.5)
    assert main(_curves(ws, run)) == 0
    text = _text((ws / "curves/summary.html").read_text())
    assert "Validation: no validation row (val.tsv empty or missing)" in text
    # rl_e2e validated with no task: said, not shown as a reward
    assert "Validation: no validation task (the val split gave no prompt)" in text
    assert "wrote code for 50%" in text and "none of its kernels compiled" in text


def test_summary_page_without_any_input_still_renders(tmp_path):
    page = sp.render("tiny", rf.sft_facts(tmp_path / "sft"),
                     [rf.rl_facts(tmp_path / s, s) for s in ("rl_infill", "rl_e2e")],
                     rf.eval_facts(tmp_path / "none.csv", tmp_path / "none2.csv"))
    text = _text(page)
    assert "no SFT step was logged" in text
    assert text.count("no log of this stage was found") == 2
    assert "no evaluation row was found" in text


def test_rl_step_table_keeps_first_last_and_selected_rows(tmp_path):
    facts = rf.RLFacts("rl_e2e", found=True, selected_step=50,
                       steps=[rf.RLStep(i, 0.01 * i, 4, 1, 1) for i in range(1, 201)],
                       val={0: 0.0, 50: 0.5, 200: 0.25})
    table = sp.rl_step_table(facts)
    assert table.count('class="gap"') == 2
    assert ">50<" in table and "0.5 (selected)" in table and ">200<" in table
    assert "(before training)" in table
    assert facts.updates == 200 and facts.steps_with_update == 200 and not facts.no_update


def test_rl_notes_say_why_panels_are_flat(ws):
    from dicepipe.stages.curves import rl_notes

    run = make_run(ws, e2e_updates=False)
    infill = rl_notes(rf.rl_facts(run["rl_infill"], "rl_infill"))
    assert "no group's rewards differed (every rollout scored 0)" in infill["mean rollout reward"]
    assert infill["KL to the reference"] == "no policy update, so no KL was measured"
    assert "input checkpoint" in infill["validation reward"]
    e2e = rl_notes(rf.rl_facts(run["rl_e2e"], "rl_e2e"))
    assert e2e["validation reward"].startswith("no validation task")
    run = make_run(ws / "b")
    assert rl_notes(rf.rl_facts(run["rl_e2e"], "rl_e2e")) == {}


def test_curves_without_tables_writes_no_summary(ws):
    run = make_run(ws)
    args = _curves(ws, run)
    for flag in ("--results", "--compare"):
        i = args.index(flag)
        del args[i:i + 2]
    assert main(args) == 0
    written = sorted(p.name for p in (ws / "curves").iterdir())
    assert written == ["rl_e2e.png", "rl_infill.png", "sft.png"]


def test_empty_levels_say_why():
    from dicepipe.evaluation.report import empty_reason

    assert empty_reason({"tasks": 0, "reference_failed": 2}) == "no task scored\n(2 references failed)"
    assert empty_reason({"tasks": 5, "with_code": 0.0, "compiled": 0.0}) == \
        "no code written\n(0 of 5 tasks)"
    assert empty_reason({"tasks": 4, "with_code": 0.5, "compiled": 0.0}) == \
        "code for 50% of 4 tasks,\nnone compiled"
    assert empty_reason({"tasks": 4, "with_code": 1.0, "compiled": 0.25}) == \
        "none correct\n(25% of 4 compiled)"
