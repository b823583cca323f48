"""`dicepipe curves`: the training curves of a scale, as plots for people to look at.

    dicepipe curves --scale tiny --sft metrics/sft/tiny --rl-infill metrics/rl_infill/tiny \\
        --rl-e2e metrics/rl_e2e/tiny --out metrics/curves/tiny

Reads the per-step logs the training stages publish (sft: steps.tsv; rl_infill and rl_e2e:
steps.tsv and val.tsv) and draws sft.png (loss, gradient norm, learning rate), rl_infill.png
and rl_e2e.png (mean reward, groups kept and updates, KL, validation reward). DVC plots the
same TSVs itself (`dvc plots show`); these PNGs are what `snakemake --report` shows.
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
    parser.add_argument("--sft", required=True, help="sft metrics folder (steps.tsv)")
    parser.add_argument("--rl-infill", required=True, help="rl_infill metrics folder (steps.tsv, val.tsv)")
    parser.add_argument("--rl-e2e", required=True, help="rl_e2e metrics folder (steps.tsv, val.tsv)")
    parser.add_argument("--out", required=True, help="folder for sft.png, rl_infill.png, rl_e2e.png")


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


def plot_panels(panels: list[tuple[str, list[tuple[str, dict, str]]]], path: Path, title: str) -> None:
    """One subplot per panel; each panel draws (label, columns, column name) series by step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(figsize=(4 * len(panels), 3.2), dpi=100, ncols=len(panels),
                             squeeze=False)
    for ax, (panel_title, series) in zip(axes[0], panels):
        drawn = False
        for label, columns, name in series:
            xs, ys = _series(columns, name)
            if xs:
                ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=label)
                drawn = True
        if not drawn:
            ax.text(0.5, 0.5, "no values logged", ha="center", va="center", transform=ax.transAxes)
        elif len(series) > 1:
            ax.legend(fontsize=7)
        ax.set_title(panel_title, fontsize=9)
        ax.set_xlabel("step")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Software": None})  # no version or date in the file
    plt.close(fig)


def run(args, params: dict) -> int:
    from ..config import scale_name

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
        plot_panels(panels, out / f"{stage}.png", f"{stage}, {scale}")
    return 0
