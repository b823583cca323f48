"""One rendering of a conversation for every consumer: SFT, evaluation, RL and the augment
`local` author turn the same user text into the same prompt ids, with the real SDAR-8B-Chat
tokenizer and chat template (../shared/data/sdar-8b-chat; skipped where it is absent).
The empty-think option: tests/test_prompt_sources.py."""

from __future__ import annotations

from pathlib import Path

import pytest

SDAR = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "sdar-8b-chat"


@pytest.fixture(scope="module")
def sdar_tokenizer():
    if not (SDAR / "tokenizer_config.json").is_file():
        pytest.skip("../shared/data/sdar-8b-chat is absent")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(SDAR))


def test_sft_evaluation_and_local_author_render_the_same_ids(sdar_tokenizer):
    from dicepipe.augment.authors.local import LocalAuthor
    from dicepipe.data.prompts import end_to_end_prompt, response_text
    from dicepipe.model.generate import _stop_ids
    from dicepipe.model.tokenizer import (
        IGNORE_INDEX,
        chat_format,
        encode_prompts,
        encode_sft_example,
    )

    tok = sdar_tokenizer
    reference = "import torch\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x.argmax(1)\n"
    user = end_to_end_prompt(reference, "cuda")
    fmt = chat_format(tok)
    sft = encode_sft_example(tok, fmt, user, response_text("class ModelNew: pass"), 4, tok.pad_token_id)
    sft_prompt = [i for i, label in zip(sft.input_ids, sft.labels) if label == IGNORE_INDEX]
    evaluation = encode_prompts(tok, None, [user])[0]  # what evaluate's generation sends
    author = LocalAuthor({"path": str(SDAR), "max_new_tokens": 8, "temperature": 0.0}, "cuda")
    local = author._prompt_ids(tok, user)
    assert sft_prompt == evaluation == local
    # RL rollouts (both stages): the task's prompt as encode_tasks renders it
    from dicepipe.train.rl_tasks import Task, encode_tasks

    rl = encode_tasks([Task("t", 1, reference, user)], tok, 10_000).prompt_ids[0]
    assert rl == evaluation
    # the template's own generation prompt, called as the release's evaluation calls it (no
    # enable_thinking): the open assistant turn, no think block ...
    templated = tok.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                        add_generation_prompt=True)
    assert tok.decode(evaluation) == templated
    assert templated.endswith("<|im_start|>assistant\n")
    # ... which SFT trains as the start of the response, as LLaMA-Factory's qwen3 template
    # does with thinking on (the release's SFT): the pair renders as the template writes it
    sft_text = tok.decode(sft.input_ids)
    pair = tok.apply_chat_template([{"role": "user", "content": user},
                                    {"role": "assistant", "content": response_text("class ModelNew: pass")}],
                                   tokenize=False)
    assert sft_text.startswith(pair.rstrip("\n"))
    assert tok.decode(sft.input_ids[len(sft_prompt):]).startswith("<think>\n\n</think>\n\n```python")
    assert 151645 in _stop_ids(tok)  # <|im_end|> ends the turn
    assert sft.input_ids[len(sft_prompt):][-1] in (151645, tok.pad_token_id)


def test_prompts_name_no_dtype_for_every_tensor():
    from dicepipe.data.prompts import end_to_end_prompt, infilling_prompt

    for text in (end_to_end_prompt("x", "cuda"), infilling_prompt("x", "a", "b", "cpu")):
        assert "float32" not in text
        assert "integer" in text
