"""The run on one page: metrics/curves/<scale>/summary.html, the report's first result.

Written by the `curves` stage from what the training and evaluation stages published
(run_facts.py reads it). The page says in words what happened (SFT loss, each RL stage's
policy updates and validation, what the model wrote), sets the model's KernelBench row beside
its baselines' on the headline columns, embeds the training curves (PNG as base64) and
renders both KernelBench tables transposed (a row per column of the file), the headline
readings marked on them: `kernelbench_v0.plain.*` is the paper's protocol (what to set beside
the paper's Table 1), `strict.robust.*` the one to trust. One self-contained HTML file: no
external asset, no script, no timestamp, no absolute path; the same inputs give the same bytes.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from pathlib import Path

from .run_facts import (
    PAPER,
    TRUST,
    EvalFacts,
    RLFacts,
    SFTFacts,
    column_of,
    eval_facts,
    eval_sentences,
    fmt_number,
    fmt_share,
    number,
    rl_facts,
    rl_sentences,
    sft_facts,
    sft_sentence,
)

STAGE_TITLES = {"rl_infill": "BiC-RL stage 1 (rl_infill, kernel infilling)",
                "rl_e2e": "BiC-RL stage 2 (rl_e2e, end to end)"}
# (css class, what the reading is) of the two headline readings
HEADLINES = {PAPER: ("paper", "the paper's protocol: set beside the paper's Table 1"),
             TRUST: ("trust", "the one to trust: this harness's strict check, no deception flag")}
PROTOCOL_NOTES = {
    "kernelbench_v0": "KernelBench's own check as the paper and the release ran it: 5 as-drawn "
                      "trials, torch.allclose at 1e-2",
    "kernelbench": "KernelBench's own check at KernelBench main's tolerance (fp32 1e-4)",
    "strict": "this harness's check: varied inputs, exact non-float outputs",
    "release_reward": "one trial at 1e-2: what BiC-RL rewarded in the release",
}
VERDICT_NOTES = {"plain": "deception flags ignored", "robust": "no deception flag allowed"}
LABEL_NOTES = {
    "source": "where the row comes from (run: this run; else the paper's table)",
    "system": "the system scored",
    "paper_system": "the paper's name for the system",
    "size": "model size (the paper's rows)",
    "protocol": "the protocols the row's columns report",
    "level": "KernelBench level (all: every task)",
    "tasks": "tasks whose reference runs (the denominator)",
    "reference_failed": "tasks whose reference failed (out of every denominator)",
    "samples_per_task": "kernels scored per task",
    "with_code": "share of tasks the system wrote code for",
    "compiled": "share of tasks whose kernel compiled",
}
CURVES = ("sft.png", "rl_infill.png", "rl_e2e.png")  # the curves stage's plots, in page order
STEP_ROWS_SHOWN = 12  # per RL stage; a longer log shows its first and last rows

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;
 margin:0 auto;max-width:1280px;padding:16px 24px;color:#1d2430;line-height:1.4;font-size:14px}
h1{font-size:22px;margin:4px 0 2px}
h2{font-size:18px;margin:26px 0 8px;border-bottom:1px solid #d6dbe3;padding-bottom:3px}
h3{font-size:15px;margin:16px 0 6px}
.sub{color:#5a6575;margin:0 0 10px}
ul.story{padding-left:20px;margin:6px 0}ul.story li{margin:5px 0}
table{border-collapse:collapse;margin:6px 0 10px;font-size:13px}
th,td{border:1px solid #d6dbe3;padding:3px 7px;text-align:right;vertical-align:top}
th{background:#f1f3f6;font-weight:600}td.l,th.l{text-align:left}td.l{white-space:nowrap}
tr.sel td{font-weight:700}tr.gap td{color:#5a6575;text-align:center;font-style:italic}
td.desc{color:#5a6575;text-align:left;font-size:12px;min-width:380px}
tr.group td{background:#e9edf3;text-align:left;font-weight:600}
.paper{background:#e3efff}.trust{background:#def5e3}
th.paper{background:#c9ddfb}th.trust{background:#c3ebcd}
.tag{display:inline-block;font-size:11px;border-radius:3px;padding:0 5px;margin-left:4px;
 font-weight:600}
.tag.paper{background:#c9ddfb;color:#173f7a}.tag.trust{background:#c3ebcd;color:#1b5a2a}
.legend{margin:4px 0 8px;font-size:13px}.legend>span{margin-right:14px}
.zero,.none{color:#9aa3af}
img{max-width:100%;border:1px solid #e3e7ed;margin:4px 0}
.cols{display:flex;flex-wrap:wrap;gap:24px}.cols>div{flex:1 1 420px;min-width:0}
details{margin:8px 0}summary{cursor:pointer;font-weight:600}
.wide{overflow-x:auto}
""".strip()


def _e(text) -> str:
    return html.escape(str(text))


def _td(value: str, css: str = "", shown: str | None = None) -> str:
    """A cell: `shown` (default the value; – where empty), greyed where zero or empty."""
    shown = shown if shown is not None else (value if value != "" else "–")
    classes = [css] if css else []
    if shown == "–":
        classes.append("none")
    elif number(value) == 0:
        classes.append("zero")
    attr = f' class="{" ".join(classes)}"' if classes else ""
    return f"<td{attr}>{_e(shown)}</td>"


def _wrappable(value: str) -> str | None:
    """A list cell (`kernelbench_v0;strict`) with room to wrap; None keeps the value."""
    return value.replace(";", "; ") if ";" in value else None


def headline_css(column: str) -> str:
    """'paper' or 'trust' for a column of a headline reading, else ''."""
    for (protocol, verdict_name), (css, _) in HEADLINES.items():
        if column.startswith(f"{protocol}.{verdict_name}."):
            return css
    return ""


def legend(columns: Sequence[str]) -> str:
    """Which readings are the headline ones, as the tables mark them."""
    parts = []
    for (protocol, verdict_name), (css, text) in HEADLINES.items():
        name = f"{protocol}.{verdict_name}.*"
        if not any(c.startswith(name[:-1]) for c in columns):
            text = "not in this table (protocol not evaluated)"
        parts.append(f'<span><span class="tag {css}">{name}</span> {_e(text)}</span>')
    return '<div class="legend">' + "".join(parts) + "</div>"


def _metric_note(metric: str) -> str:
    if metric == "exec":
        return "compiled and correct (share of tasks)"
    if metric.startswith("fast_") and metric.endswith("_point"):
        return f"correct and point speedup > {metric[5:-6]} (the paper's fast_p)"
    if metric.startswith("fast_") and metric.endswith("_interval"):
        return f"correct and speedup interval above {metric[5:-9]} (the harness's fast_p)"
    if metric.startswith("pass_at_"):
        return f"pass@{metric[8:]}"
    return {"geomean_speedup": "geometric mean speedup of correct kernels",
            "launch_bound_share": "of solved tasks, share whose reference is launch-bound",
            "reference_limited": "tasks whose reference disagrees with itself under this "
                                 "protocol (out of its denominators)"}.get(metric, "")


def describe(column: str) -> str:
    """What a table column is, in a few words."""
    parts = column.split(".")
    if len(parts) == 3:
        return f"{_metric_note(parts[2])}; {VERDICT_NOTES.get(parts[1], parts[1])}"
    if len(parts) == 2:
        return _metric_note(parts[1])
    return LABEL_NOTES.get(column, "")


def _column_groups(columns: Sequence[str]) -> list[tuple[str, list[str]]]:
    """Columns in file order, grouped: labels and counts first, then one group per protocol."""
    groups: dict[str, list[str]] = {"": []}
    for column in columns:
        protocol = column.split(".")[0] if "." in column else ""
        groups.setdefault(protocol, []).append(column)
    return [(p, cs) for p, cs in groups.items() if cs]


def transposed_table(columns: Sequence[str], rows: Sequence[Mapping[str, str]],
                     heads: Sequence[str], skip: Sequence[str] = ()) -> str:
    """A table as a row per column of the file and a column per row of it (`heads` label
    them); each protocol's group opens with what the protocol is, and the headline readings
    are coloured, their Exec tagged."""
    out = ['<div class="wide"><table><tr><th class="l">column</th>']
    out += [f"<th>{_e(h)}</th>" for h in heads]
    out.append('<th class="l">what it is</th></tr>')
    for protocol, group in _column_groups([c for c in columns if c not in skip]):
        if protocol:
            note = PROTOCOL_NOTES.get(protocol)
            out.append(f'<tr class="group"><td colspan="{len(heads) + 2}">{_e(protocol)}'
                       + (f" — {_e(note)}" if note else "") + "</td></tr>")
        for column in group:
            css = headline_css(column)
            tag = (f'<span class="tag {css}">{css}</span>'
                   if css and column.endswith(".exec") else "")
            out.append(f'<tr{f" class={css!r}" if css else ""}><td class="l">{_e(column)}{tag}'
                       "</td>" + "".join(_td(r.get(column, ""), shown=_wrappable(r.get(column, "")))
                                         for r in rows)
                       + f'<td class="desc">{_e(describe(column))}</td></tr>')
    out.append("</table></div>")
    return "".join(out)


def headline_columns(columns: set[str]) -> list[tuple[str, str, str]]:
    """(column, header, css) of the headline table: code written and compiled, then Exec and
    fast_p (point) of the paper's reading, then those and the geomean speedup of the trusted
    one; only the columns the table has."""
    plan = [(c, head, "") for c, head in (("with_code", "code written"), ("compiled", "compiled"))
            if c in columns]
    for reading in (PAPER, TRUST):
        prefix = column_of(reading, "fast_")
        fast = sorted((c[len(prefix):-len("_point")] for c in columns
                       if c.startswith(prefix) and c.endswith("_point")),
                      key=lambda p: number(p) or 0.0)
        metrics = [("exec", "correct (Exec)")] + [(f"fast_{p}_point", f"fast_{p}") for p in fast]
        if reading == TRUST:
            metrics.append(("geomean_speedup", "geomean speedup"))
        plan += [(column_of(reading, m), head, HEADLINES[reading][0]) for m, head in metrics
                 if column_of(reading, m) in columns]
    return plan


def headline_table(facts: EvalFacts, level: str = "all") -> str:
    """A level's systems (the model, its baselines, the paper's rows) on the headline
    columns, in percent (the geomean speedup as a factor)."""
    rows = facts.systems_at(level)
    if not rows:
        return "<p>No KernelBench table.</p>"
    columns = set(facts.compare_columns or facts.columns) | {c for r in rows for c in r}
    plan = headline_columns(columns)
    out = [('<div class="wide"><table><tr><th class="l" rowspan="2">system</th>'
           '<th class="l" rowspan="2">source</th>')]
    if counts := sum(1 for _, _, css in plan if not css):
        out.append(f'<th colspan="{counts}">share of tasks</th>')
    for reading, label in ((PAPER, "kernelbench_v0, plain: the paper's protocol"),
                           (TRUST, "strict, robust: the one to trust")):
        css = HEADLINES[reading][0]
        if n := sum(1 for _, _, c in plan if c == css):
            out.append(f'<th class="{css}" colspan="{n}">{_e(label)}</th>')
    out.append("</tr><tr>" + "".join(f'<th class="{css}">{_e(h)}</th>' for _, h, css in plan)
               + "</tr>")
    for row in rows:
        run = row.get("source", "run") == "run"
        is_model = run and row.get("system") == facts.model
        cells = []
        for column, _, css in plan:
            value = row.get(column, "")
            shown = (fmt_share(value) if not column.endswith("geomean_speedup") else
                     f"{number(value):.2f}x" if number(value) is not None else "–")
            cells.append(_td(value, css, shown))
        out.append(f"<tr{' class=sel' if is_model else ''}><td class=\"l\">"
                   f"{_e(row.get('system', '?'))}{' (the model)' if is_model else ''}</td>"
                   f'<td class="l">{_e("this run" if run else row.get("source", ""))}</td>'
                   + "".join(cells) + "</tr>")
    out.append("</table></div>")
    return "".join(out)


def _shown_steps(facts: RLFacts) -> list[int | None]:
    """The steps the table shows: all, or the first and last few and the selected one with a
    gap (None) between."""
    steps = sorted({s.step for s in facts.steps} | set(facts.val))
    if len(steps) <= STEP_ROWS_SHOWN:
        return list(steps)
    keep = set(steps[:STEP_ROWS_SHOWN // 2]) | set(steps[-STEP_ROWS_SHOWN // 2:])
    keep.add(facts.selected_step)
    shown: list[int | None] = []
    for step in steps:
        if step in keep:
            shown.append(step)
        elif shown and shown[-1] is not None:
            shown.append(None)
    return shown


def rl_step_table(facts: RLFacts) -> str:
    """Training reward, groups kept, updates and validation reward by step."""
    if not facts.steps and not facts.val:
        return "<p>No step logged.</p>"
    by_step = {s.step: s for s in facts.steps}
    out = [("<table><tr><th>step</th><th>mean training reward</th><th>groups kept / groups</th>"
           "<th>updates</th><th>val reward</th></tr>")]
    for step in _shown_steps(facts):
        if step is None:
            out.append('<tr class="gap"><td colspan="5">… (every step: steps.tsv, val.tsv)'
                       " …</td></tr>")
            continue
        row = by_step.get(step)
        val = "–" if step not in facts.val else fmt_number(facts.val[step]) \
            if facts.val[step] is not None else "no value"
        selected = step == facts.selected_step
        kept = ("–" if row is None or row.groups_kept is None else
                f"{row.groups_kept} / {'?' if row.groups is None else row.groups}")
        label = f"{step} (before training)" if step == 0 and row is None else str(step)
        updates = fmt_number(row.updates) if row and row.updates is not None else "–"
        out.append(f"<tr{' class=sel' if selected else ''}><td>{_e(label)}</td>"
                   f"<td>{_e(fmt_number(row.mean_reward) if row else '–')}</td>"
                   f"<td>{_e(kept)}</td><td>{_e(updates)}</td>"
                   f"<td>{_e(val + (' (selected)' if selected else ''))}</td></tr>")
    out.append("</table>")
    return "".join(out)


def training_table(sft: SFTFacts, rls: Sequence[RLFacts]) -> str:
    """A row per training stage: steps, policy updates, start and end, validation."""
    out = [('<table><tr><th class="l">stage</th><th>steps</th><th>policy updates</th>'
           "<th>start</th><th>end</th><th>val reward before the first update</th>"
           "<th>val reward at the selected step</th></tr>"),
           (f'<tr><td class="l">SFT (training loss)</td><td>{_e(sft.steps or "–")}</td>'
           f"<td>–</td><td>{_e(fmt_number(sft.loss_first, 4))}</td>"
           f"<td>{_e(fmt_number(sft.loss_last, 4))}</td><td>–</td><td>–</td></tr>")]
    for f in rls:
        rewards = f.rewards
        before = ("no row" if 0 not in f.val else
                  "no value" if f.val_before is None else fmt_number(f.val_before))
        selected = ("–" if f.selected_step is None else
                    f"{fmt_number(f.selected_val) if f.selected_val is not None else 'no value'}"
                    f" (step {f.selected_step})")
        cells = [len(f.steps), "–" if f.updates is None else f.updates,
                 fmt_number(rewards[0]) if rewards else "–",
                 fmt_number(rewards[-1]) if rewards else "–", before, selected]
        out.append(f'<tr><td class="l">{_e(f.stage)} (mean rollout reward)</td>'
                   + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    out.append("</table>")
    return "".join(out)


def _image(path: Path) -> str:
    try:
        data = Path(path).read_bytes()
    except OSError:
        return f"<p>({_e(Path(path).name)}: no plot)</p>"
    return (f'<img alt="{_e(Path(path).stem)} curves" '
            f'src="data:image/png;base64,{base64.b64encode(data).decode()}">')


def _full_tables(evaluation: EvalFacts) -> list[str]:
    """Both KernelBench tables in full, transposed: the model's per level, open; the compare
    table per level, `all` open."""
    body = ["<h2>The tables in full</h2>",
            ("<p>Each table transposed: a row per column of the CSV file, a column per row of "
            "it. The coloured rows are the headline readings.</p>")]
    if evaluation.rows:
        heads = [f"level {r.get('level')}" if r.get("level") != "all" else "all"
                 for r in evaluation.rows]
        body += [(f"<details open><summary>{_e(evaluation.results_name)}: the model "
                 f"({_e(evaluation.model)}) per level</summary>"), legend(evaluation.columns),
                 transposed_table(evaluation.columns, evaluation.rows, heads, skip=("system",)),
                 "</details>"]
    for level in dict.fromkeys(r.get("level", "") for r in evaluation.compare):
        rows = [r for r in evaluation.compare if r.get("level") == level]
        heads = [r.get("system", "") + ("" if r.get("source", "run") == "run" else " (paper)")
                 for r in rows]
        label = "all levels" if level == "all" else f"level {level}"
        body += [(f"<details{' open' if level == 'all' else ''}><summary>"
                 f"{_e(evaluation.compare_name)}: {_e(label)}</summary>"),
                 legend(evaluation.compare_columns),
                 transposed_table(evaluation.compare_columns, rows, heads, skip=("level",)),
                 "</details>"]
    return body


def _page(title: str, body: Sequence[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>\n"
            + "\n".join([f"<h1>{_e(title)}</h1>", *body]) + "\n</body></html>\n")


def _per_level(evaluation: EvalFacts) -> list[str]:
    body = []
    if levels := evaluation.levels():
        body.append("<h2>KernelBench per level</h2>")
        for level in levels:
            body += [f"<h3>level {_e(level)}</h3>", headline_table(evaluation, level)]
    return body


def _sources(evaluation: EvalFacts) -> str:
    names = [_e(n) for n in (evaluation.results_name, evaluation.compare_name) if n]
    return f" ({', '.join(names)})" if names else ""


def render(scale: str, sft: SFTFacts, rls: Sequence[RLFacts], evaluation: EvalFacts,
           curves: Path | None = None) -> str:
    """The run's summary page (curves: the folder of the curves stage's PNGs to embed)."""
    story = ([f"<li><b>SFT</b>: {sft_sentence(sft)}</li>"]
             + [f"<li><b>{_e(f.stage)}</b>: {rl_sentences(f)}</li>" for f in rls]
             + [f"<li><b>KernelBench</b>: {eval_sentences(evaluation)}</li>"])
    body = [('<p class="sub">What the run did, from the stages\' own records: SFT and both RL '
            "stages (summary.json, steps.tsv, val.tsv) and the KernelBench tables"
            f"{_sources(evaluation)}.</p>"),
            '<ul class="story">' + "".join(story) + "</ul>",
            "<h2>KernelBench, all levels: the model beside its baselines</h2>",
            legend(evaluation.compare_columns or evaluation.columns),
            headline_table(evaluation, "all"),
            "<h2>Training</h2>", training_table(sft, rls)]
    if curves is not None:
        body += [_image(Path(curves) / name) for name in CURVES]
    body.append('<div class="cols">' + "".join(
        f"<div><h3>{_e(STAGE_TITLES.get(f.stage, f.stage))}: by step</h3>{rl_step_table(f)}</div>"
        for f in rls) + "</div>")
    return _page(f"dicepipe run summary: scale {scale}",
                 body + _per_level(evaluation) + _full_tables(evaluation))


def render_tables(scale: str, evaluation: EvalFacts) -> str:
    """Both KernelBench tables on a page of their own (the report's KernelBench section):
    the headline columns per level, then each table in full."""
    body = [(f'<p class="sub">The KernelBench tables of scale {_e(scale)}{_sources(evaluation)}'
            ", readable: the headline readings first, then every column.</p>"),
            legend(evaluation.compare_columns or evaluation.columns),
            "<h2>KernelBench, all levels: the model beside its baselines</h2>",
            headline_table(evaluation, "all")]
    return _page(f"KernelBench tables: scale {scale}",
                 body + _per_level(evaluation) + _full_tables(evaluation))


def write_summary(path: Path, scale: str, sft_dir: Path, rl_dirs: Mapping[str, Path],
                  results: Path | None = None, compare: Path | None = None,
                  curves: Path | None = None) -> None:
    """Read the stages' outputs (rl_dirs: stage -> metrics folder) and write the summary."""
    page = render(scale, sft_facts(sft_dir), [rl_facts(folder, s) for s, folder in rl_dirs.items()],
                  eval_facts(results, compare), curves)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(page)


def write_tables(path: Path, scale: str, results: Path | None = None,
                 compare: Path | None = None) -> None:
    """Write the KernelBench tables' page."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(render_tables(scale, eval_facts(results, compare)))
