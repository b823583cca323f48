"""The DICE paper's Tables 1-3 beside the run: the packaged transcription matches the recipe's
tables cell for cell, `all` is the problem-weighted mean, the compare table and plot carry
the paper's rows labelled with source and protocol for a real scale (none when disabled),
and the params key that chooses the table is tracked by both runners."""

from __future__ import annotations

import csv
import re
from argparse import Namespace
from pathlib import Path

import pytest
import yaml
from dag_tools import DVC_FILES
from dicepipe.config import stage_settings
from dicepipe.errors import ConfigError, SourceError
from dicepipe.evaluation.literature import (
    TABLES_PATH,
    literature_rows,
    load_tables,
    paper_table_for,
)
from dicepipe.evaluation.report import compare_rows
from dicepipe.judgement import named_protocol
from dicepipe.stages.evaluate import _write_compare

RECIPE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "dice-recipe.md"
V0 = "kernelbench_v0.plain"
PAPER_COLUMNS = [f"{V0}.exec", f"{V0}.fast_1_point", f"{V0}.fast_2_point"]


@pytest.fixture(scope="module")
def params(repo_root):
    return yaml.safe_load((repo_root / "params.yaml").read_text())


def _transcribed(key: str) -> list[tuple]:
    raw = yaml.safe_load(TABLES_PATH.read_text())["tables"][key]["rows"]
    return [(r["system"], r["size"], r["diffusion"], r["L1"], r["L2"], r["L3"]) for r in raw]


def _markdown_table(text: str, header: str) -> list[tuple]:
    """Rows of the recipe's pipe table whose header cell starts with `header`: (system,
    size, diffusion, L1, L2, L3), bold marks dropped, "-" as closed, "(dLLM)" as the flag;
    Table 1 marks its rows from Mercury down as diffusion LMs, Table 2 by model family."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {header}"))
    rows, diffusion = [], False
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip().replace("**", "") for c in line.strip("|").split("|")]
        name, size, *levels = cells
        diffusion = diffusion or "(dLLM)" in name
        family = any(name.startswith(f) for f in ("SDAR", "Trado", "DICE"))
        rows.append((name.replace(" (dLLM)", ""), "closed" if size == "-" else size,
                     diffusion or family, *levels))
    return rows


def _prose_table_3(text: str) -> list[tuple]:
    """Table 3 as the recipe writes it: 'A 2B, B 1.7B, ... all 0; Qwen3-1.7B 0 except L2 Exec
    1; **DICE-1.7B** L1 24 12/3, L2 6 3/2, L3 10 6/4.'"""
    line = next(l for l in text.splitlines() if l.startswith("Table 3 (1.7B):")).replace("**", "")
    zeros, exception, dice = line.split(":", 1)[1].split(";")
    rows = []
    for entry in zeros.replace(" all 0", "").split(","):
        name, size = entry.strip().rsplit(" ", 1)
        rows.append((name, size, name.startswith("SDAR"), "0 0/0", "0 0/0", "0 0/0"))
    match = re.fullmatch(r"\s*(\S+)-(\S+) 0 except L2 Exec (\d+)\s*", exception)
    rows.append((match[1], match[2], False, "0 0/0", f"{match[3]} 0/0", "0 0/0"))
    match = re.fullmatch(r"\s*(\S+)-(\S+) L1 (\d+ \d+/\d+), L2 (\d+ \d+/\d+), L3 (\d+ \d+/\d+)\.\s*", dice)
    rows.append((match[1], match[2], True, match[3], match[4], match[5]))
    return rows


@pytest.mark.skipif(not RECIPE.is_file(), reason="needs ../shared/reference/dice-recipe.md")
def test_transcription_matches_the_recipe_cell_for_cell():
    text = RECIPE.read_text()
    assert _transcribed("8b") == _markdown_table(text, "Table 1 (8B)")
    assert _transcribed("4b") == _markdown_table(text, "Table 2 (4B)")
    assert _transcribed("1p7b") == _prose_table_3(text)


def test_spot_cells_and_labels():
    tables = load_tables()
    assert {k: t.number for k, t in tables.items()} == {"8b": 1, "4b": 2, "1p7b": 3}
    assert [len(t.rows) for t in tables.values()] == [18, 7, 6]
    dice = {k: next(r for r in t.rows if r.system == "DICE") for k, t in tables.items()}
    # counts of problems: L1, L2 of 100, L3 of 50
    assert dice["8b"].counts == {"1": (40, 9, 5), "2": (39, 14, 0), "3": (8, 4, 2)}
    assert dice["4b"].counts == {"1": (27, 13, 4), "2": (24, 15, 9), "3": (6, 3, 2)}
    assert dice["1p7b"].counts == {"1": (24, 12, 3), "2": (6, 3, 2), "3": (5, 3, 2)}
    claude = next(r for r in tables["8b"].rows if r.system == "Claude-Sonnet-4")
    assert claude.size == "closed" and claude.counts["2"] == (48, 24, 18)
    qwen3 = next(r for r in tables["1p7b"].rows if r.system == "Qwen3")
    assert qwen3.counts == {"1": (0, 0, 0), "2": (1, 0, 0), "3": (0, 0, 0)}
    assert tables["8b"].label == "DICE paper (arXiv 2602.11715), Table 1"
    assert tables["8b"].protocol["name"] == "kernelbench_v0"
    assert tables["8b"].columns() == PAPER_COLUMNS


def test_all_is_the_problem_weighted_mean_over_250():
    expected = {"8b": (87, 27, 7), "4b": (57, 31, 15), "1p7b": (35, 18, 7)}  # problems of 250
    for key, table in load_tables().items():
        rows = {(r["system"], r["level"]): r for r in literature_rows(table)}
        dice = rows[("DICE", "all")]
        assert dice["tasks"] == 250
        assert [dice[c] for c in PAPER_COLUMNS] == [round(n / 250, 6) for n in expected[key]], key
        assert rows[("DICE", "3")]["tasks"] == 50
    l3 = {(r["system"], r["level"]): r for r in literature_rows(load_tables()["8b"])}
    assert l3[("Mercury-Coder-Small", "3")][f"{V0}.fast_2_point"] == 0.1  # 10% of 50 problems


def test_malformed_transcription_is_refused(tmp_path):
    data = yaml.safe_load(TABLES_PATH.read_text())
    for bad in ("9 40/5", "3 0/0", "40 9"):  # fast above Exec; 1.5 of 50 problems; no fast_2
        data["tables"]["8b"]["rows"][0]["L3"] = bad
        path = tmp_path / "tables.yaml"
        path.write_text(yaml.safe_dump(data))
        with pytest.raises(SourceError, match="Gemini-3-Pro"):
            load_tables(path)


def test_schema_offers_exactly_the_packaged_tables(repo_root):
    schema = yaml.safe_load((repo_root / "workflow/dicepipe/schemas/params.schema.yaml").read_text())
    enum = schema["$defs"]["evaluate_settings"]["properties"]["paper_table"]["enum"]
    assert sorted(enum) == sorted(["none", *load_tables()])


def _table_for(params, scale):
    return paper_table_for(stage_settings(params, "evaluate", scale=scale), params["protocols"],
                           params["evaluate"]["protocols"], f"evaluate.overrides.{scale}.paper_table")


def test_each_scale_names_its_table(params):
    assert _table_for(params, "tiny") is None
    assert {s: _table_for(params, s).number for s in ("1p7b", "4b", "8b")} == {
        "1p7b": 3, "4b": 2, "8b": 1}


def test_a_run_that_measures_otherwise_is_refused(params):
    changed = yaml.safe_load(yaml.safe_dump(params))
    changed["protocols"]["kernelbench_v0"]["fp32"] = 0.0001
    with pytest.raises(ConfigError, match="protocols.kernelbench_v0"):
        _table_for(changed, "8b")
    changed = yaml.safe_load(yaml.safe_dump(params))
    changed["evaluate"]["protocols"] = ["strict"]
    with pytest.raises(ConfigError, match="evaluate.protocols"):
        _table_for(changed, "8b")
    changed["evaluate"]["overrides"]["8b"]["paper_table"] = "70b"
    with pytest.raises(ConfigError, match="'70b'"):
        _table_for(changed, "8b")


def _summaries():
    def rows(system, exec_by_level):
        return [{"system": system, "level": level, "tasks": 100 if level != "all" else 250,
                 f"{V0}.exec": value, f"{V0}.fast_1_point": value / 2, f"{V0}.fast_2_point": 0.0,
                 f"{V0}.fast_1_interval": 0.0, "strict.plain.exec": value / 4}
                for level, value in exec_by_level.items()]
    return {"model": rows("model", {"1": 0.5, "2": 0.25, "3": 0.1, "all": 0.33}),
            "qwen3": rows("qwen3", {"1": 0.1, "2": 0.2, "3": 0.0, "all": 0.12})}


def _write(tmp_path, params, scale, name):
    args = Namespace(compare=str(tmp_path / name / "compare.csv"), metrics=str(tmp_path / name))
    protocols = [named_protocol(n, params["protocols"]) for n in params["evaluate"]["protocols"]]
    _write_compare(args, _summaries(), protocols, params["evaluate"], _table_for(params, scale), scale,
                   {"model": "DICE", "qwen3": "Qwen3"})
    with open(args.compare, newline="") as fh:
        return list(csv.DictReader(fh))


def test_compare_table_gains_the_papers_rows_for_a_real_scale(tmp_path, params):
    rows = _write(tmp_path, params, "8b", "8b")
    assert len(rows) == 2 * 4 + 18 * 4
    source = "DICE paper (arXiv 2602.11715), Table 1"
    # per level: the run's systems, then the paper's rows in its table order
    level_1 = [(r["source"], r["system"]) for r in rows if r["level"] == "1"]
    assert level_1[:3] == [("run", "model"), ("run", "qwen3"), (source, "Gemini-3-Pro")]
    assert level_1[-1] == (source, "DICE")
    assert [r["level"] for r in rows][::20] == ["1", "2", "3", "all"]
    run = {(r["system"], r["level"]): r for r in rows if r["source"] == "run"}
    paper = {(r["system"], r["level"]): r for r in rows if r["source"] == source}
    assert run[("model", "1")]["protocol"] == "kernelbench_v0;kernelbench;strict"
    assert run[("model", "1")]["size"] == "" and run[("model", "1")][f"{V0}.exec"] == "0.5"
    dice = paper[("DICE", "all")]
    assert (dice["protocol"], dice["size"], dice["tasks"]) == ("kernelbench_v0", "8B", "250")
    assert [dice[c] for c in PAPER_COLUMNS] == ["0.348", "0.108", "0.028"]
    # only the columns the paper reports
    assert dice[f"{V0}.fast_1_interval"] == "" and dice["strict.plain.exec"] == ""
    assert paper[("Gemini-3-Pro", "1")]["size"] == "closed"
    assert list(rows[0])[:6] == ["source", "system", "paper_system", "size", "protocol", "level"]
    # each run row names the paper's row it is set beside; the paper's rows name themselves
    assert (run[("model", "1")]["paper_system"], run[("qwen3", "1")]["paper_system"]) == ("DICE", "Qwen3")
    assert paper[("Qwen3", "2")]["paper_system"] == "Qwen3"
    plot = tmp_path / "8b" / "compare.png"
    assert plot.is_file() and b"Software" not in plot.read_bytes()
    # deterministic: written again, the same bytes
    first = (tmp_path / "8b" / "compare.csv").read_bytes(), plot.read_bytes()
    _write(tmp_path, params, "8b", "8b")
    assert ((tmp_path / "8b" / "compare.csv").read_bytes(), plot.read_bytes()) == first


def test_compare_table_without_a_paper_table_has_only_the_run(tmp_path, params):
    rows = _write(tmp_path, params, "tiny", "tiny")
    assert {r["source"] for r in rows} == {"run"}
    assert [(r["system"], r["level"]) for r in rows][:3] == [("model", "1"), ("qwen3", "1"), ("model", "2")]
    assert (tmp_path / "tiny" / "compare.png").is_file()
    assert compare_rows(_summaries(), ["kernelbench_v0"])[0] == compare_rows(_summaries(), ["kernelbench_v0"], [])[0]


def test_paper_table_key_is_tracked_by_both_runners(repo_root, params):
    """Every scale's paper_table lives under evaluate.defaults / evaluate.overrides.<scale>,
    which the evaluate stage tracks in dvc.yaml and in its Snakemake rule; the tables file
    is an input of both (a DVC folder dep covers it)."""
    # the same evaluate in dvc.yaml (tiny) and real/dvc.yaml (the scales with paper tables)
    default, real = [yaml.safe_load((repo_root / name).read_text())["stages"]["evaluate"]["do"]
                     for name in DVC_FILES]
    assert {k: v for k, v in real.items() if k != "wdir"} == default
    dvc = default
    assert {"evaluate.defaults", "evaluate.overrides.${key}"} <= {
        p for p in dvc["params"] if isinstance(p, str)}  # (a dict: the harness's method file)
    rule = (repo_root / "workflow/rules/evaluate.smk").read_text()
    tracked = re.search(r"tracked=tracked\((.*?)\)", rule, re.DOTALL)[1]
    assert '"evaluate.defaults"' in tracked and '"evaluate.overrides.{scale}"' in tracked
    assert "paper_table" in params["evaluate"]["defaults"]
    assert all(set(o) <= set(params["evaluate"]["defaults"])
               for o in params["evaluate"]["overrides"].values())
    tables = TABLES_PATH.relative_to(repo_root).as_posix()
    assert f'PAPER_TABLES = "{tables}"' in rule
    assert any(tables.startswith(d.rstrip("/") + "/") for d in dvc["deps"])
    assert "metrics/evaluate/${key}/compare.png" in dvc["plots"]
    # the plot is an output of the rule (wrapped in report() for `snakemake --report`)
    assert re.search(r'compare_plot=(report\(\s*)?"metrics/evaluate/\{scale\}/compare\.png"',
                     rule), rule


def test_a_baseline_named_after_no_row_of_the_paper_is_refused(params):
    from dicepipe.stages.evaluate import _check_paper_systems

    table = _table_for(params, "8b")
    systems = [{"name": "model", "paper_system": "DICE"},
               *params["baselines"]["8b"]]
    _check_paper_systems(systems, table, "8b")  # the shipped names are the paper's
    systems.append({"name": "mine", "folder": "x", "paper_system": "Qwen3-8B"})
    with pytest.raises(ConfigError, match=r"baselines.8b\[4\].paper_system.*'Qwen3-8B'.*Table 1"):
        _check_paper_systems(systems, table, "8b")
    _check_paper_systems(systems, None, "tiny")  # no table: nothing to name
