"""`dicepipe curves`: the training curves of a scale, as plots for people to look at.

    dicepipe curves --scale tiny --sft metrics/sft/tiny --rl-infill metrics/rl_infill/tiny \\
        --rl-e2e metrics/rl_e2e/tiny --results results/kernelbench_tiny.csv \\
        --compare results/kernelbench_compare_tiny.csv --out metrics/curves/tiny

Reads the per-step logs the training stages publish (sft: steps.tsv; rl_infill and rl_e2e:
steps.tsv, val.tsv and summary.json) and draws sft.png (loss, gradient norm, learning rate),
rl_infill.png and rl_e2e.png (mean reward, groups kept and updates, KL, validation reward).
A flat or empty panel says why in the figure (no group's rewards differed, so no update; no
validation task). DVC plots the same TSVs itself (`dvc plots show`); these PNGs are what
`snakemake --report` shows.

With `--results` and `--compare` (the evaluate stage's tables) it also writes summary.html,
the run on one page (evaluation/summary_page.py): SFT loss, each RL stage's updates, reward
and validation, the model's KernelBench row beside its baselines' with the headline columns
marked, the curves and both tables in full; and kernelbench_tables.html, both tables alone
(the report's KernelBench section: Snakemake's report shows HTML inline, a CSV only as a
download).
"""

from __future__ import annotations

import csv
from pathlib import Path

SFT_PANELS = (("loss", "training loss"), ("grad_norm", "gradient norm"),
              ("learning_rate", "learning rate"))
RL_PANELS = (("mean_reward", "mean rollout reward"), ("groups_kept", "groups kept / updates"),
             ("kl", "KL to the reference"), ("val_reward", "validation reward"))


def add_arguments(parser) -> None:
    parser.add_argument("--scale", required=True, help="scale name under params.yaml 'scales'")
    parser.add_argument("--sft", required=True, help="sft metrics folder (steps.tsv, summary.json)")
    parser.add_argument("--rl-infill", required=True,
                        help="rl_infill metrics folder (steps.tsv, val.tsv, summary.json)")
    parser.add_argument("--rl-e2e", required=True,
                        help="rl_e2e metrics folder (steps.tsv, val.tsv, summary.json)")
    parser.add_argument("--results", help="results/kernelbench_<scale>.csv, for the HTML pages")
    parser.add_argument("--compare",
                        help="results/kernelbench_compare_<scale>.csv, for the HTML pages")
    parser.add_argument("--out", required=True,
                        help="folder for sft.png, rl_infill.png, rl_e2e.png, summary.html and "
                             "kernelbench_tables.html")


def read_columns(path: Path) -> dict[str, list[float | None]]:
    """A TSV log as columns of floats (an empty cell is None); a missing file has none."""
    if not path.is_file():
        return {}
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    columns: dict[str, list[float | None]] = {}
    for row in rows:
        for key, value in row.items():
            try:
                number = float(value) if value not in (None, "") else None
            except ValueError:
                number = None
            columns.setdefault(key, []).append(number)
    return columns


def _series(columns: dict, name: str) -> tuple[list[float], list[float]]:
    points = [(s, v) for s, v in zip(columns.get("step", []), columns.get(name, []))
              if s is not None and v is not None]
    return [s for s, _ in points], [v for _, v in points]


def plot_panels(panels: list[tuple[str, list[tuple[str, dict, str]]]], path: Path, title: str,
                notes: dict[str, str] | None = None) -> None:
    """One subplot per panel; each panel draws (label, columns, column name) series by step.
    `notes` (panel title -> text) says in the panel why it is flat or empty."""
    notes = notes or {}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(figsize=(4 * len(panels), 3.2), dpi=100, ncols=len(panels),
                             squeeze=False)
    for ax, (panel_title, series) in zip(axes[0], panels):
        drawn = False
        for label, columns, name in series:
            xs, ys = _series(columns, name)
            if xs:
                ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=label)
                drawn = True
        note = notes.get(panel_title)
        if not drawn:
            ax.text(0.5, 0.5, _wrap(note or "no values logged"), ha="center", va="center",
                    transform=ax.transAxes, fontsize=9, color="#8a2a0a")
            ax.set_xticks([])
            ax.set_yticks([])
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
            if note:
                ax.text(0.5, 0.5, _wrap(note), ha="center", va="center", transform=ax.transAxes,
                        fontsize=8, color="#8a2a0a",
                        bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.85,
                              "edgecolor": "#d9b8a8"})
            if len(series) > 1:
                ax.legend(fontsize=7)
        ax.set_title(panel_title, fontsize=9)
        ax.set_xlabel("step")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Software": None})  # no version or date in the file
    plt.close(fig)


def _wrap(text: str, width: int = 34) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width))


def rl_notes(facts) -> dict[str, str]:
    """Per RL panel, why it is flat or empty (summary.json, steps.tsv, val.tsv); {} when
    the stage updated its policy and validated."""
    from ..evaluation.run_facts import rl_empty_reason, val_reason

    notes = {}
    reason = rl_empty_reason(facts)
    if reason:
        notes["mean rollout reward"] = reason
        notes["groups kept / updates"] = (reason if not facts.no_update else
                                          "0 groups kept in every step: no group's rewards "
                                          "differed, so no policy update")
        notes["KL to the reference"] = ("no policy update, so no KL was measured"
                                        if facts.no_update else reason)
    val = val_reason(facts)
    if val:
        notes["validation reward"] = val
    elif facts.no_update and facts.selected_step == 0:
        notes["validation reward"] = "the input checkpoint (step 0) is the stage's output"
    return notes


def run(args, params: dict) -> int:
    from ..config import scale_name
    from ..evaluation.run_facts import rl_facts
    from ..evaluation.summary_page import write_summary, write_tables

    scale = scale_name(params, args.scale)
    out = Path(args.out)
    sft = read_columns(Path(args.sft) / "steps.tsv")
    plot_panels([(label, [(name, sft, name)]) for name, label in SFT_PANELS], out / "sft.png",
                f"SFT, {scale}")
    for stage, folder in (("rl_infill", args.rl_infill), ("rl_e2e", args.rl_e2e)):
        steps = read_columns(Path(folder) / "steps.tsv")
        val = read_columns(Path(folder) / "val.tsv")
        panels = [("mean rollout reward", [("mean_reward", steps, "mean_reward")]),
                  ("groups kept / updates", [("groups_kept", steps, "groups_kept"),
                                             ("updates", steps, "updates")]),
                  ("KL to the reference", [("kl", steps, "kl")]),
                  ("validation reward", [("val_reward", val, "val_reward")])]
        plot_panels(panels, out / f"{stage}.png", f"{stage}, {scale}",
                    rl_notes(rl_facts(Path(folder), stage)))
    if args.results or args.compare:
        results = Path(args.results) if args.results else None
        compare = Path(args.compare) if args.compare else None
        write_summary(out / "summary.html", scale, Path(args.sft),
                      {"rl_infill": Path(args.rl_infill), "rl_e2e": Path(args.rl_e2e)},
                      results, compare, curves=out)
        write_tables(out / "kernelbench_tables.html", scale, results, compare)
    return 0
