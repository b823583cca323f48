"""What a run did, read from the files its stages published: facts and sentences for the
run's one-page summary (summary_page.py), and the reasons the training plots write into a
flat or empty panel (stages/curves.py).

- sft: summary.json (steps, loss_first, loss_final) and steps.tsv (loss per step);
- rl_infill, rl_e2e: summary.json (steps, best_step, best_val_reward), steps.tsv
  (mean_reward, groups, groups_kept, updates per step) and val.tsv (val_reward per validated
  step; step 0 is the stage's input checkpoint, validated before any update);
- evaluate: results/kernelbench_<scale>.csv (the model, per level and `all`) and
  results/kernelbench_compare_<scale>.csv (the model beside its baselines and the paper).

Any file may be missing or partial (a stage that logged no step, a val.tsv without a row, a
protocol not evaluated): the facts say so instead of failing. No params are read. The
sentences are HTML fragments (values escaped, emphasis in <b>).
"""

from __future__ import annotations

import csv
import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

# The two readings of the KernelBench tables to read first (README, "KernelBench evaluation"):
# the paper's protocol and verdict (set beside the paper's Table 1), and the one to trust.
PAPER = ("kernelbench_v0", "plain")
TRUST = ("strict", "robust")


def column_of(reading: tuple[str, str], metric: str) -> str:
    """The table column of a (protocol, verdict) reading's metric: `strict.robust.exec`."""
    return f"{reading[0]}.{reading[1]}.{metric}"


# ----------------------------------------------------------------------------- reading


def read_json(path: Path) -> dict:
    """A JSON object, or {} where the file is missing or is not one."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read_table(path: Path, delimiter: str = ",") -> tuple[list[str], list[dict[str, str]]]:
    """A CSV/TSV file as (columns, rows of strings); ([], []) where it is missing."""
    try:
        with open(path, newline="") as fh:
            reader = csv.DictReader(fh, delimiter=delimiter)
            rows = [{k: v or "" for k, v in row.items() if k is not None} for row in reader]
            return list(reader.fieldnames or []), rows
    except OSError:
        return [], []


def number(value) -> float | None:
    """A cell as a float; None where empty or not a finite number."""
    if value is None or value == "":
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def to_int(value) -> int | None:
    out = number(value)
    return None if out is None else int(out)


def shown_path(path: Path) -> str:
    """How a file is named on the page: as given where relative, else by its name (the page
    holds no absolute path)."""
    path = Path(path)
    return path.name if path.is_absolute() else path.as_posix()


# ----------------------------------------------------------------------------- facts


@dataclass
class SFTFacts:
    steps: int | None = None  # optimiser steps of the run
    loss_first: float | None = None
    loss_last: float | None = None


def sft_facts(folder: Path) -> SFTFacts:
    """SFT's loss at the start and the end: summary.json, else the first and last steps.tsv
    rows."""
    summary = read_json(Path(folder) / "summary.json")
    _, rows = read_table(Path(folder) / "steps.tsv", "\t")
    losses = [number(r.get("loss")) for r in rows]
    losses = [v for v in losses if v is not None]
    first, last = number(summary.get("loss_first")), number(summary.get("loss_final"))
    return SFTFacts(steps=to_int(summary.get("steps")) or len(rows) or None,
                    loss_first=first if first is not None else (losses[0] if losses else None),
                    loss_last=last if last is not None else (losses[-1] if losses else None))


@dataclass
class RLStep:
    step: int
    mean_reward: float | None
    groups: int | None
    groups_kept: int | None
    updates: int | None  # optimiser updates in the step


@dataclass
class RLFacts:
    stage: str
    found: bool = False  # any of the stage's files was there
    planned: int | None = None  # summary.json `steps`
    steps: list[RLStep] = field(default_factory=list)
    val: dict[int, float | None] = field(default_factory=dict)  # step -> reward (None: no value)
    val_tasks: int | None = None
    selected_step: int | None = None
    selected_val: float | None = None

    @property
    def updates(self) -> int | None:
        """Policy updates over the stage: the steps' `updates` summed (0 where no group was
        kept and the column is missing); None where nothing says."""
        counted = [s.updates for s in self.steps if s.updates is not None]
        if counted:
            return sum(counted)
        kept = [s.groups_kept for s in self.steps if s.groups_kept is not None]
        return 0 if kept and sum(kept) == 0 else None

    @property
    def steps_with_update(self) -> int:
        return sum(1 for s in self.steps
                   if (s.updates if s.updates is not None else s.groups_kept or 0) > 0)

    @property
    def rewards(self) -> list[float]:
        return [s.mean_reward for s in self.steps if s.mean_reward is not None]

    @property
    def no_update(self) -> bool:
        """Steps ran, none updated the policy: no group's rewards differed, so the stage's
        output is its input checkpoint."""
        return bool(self.steps) and self.updates == 0

    @property
    def val_before(self) -> float | None:
        """Validation reward of the input checkpoint (step 0), before any update."""
        return self.val.get(0)


def rl_facts(folder: Path, stage: str) -> RLFacts:
    folder = Path(folder)
    summary = read_json(folder / "summary.json")
    step_columns, step_rows = read_table(folder / "steps.tsv", "\t")
    _, val_rows = read_table(folder / "val.tsv", "\t")
    facts = RLFacts(stage, found=bool(summary or step_columns or val_rows),
                    planned=to_int(summary.get("steps")))
    for row in step_rows:
        if (step := to_int(row.get("step"))) is not None:
            facts.steps.append(RLStep(step, number(row.get("mean_reward")),
                                      to_int(row.get("groups")), to_int(row.get("groups_kept")),
                                      to_int(row.get("updates"))))
    for row in val_rows:
        if (step := to_int(row.get("step"))) is not None:
            facts.val[step] = number(row.get("val_reward"))
            facts.val_tasks = to_int(row.get("val_tasks"))
    if not facts.val and isinstance(summary.get("val_rewards"), dict):
        facts.val = {int(k): number(v) for k, v in summary["val_rewards"].items()
                     if str(k).isdigit()}
    if facts.val_tasks is None:
        facts.val_tasks = to_int(summary.get("val_tasks"))
    best = to_int(summary.get("best_step"))
    facts.selected_step = best if best is not None and best >= 0 else None
    facts.selected_val = number(summary.get("best_val_reward"))
    if facts.selected_val is None and facts.selected_step in facts.val:
        facts.selected_val = facts.val[facts.selected_step]
    return facts


def rl_empty_reason(facts: RLFacts) -> str | None:
    """Why a stage's reward, update and KL curves are flat or empty, in a few words; None
    where a step updated the policy."""
    if not facts.found:
        return "no log of this stage (summary.json, steps.tsv missing)"
    if not facts.steps:
        return "no step logged"
    if facts.no_update:
        rewards = sorted(set(facts.rewards))
        same = f" (every rollout scored {fmt_number(rewards[0])})" if len(rewards) == 1 else ""
        return f"no group's rewards differed{same}: no policy update"
    return None


def val_reason(facts: RLFacts) -> str | None:
    """Why the validation curve is empty; None where it has a value."""
    if any(v is not None for v in facts.val.values()):
        return None
    if not facts.val:
        return "no validation row (val.tsv empty or missing)"
    if facts.val_tasks == 0:
        return "no validation task (the val split gave no prompt)"
    return "validation gave no value"


@dataclass
class EvalFacts:
    columns: list[str] = field(default_factory=list)  # results/kernelbench_<scale>.csv
    rows: list[dict[str, str]] = field(default_factory=list)
    compare_columns: list[str] = field(default_factory=list)  # the compare table
    compare: list[dict[str, str]] = field(default_factory=list)
    results_name: str = ""
    compare_name: str = ""

    @property
    def model(self) -> str:
        """The model's system name (its rows in the compare table carry it)."""
        return next((r["system"] for r in self.rows if r.get("system")), "model")

    def model_row(self, level: str = "all") -> dict[str, str] | None:
        return next((r for r in self.rows if r.get("level") == level), None)

    def levels(self) -> list[str]:
        """The levels in table order, `all` left out."""
        rows = self.compare or self.rows
        levels = dict.fromkeys(r.get("level", "") for r in rows)
        return [lv for lv in levels if lv not in ("", "all")]

    def systems_at(self, level: str = "all") -> list[dict[str, str]]:
        """A level's rows of the compare table (the model, its baselines, the paper's rows);
        the model's row alone where there is no compare table."""
        rows = [r for r in self.compare if r.get("level") == level]
        if not rows and self.model_row(level):
            rows = [{"source": "run", **self.model_row(level)}]
        return rows


def eval_facts(results: Path | None, compare: Path | None) -> EvalFacts:
    facts = EvalFacts()
    if results is not None:
        facts.columns, facts.rows = read_table(results)
        facts.results_name = shown_path(results)
    if compare is not None:
        facts.compare_columns, facts.compare = read_table(compare)
        facts.compare_name = shown_path(compare)
    return facts


# ----------------------------------------------------------------------------- words


def fmt_number(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "–"
    if value == int(value) and abs(value) < 1e6:
        return str(int(value))
    return f"{value:.{digits}g}"


def fmt_share(value) -> str:
    """A share (0-1) as a percentage: whole numbers, one decimal below 10%."""
    value = number(value)
    if value is None:
        return "–"
    if value == 0 or 100 * value >= 10:
        return f"{100 * value:.0f}%"
    return f"{100 * value:.1f}%"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def sft_sentence(facts: SFTFacts) -> str:
    if facts.loss_first is None:
        return "no SFT step was logged (its steps.tsv and summary.json hold no loss)."
    steps = _plural(facts.steps, "optimiser step") if facts.steps else "its steps"
    change = ""
    if facts.loss_last is not None and facts.loss_first:
        change = f" ({100 * (facts.loss_last / facts.loss_first - 1):+.0f}%)"
    return (f"{steps}; training loss {fmt_number(facts.loss_first, 4)} at the start, "
            f"{fmt_number(facts.loss_last, 4)} at the end{change}.")


def _training_sentence(facts: RLFacts) -> str:
    n = len(facts.steps)
    planned = f" of {facts.planned} planned" if facts.planned and facts.planned != n else ""
    rewards = facts.rewards
    if not facts.steps:
        return f"no training step was logged{planned}."
    if facts.no_update:
        same = sorted(set(rewards))
        scored = (f"every rollout scored {fmt_number(same[0])}" if len(same) == 1
                  else f"mean rewards {fmt_number(min(rewards))} to {fmt_number(max(rewards))}")
        return (f"{_plural(n, 'step')}{planned}, <b>no policy update</b>: no group's rewards "
                f"differed ({scored}), so the stage's output is its input checkpoint.")
    updates = facts.updates
    counted = _plural(updates, "policy update") if updates is not None else "policy updates"
    text = (f"{_plural(n, 'step')}{planned}, <b>{counted}</b> in {facts.steps_with_update} of "
            "them")
    if rewards:
        text += (f"; mean training reward {fmt_number(rewards[0])} at the first step, "
                 f"{fmt_number(rewards[-1])} at the last")
        if max(rewards) > max(rewards[0], rewards[-1]):
            text += f" (highest {fmt_number(max(rewards))})"
    return text + "."


def _validation_sentence(facts: RLFacts) -> str:
    reason = val_reason(facts)
    if reason:
        return f"Validation: {reason}."
    if 0 not in facts.val:
        first = "No validation before the first update (val.tsv has no row at step 0)"
    else:
        tasks = f", {_plural(facts.val_tasks, 'val task')}" if facts.val_tasks else ""
        first = (f"Validation reward {fmt_number(facts.val_before)} before the first update "
                 f"(step 0{tasks})")
    if facts.selected_step is None:
        chosen = "no step was selected (summary.json names none)"
    elif facts.selected_step == 0:
        chosen = "selected step 0, the input checkpoint"
    else:
        chosen = (f"selected step {facts.selected_step}: validation reward "
                  f"{fmt_number(facts.selected_val)}")
    return f"{first}; {chosen}."


def rl_sentences(facts: RLFacts) -> str:
    """What an RL stage did: steps and updates, training reward, validation."""
    if not facts.found:
        return "no log of this stage was found."
    return f"{_training_sentence(facts)} {_validation_sentence(facts)}"


def eval_sentences(facts: EvalFacts) -> str:
    """The model's `all` row in words (code written, compiled, correct under both headline
    readings), then its baselines' Exec beside it."""
    row = facts.model_row()
    if row is None:
        return ("no evaluation row was found (results/kernelbench_&lt;scale&gt;.csv has no "
                "<code>all</code> row).")
    paper, trust = column_of(PAPER, "exec"), column_of(TRUST, "exec")
    parts = []
    if "with_code" in row:
        parts.append(f"wrote code for {fmt_share(row['with_code'])}")
    if "compiled" in row:
        parts.append(f"{fmt_share(row['compiled'])} compiled")
    if paper in row:
        parts.append(f"{fmt_share(row[paper])} were correct under kernelbench_v0 "
                     "(the paper's protocol)")
    if trust in row:
        parts.append(f"{fmt_share(row[trust])} under strict, robust (the one to trust)")
    if len(parts) > 1:
        parts[-1] = "and " + parts[-1]
    tasks = to_int(row.get("tasks"))
    text = (f"Of the {tasks if tasks is not None else ''} tasks, the model "
            f"({html.escape(facts.model)}) {', '.join(parts) or 'has no count columns'}")
    if number(row.get("with_code")) == 0:
        text += ": <b>it wrote no code</b>, so every later column is 0"
    elif number(row.get("compiled")) == 0:
        text += ": <b>none of its kernels compiled</b>"
    elif number(row.get(paper)) == 0:
        text += ": <b>no kernel was correct</b>"
    out = [text.replace("Of the  tasks", "Of the tasks") + "."]
    rows = facts.systems_at()
    said = []
    baselines = [r for r in rows
                 if r.get("source", "run") == "run" and r.get("system") != facts.model]
    for other in baselines:
        cells = [f"{fmt_share(other[c])} {label}" for c, label in
                 ((paper, "kernelbench_v0"), (trust, "strict robust")) if other.get(c, "") != ""]
        said.append(f"{html.escape(other.get('system', '?'))} {', '.join(cells)}")
    if said:
        out.append(f"Its baselines, scored in the same harness session: {'; '.join(said)} (Exec).")
    paper_rows = [r for r in rows if r.get("source", "run") != "run"]
    if paper_rows:
        out.append(f"The paper's rows ({html.escape(paper_rows[0].get('source', ''))}) are in "
                   "the table below.")
    return " ".join(out)
