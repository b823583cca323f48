"""Task generation and the templates author's files: pure checks, no extension builds."""

from __future__ import annotations

import ast
import copy
import json
import types

import pytest
from dicepipe.augment import FAMILIES, generate_tasks
from dicepipe.augment.authors import make_author
from dicepipe.augment.authors.templates import SPECS, TemplateAuthor, candidate_file
from dicepipe.augment.shapes import resolve_shape
from dicepipe.data.infill import split_for_infilling
from kernelharness.static_checks import static_flags


@pytest.fixture(scope="module")
def settings(params):
    return copy.deepcopy(params["augment"])


def _exec(code: str, name: str):
    module = types.ModuleType(name)
    exec(compile(code, name, "exec"), module.__dict__)
    return module


def test_cpu_shrink_keeps_head_layout():
    config = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
              "num_key_value_heads": 8, "head_dim": 128}
    shape = resolve_shape(config, 4, 512, "cpu", 16)
    assert (shape.seq, shape.hidden, shape.intermediate) == (32, 256, 896)
    assert (shape.heads, shape.kv_heads, shape.head_dim) == (8, 2, 32)
    assert shape.heads * shape.head_dim == shape.hidden
    assert resolve_shape(config, 4, 512, "cuda", 16).hidden == 4096
    # a single kv head and a head count that does not divide stay valid
    tiny = resolve_shape({**config, "num_attention_heads": 14, "num_key_value_heads": 2}, 1, 8,
                         "cpu", 16)
    assert tiny.kv_heads >= 1 and tiny.heads % tiny.kv_heads == 0 and tiny.seq >= 1


def test_tasks_are_deterministic_unique_and_cover_families(settings):
    settings["max_tasks"] = {}
    every = generate_tasks(settings, "cuda")
    assert [t.task_id for t in every] == [t.task_id for t in generate_tasks(settings, "cuda")]
    assert len({t.task_id for t in every}) == len(every)
    assert len({t.reference_code for t in every}) == len(every)
    assert {t.family for t in every} == set(settings["families"])
    assert {json.loads(t.shape_json)["head_dim"] for t in every if "head_dim" in t.shape_json} \
        >= {64, 128, 256}
    settings["max_tasks"] = {"cuda": len(settings["families"])}
    limited = generate_tasks(settings, "cuda")
    assert [t.family for t in limited] == list(settings["families"])
    settings["seed"] += 1
    assert [t.task_id for t in generate_tasks(settings, "cuda")] != [t.task_id for t in limited]


def test_levels_and_grouped_query_only_where_kv_heads_differ(settings):
    settings["max_tasks"] = {}
    for task in generate_tasks(settings, "cpu"):
        assert task.level == (2 if task.family == "rmsnorm_proj" else 3)
        if task.family.startswith("gqa"):
            assert task.shape.kv_heads < task.shape.heads


def test_cpu_references_run_and_match_their_constants(settings):
    import torch

    for task in generate_tasks(settings, "cpu"):
        ref = _exec(task.reference_code, "reference")
        torch.manual_seed(0)
        model = ref.Model(*ref.get_init_inputs())
        (x,) = ref.get_inputs()
        assert x.shape == (task.shape.batch, task.shape.seq, task.shape.hidden)
        with torch.no_grad():
            y = model(x)
        assert y.shape == x.shape or task.family == "rmsnorm_proj"
        assert torch.isfinite(y).all()


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_template_files_are_clean_infillable_and_shape_free(settings, backend):
    settings["max_tasks"] = {}
    tasks = generate_tasks(settings, backend)
    author = TemplateAuthor()
    sources = {}
    for task in tasks:
        kernel = FAMILIES[task.family].kernel
        variants = SPECS[backend][kernel].variants
        files = [author.write(task, a).code for a in range(len(variants))]
        assert author.write(task, len(variants)) is None
        assert len(set(files)) == len(files)  # attempts differ
        for code in files:
            tree = ast.parse(code)
            assert not any(static_flags(code, backend).values()), task.task_id
            split = split_for_infilling(code)
            assert split is not None and "".join(split) == code
            # the operator source is one literal, the same for every shape and variant
            sources.setdefault(kernel, set()).add(split[1])
            init = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                        and n.name == "__init__")
            ref_init = next(n for n in ast.walk(ast.parse(task.reference_code))
                            if isinstance(n, ast.FunctionDef) and n.name == "__init__")
            assert [a.arg for a in init.args.args] == [a.arg for a in ref_init.args.args]
    assert all(len(texts) == 1 for texts in sources.values()), sources.keys()


def test_template_model_new_matches_reference_parameters(settings):
    """Same parameters in the same order, so seeded initialisation gives equal weights."""
    import torch

    for task in generate_tasks(settings, "cpu"):
        ref = _exec(task.reference_code, "reference")
        code = candidate_file(task, SPECS["cpu"][FAMILIES[task.family].kernel].variants[0])
        # build nothing: load_inline is replaced by a stub for this structural check
        code = code.replace("from torch.utils.cpp_extension import load_inline",
                            "load_inline = lambda **kw: None")
        cand = _exec(code, "candidate")
        torch.manual_seed(0)
        a = ref.Model(*ref.get_init_inputs())
        torch.manual_seed(0)
        b = cand.ModelNew(*ref.get_init_inputs())
        pa, pb = list(a.named_parameters()), list(b.named_parameters())
        assert [n for n, _ in pa] == [n for n, _ in pb]
        assert all(torch.equal(x, y) for (_, x), (_, y) in zip(pa, pb))


def test_make_author_templates_by_default(settings):
    assert make_author(settings, "cpu").name == "templates"
