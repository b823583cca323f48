"""How well a tiny-scale model writes the corpus's kernels: greedy (and optionally sampled)
decodes of every shipped chain (data/seed/chains) in both prompt forms, compared with the
chain's own kernel file: whole files equal after normalising whitespace, and loop-body lines
equal. No build: the harness's verdicts are the pipeline's job; this is the quick look at a
base or SFT model (the shipped base, data/base/tiny, or models/sft/tiny).

    python bench/tiny_base.py data/base/tiny [--device cuda] [--temperature 1.0 --samples 4]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "workflow"))


def body_lines(code: str) -> list[str]:
    lines = code.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() in ("float v = px[i];", "float x = px[i];")) + 1
        end = next(i for i, line in enumerate(lines) if "po[i] = " in line)
    except StopIteration:
        return []
    return [line.strip() for line in lines[start:end]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--corpus", default=str(REPO / "data/seed/chains"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--samples", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=384)
    args = parser.parse_args()

    import torch
    from dicepipe.data import prompts
    from dicepipe.data.extract import code_from_text, normalise_code
    from dicepipe.data.infill import split_for_infilling
    from dicepipe.model.decode import Decoder, DecodeSettings
    from dicepipe.model.loading import load_saved
    from dicepipe.model.tokenizer import prompt_ids

    loaded = load_saved(args.model, dtype=torch.float32, device=args.device)
    corpus = Path(args.corpus)
    names = sorted(p.stem for p in (corpus / "reference").glob("*.py"))
    rows = []
    for name in names:
        ref = (corpus / "reference" / f"{name}.py").read_text()
        kernel = (corpus / "kernels" / f"{name}.py").read_text()
        prefix, _, suffix = split_for_infilling(kernel)
        for form, text in (("e2e", prompts.end_to_end_prompt(ref, "cpu")),
                           ("infill", prompts.infilling_prompt(ref, prefix, suffix, "cpu"))):
            rows += [(name, form, prompt_ids(loaded.tokenizer, text), kernel)] * args.samples
    greedy = args.temperature == 0
    settings = DecodeSettings(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                              strategy="sequential" if greedy else "dynamic", seed=0)
    result = Decoder(loaded.model, loaded.settings).generate([r[2] for r in rows], settings)
    stats: dict = {}
    for (name, form, _, kernel), gen in zip(rows, result.generations):
        code = code_from_text(loaded.tokenizer.decode(gen.token_ids, skip_special_tokens=True))
        want, got = body_lines(kernel), body_lines(code or "")
        s = stats.setdefault(form, {"decodes": 0, "exact": 0, "body_lines": 0, "body_lines_right": 0})
        s["decodes"] += 1
        s["exact"] += code is not None and normalise_code(code) == normalise_code(kernel)
        s["body_lines"] += len(want)
        s["body_lines_right"] += sum(a == b for a, b in zip(want, got)) if len(want) == len(got) else 0
    print(json.dumps({"model": args.model, "temperature": args.temperature, "samples": args.samples,
                      "forms": stats}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
