"""The DICE paper's KernelBench tables as rows of the compare table (pure functions).

`paper_tables.yaml` (shipped beside this module) transcribes the paper's Tables 1-3 as it
prints them: per system and level, "Exec fast_1/fast_2" in percent of the level's problems.
`literature_rows` turns the table a scale names (evaluate `paper_table`: 8b, 4b, 1p7b or
none) into rows shaped like the run's summary rows: a `source` and a `protocol` label, and
only the columns the paper reports, `<protocol>.<verdict>.exec` and
`<protocol>.<verdict>.fast_<p>_<statistic>` as fractions, per level and for `all` (the
problem-weighted mean over the 250 problems). `check_protocol` refuses a params.yaml whose
protocol of the same name measures something else, so a column never mixes two protocols.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from ..errors import ConfigError, SourceError
from .metrics import p_label

TABLES_PATH = Path(__file__).with_name("paper_tables.yaml")
NONE = "none"
RUN_SOURCE = "run"
_CELL = re.compile(r"^(\d+) (\d+(?:/\d+)*)$")
_PROTOCOL_FIELDS = ("check", "trials", "fp32", "low_precision")


@dataclass(frozen=True)
class PaperRow:
    system: str
    size: str
    diffusion: bool
    counts: Mapping[str, tuple[int, ...]]  # level -> (exec, fast_p...) in problems


@dataclass(frozen=True)
class PaperTable:
    key: str
    number: int
    source: str
    protocol: Mapping
    verdict: str
    statistic: str
    fast_p: tuple[float, ...]
    problems: Mapping[str, int]  # level -> problems in it
    rows: tuple[PaperRow, ...]

    @property
    def label(self) -> str:
        return f"{self.source}, Table {self.number}"

    def columns(self) -> list[str]:
        """The compare-table columns this table fills (besides the labels)."""
        prefix = f"{self.protocol['name']}.{self.verdict}"
        return [f"{prefix}.exec"] + [f"{prefix}.fast_{p_label(p)}_{self.statistic}" for p in self.fast_p]


def parse_cell(text: str, n_fast: int, where: str) -> tuple[int, ...]:
    """"40 9/5" -> (40, 9, 5): Exec then each fast_p, in percent."""
    match = _CELL.match(str(text).strip())
    values = (int(match.group(1)), *(int(v) for v in match.group(2).split("/"))) if match else ()
    if len(values) != 1 + n_fast:
        raise SourceError(f"{TABLES_PATH}: {where} is {text!r}. Expected 'Exec fast_1/fast_2' in "
                          f"percent, e.g. '40 9/5' ({n_fast} fast_p values).")
    if any(b > a for a, b in pairwise(values)) or values[0] > 100:
        raise SourceError(f"{TABLES_PATH}: {where} is {text!r}. Expected Exec >= fast_1 >= fast_2 "
                          "(a fast kernel is a correct one), all at most 100.")
    return values


def _counts(percents: tuple[int, ...], problems: int, where: str) -> tuple[int, ...]:
    """Percent of a level's problems back to problems (the paper's cells are whole problems)."""
    counts = tuple(v * problems // 100 for v in percents)
    if any(v * problems % 100 for v in percents):
        raise SourceError(f"{TABLES_PATH}: {where} has {percents} percent of {problems} problems, "
                          "not a whole number of problems. Check the transcription.")
    return counts


def load_tables(path: Path = TABLES_PATH) -> dict[str, PaperTable]:
    """The transcribed tables by key (8b, 4b, 1p7b), validated."""
    import yaml

    data = yaml.safe_load(Path(path).read_text())
    problems = {str(level): int(n) for level, n in data["problems"].items()}
    fast_p = tuple(float(p) for p in data["fast_p"])
    tables = {}
    for key, table in data["tables"].items():
        rows = []
        for i, row in enumerate(table["rows"]):
            counts = {}
            for level, n in problems.items():
                where = f"tables.{key}.rows[{i}] ({row.get('system')}) L{level}"
                if f"L{level}" not in row:
                    raise SourceError(f"{TABLES_PATH}: {where} is missing.")
                counts[level] = _counts(parse_cell(row[f"L{level}"], len(fast_p), where), n, where)
            rows.append(PaperRow(str(row["system"]), str(row["size"]), bool(row["diffusion"]), counts))
        tables[str(key)] = PaperTable(str(key), int(table["table"]), data["source"], data["protocol"],
                                      data["verdict"], data["statistic"], fast_p, problems, tuple(rows))
    return tables


def table_keys(path: Path = TABLES_PATH) -> list[str]:
    return sorted(load_tables(path))


def check_protocol(table: PaperTable, protocols: Mapping[str, Mapping], reported: Sequence[str],
                   where: str) -> None:
    """The run reports the paper's protocol under its name, defined as the paper measured it."""
    name = table.protocol["name"]
    fix = f"or set {where}: none to leave the paper's rows out"
    if name not in reported:
        raise ConfigError(f"params.yaml: {where} is {table.key!r} but evaluate.protocols "
                          f"{list(reported)} leaves out {name!r}, the protocol of {table.label}. "
                          f"Add {name!r} to evaluate.protocols, {fix}.")
    ours = protocols.get(name) or {}

    def same(field):
        mine, theirs = ours.get(field), table.protocol[field]
        return mine == theirs if field == "check" else mine is not None and float(mine) == float(theirs)

    if not all(same(f) for f in _PROTOCOL_FIELDS):
        expected = {f: table.protocol[f] for f in _PROTOCOL_FIELDS}
        raise ConfigError(f"params.yaml: protocols.{name} is {dict(ours)}, which is not how "
                          f"{table.label} measured ({expected}): its rows would sit in columns "
                          f"that mean something else. Restore protocols.{name}, {fix}.")


def literature_rows(table: PaperTable) -> list[dict]:
    """Compare-table rows: per paper row, one per level and one for `all` (the
    problem-weighted mean), fractions rounded as the run's summary rounds them."""
    columns = table.columns()
    total = sum(table.problems.values())
    rows = []
    for paper_row in table.rows:
        labels = {"source": table.label, "system": paper_row.system, "size": paper_row.size,
                  "protocol": table.protocol["name"]}
        for level, n in table.problems.items():
            counts = paper_row.counts[level]
            rows.append({**labels, "level": level, "tasks": n,
                         **{c: round(v / n, 6) for c, v in zip(columns, counts)}})
        summed = [sum(paper_row.counts[lv][i] for lv in table.problems) for i in range(len(columns))]
        rows.append({**labels, "level": "all", "tasks": total,
                     **{c: round(v / total, 6) for c, v in zip(columns, summed)}})
    return rows


def paper_table_for(settings: Mapping, protocols: Mapping[str, Mapping], reported: Sequence[str],
                    where: str, path: Path = TABLES_PATH) -> PaperTable | None:
    """The table a scale's evaluate settings name (None for `none`), checked against the run."""
    key = settings.get("paper_table", NONE)
    if key == NONE:
        return None
    tables = load_tables(path)
    if key not in tables:
        raise ConfigError(f"params.yaml: {where} is {key!r}. Expected one of "
                          f"{[NONE, *sorted(tables)]}.")
    check_protocol(tables[key], protocols, reported, where)
    return tables[key]
