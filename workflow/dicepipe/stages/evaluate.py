"""`dicepipe evaluate`: KernelBench evaluation of a scale's model and its baselines.

    dicepipe evaluate --scale tiny --model models/sft/tiny --benchmark data/benchmark/seed.parquet \\
        --out-dir results/kernelbench_tiny --summary results/kernelbench_tiny.csv \\
        --compare results/kernelbench_compare_tiny.csv --metrics metrics/evaluate/tiny

The model (and every model baseline of `baselines.<scale>`) writes `samples` kernels per
task (evaluate.defaults + evaluate.overrides.<scale>); folder baselines supply theirs. All
are scored in one harness session on the scale's backend, each against the eager reference
timed beside it. Outputs: the summary (a row per level and `all`, a column per metric), the
per-task table, generations and kernel files under --out-dir (baselines under
<out-dir>/baselines/<name>), the comparison of the model with its baselines per level (and
the DICE paper's table for the scale, `paper_table`, as labelled literature rows), DVC
metrics and plots. Scoring resumes from .cache/dicepipe/resume/evaluate/ after a kill
(harness.stored_results: a row is reused under the same programs and measurement settings).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

log = logging.getLogger(__name__)
RESUME_DIR = Path(".cache/dicepipe/resume/evaluate")


def add_arguments(parser) -> None:
    parser.add_argument("--scale", required=True, help="scale name under params.yaml 'scales'")
    parser.add_argument("--model", required=True,
                        help="model to evaluate: a stage checkpoint folder, a local folder or hub id")
    parser.add_argument("--benchmark", required=True, help="benchmark table (dicepipe benchmark output)")
    parser.add_argument("--out-dir", required=True, help="per-task table, generations, kernel files")
    parser.add_argument("--summary", required=True, help="summary CSV (a row per level and all)")
    parser.add_argument("--compare", required=True, help="model, baselines and the paper's rows per level (CSV)")
    parser.add_argument("--metrics", required=True, help="folder for metrics.json and plots")
    parser.add_argument("--download", action="store_true",
                        help="allow downloading hub checkpoints missing from the local cache")


def _systems(args, params: dict) -> list[dict]:
    """The scale's model first (in the paper's tables, DICE), then its baselines in params
    order."""
    systems = [{"name": "model", "model": args.model, "paper_system": "DICE"}]
    for entry in params.get("baselines", {}).get(args.scale) or []:
        systems.append(dict(entry))
    return systems


def _check_paper_systems(systems: list[dict], paper, scale: str) -> None:
    """A baseline's `paper_system` names a row of the scale's paper table (none: no check)."""
    from ..errors import ConfigError

    if paper is None:
        return
    names = [row.system for row in paper.rows]
    for index, system in enumerate(systems[1:]):
        if system.get("paper_system") and system["paper_system"] not in names:
            raise ConfigError(
                f"params.yaml: key 'baselines.{scale}[{index}].paper_system' is "
                f"{system['paper_system']!r}, not a row of the paper's {paper.label}. Expected "
                f"one of {names}.")


def _generate(system: dict, tasks, prompts: list[str], settings, out_dir: Path, code_block: str,
              allow_download: bool, resume_dir: Path):
    """Generate with a model system; returns (candidates, generation rows)."""
    import gc

    import torch

    from ..errors import ModelError
    from ..model.generate import generate_texts, generation_key, load_generator
    from ..evaluation.kernel_files import candidates_from_texts

    try:
        gen = load_generator(system["model"], system["name"], settings, allow_download)
    except ModelError as exc:
        where = "--model" if system["name"] == "model" else f"baseline {system['name']!r}"
        raise ModelError(f"{where} ({system['model']}): {exc}") from exc
    log.info("%s: generating %d x %d kernels (max %d new tokens, %s)", system["name"], len(tasks),
             settings.samples, settings.max_new_tokens, gen.kind)
    journal = resume_dir / f"generate-{system['name']}-{generation_key(gen, prompts, settings)}.jsonl"
    outputs = generate_texts(gen, prompts, settings, journal=journal)
    del gen
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    texts = [[o["text"] for o in samples] for samples in outputs]
    candidates = candidates_from_texts(tasks, texts, out_dir / "kernels", Path.cwd(), code_block)
    rows = [{"task_id": t["task_id"], "sample": s, "new_tokens": o["new_tokens"],
             "stopped": o["stopped"], "text": o["text"]}
            for t, samples in zip(tasks, outputs) for s, o in enumerate(samples)]
    return candidates, rows


def run(args, params: dict) -> int:
    from ..config import resolve_scale, stage_settings
    from ..data.prompt_sources import evaluation_prompt
    from ..data.schema import BENCHMARK_SCHEMA, read_table
    from ..model.generate import GenerationSettings
    from ..evaluation.kernel_files import read_folder
    from ..evaluation.literature import paper_table_for
    from ..evaluation.metrics import headline
    from ..evaluation.report import write_csv
    from ..evaluation.scoring import score
    from kernelharness import HarnessSession, HarnessSettings, stored_results
    from ..judgement import named_protocol

    scale = resolve_scale(params, args.scale)
    section = params["evaluate"]
    settings = stage_settings(params, "evaluate", scale=args.scale)
    gen_settings = GenerationSettings.from_params(settings, f"evaluate (scale {args.scale})")
    protocols = [named_protocol(name, params["protocols"]) for name in section["protocols"]]
    paper = paper_table_for(settings, params["protocols"], section["protocols"],
                            f"evaluate.overrides.{args.scale}.paper_table")
    tasks = read_table(args.benchmark, BENCHMARK_SCHEMA).to_pylist()
    out_dir = Path(args.out_dir)
    systems = _systems(args, params)
    _check_paper_systems(systems, paper, args.scale)
    folders = {s["name"]: out_dir if s["name"] == "model" else out_dir / "baselines" / s["name"]
               for s in systems}
    candidates, generations = {}, {}
    for system in systems:  # folder baselines are read before this stage's outputs go
        if "folder" in system:
            candidates[system["name"]] = read_folder(Path(system["folder"]), tasks, Path.cwd())
    # in the wording params.yaml names (a missing prompt source stops here, before any output goes)
    prompts = [evaluation_prompt(settings["prompt"], params, t["reference_code"], scale.backend)
               for t in tasks]
    shutil.rmtree(out_dir, ignore_errors=True)
    for system in systems:  # generation first: the GPU is free again before the harness runs
        name = system["name"]
        if "folder" not in system:
            candidates[name], generations[name] = _generate(
                system, tasks, prompts, gen_settings, folders[name], section["code_block"],
                args.download, RESUME_DIR / args.scale)
    harness = HarnessSettings.from_params(params["harness"], repeats=settings["repeats"],
                                          decision_thresholds=section["fast_p"])
    summaries = {}
    with HarnessSession(harness) as session:
        for system in systems:
            name = system["name"]
            # a folder per system and measurement setup (its reference checks and candidates)
            resume = stored_results(RESUME_DIR / args.scale, name, harness).with_suffix("")
            records = score(session, tasks, candidates[name], scale.backend, resume)
            summaries[name] = _write_system(name, records, generations.get(name), protocols,
                                            section, folders[name])
            if name == "model":
                _write_model_outputs(args, records, summaries[name], protocols, section, scale.name)
            else:
                write_csv(summaries[name], out_dir / "baselines" / f"{name}.csv")
    # the paper's name for each system, where a paper table is set beside the run
    _write_compare(args, summaries, protocols, section, paper, scale.name,
                   {s["name"]: s.get("paper_system", "") for s in systems} if paper else {})
    for row in summaries["model"]:
        log.info("%s level %s: Exec fast_p (%s, plain) %s | robust %s | reference failed %d",
                 args.scale, row["level"], protocols[0].name,
                 headline(row, protocols[0].name, "plain", section["fast_p"]),
                 headline(row, protocols[0].name, "robust", section["fast_p"]), row["reference_failed"])
    return 0


def _write_system(name: str, records, generations, protocols, section, folder: Path) -> list[dict]:
    import pyarrow as pa

    from ..data.schema import write_table
    from ..evaluation.metrics import summarize
    from ..evaluation.report import task_columns, task_rows, write_csv
    from kernelharness.results import rows_to_table

    write_csv(task_rows(records, name, protocols), folder / "tasks.csv", task_columns(protocols))
    if generations is not None:
        write_table(pa.Table.from_pylist(generations), folder / "generations.parquet")
    scored = [r for r in records if r["result"]]
    if scored:  # the harness rows (RESULT_SCHEMA) with the task and sample they belong to
        table = rows_to_table(r["result"] for r in scored)
        table = table.append_column("task_id", pa.array([r["task_id"] for r in scored]))
        table = table.append_column("sample", pa.array([r["sample"] for r in scored], pa.int32()))
        write_table(table, folder / "scores.parquet")
    return summarize(records, name, protocols, section["fast_p"], section["pass_k"])


def _write_model_outputs(args, records, summary, protocols, section, scale: str) -> None:
    from ..evaluation.report import metrics_json, plot_levels, plot_speedups, write_csv

    write_csv(summary, Path(args.summary))
    metrics = Path(args.metrics)
    metrics_json(summary, metrics / "metrics.json")
    plot_levels(summary, protocols[0].name, section["fast_p"], metrics / "levels.png",
                f"KernelBench, {scale}")
    plot_speedups(records, protocols[0], metrics / "speedups.png", f"KernelBench, {scale}")


def _write_compare(args, summaries: dict, protocols, section, paper, scale: str,
                   paper_systems: dict | None = None) -> None:
    """Model and baselines per level, and the paper's table for the scale (`paper_table`)
    beside them, labelled with its source and protocol; the same as a plot."""
    from ..evaluation.literature import literature_rows
    from ..evaluation.report import compare_rows, plot_compare, write_csv

    literature = literature_rows(paper) if paper else []
    rows, columns = compare_rows(summaries, [p.name for p in protocols], literature, paper_systems)
    write_csv(rows, Path(args.compare), columns)
    # beside the paper, the run's columns of the paper's protocol; else the first reported
    protocol = paper.protocol["name"] if paper else protocols[0].name
    plot_compare(rows, protocol, section["fast_p"], Path(args.metrics) / "compare.png",
                 f"KernelBench, {scale}")
