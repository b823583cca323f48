"""The tiny scale's tokenizer, and chat formatting shared by every tokenizer.

The tiny tokenizer is a byte-level BPE trained on the SFT split's text, with Qwen-like
special tokens and a small Qwen-like chat template, so the tiny scale exercises the same
formatting path as SDAR (whose tokenizer carries Qwen3's template).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..errors import ModelError

END_OF_TEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
MASK = "<|MASK|>"
SPECIAL_TOKENS = (END_OF_TEXT, IM_START, IM_END, MASK)
IGNORE_INDEX = -100

TINY_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Stands in for the response when rendering a template, to split it into the text before
# the response (the prompt) and after it (the end of the assistant turn).
_RESPONSE_SENTINEL = "\u2063DICEPIPE_RESPONSE\u2063"


def train_tiny_tokenizer(texts: Iterable[str], vocab_size: int):
    """Byte-level BPE on `texts` (deterministic for the same texts in the same order)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(list(texts), trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        mask_token=MASK,
        additional_special_tokens=[IM_START],
    )
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    if len(tokenizer) > vocab_size:
        raise ModelError(f"tiny tokenizer has {len(tokenizer)} tokens, more than vocab_size {vocab_size}")
    return tokenizer


@dataclass(frozen=True)
class ChatFormat:
    """How a (prompt, response) pair becomes text under a tokenizer's chat template."""

    prompt_prefix: str  # rendered text before the user's content
    prompt_suffix: str  # rendered text between the user's content and the response
    turn_end: str  # rendered text after the response (end of the assistant turn)
    # What the template writes between the open assistant turn and a response but the
    # generation prompt leaves to the model (Qwen3/SDAR: an empty <think> block); SFT trains
    # it as the response's start. Empty when `prompt_suffix` carries it (empty_think).
    response_lead: str = ""

    def prompt_text(self, user_text: str) -> str:
        return self.prompt_prefix + user_text + self.prompt_suffix


def chat_format(tokenizer, empty_think: bool = False) -> ChatFormat:
    """The template's rendering of one turn. The prompt ends where
    `apply_chat_template(add_generation_prompt=True)` ends it, as the release's evaluation
    renders (for SDAR: `<|im_start|>assistant\\n`); `empty_think` instead ends it where a
    rendered (user, assistant) pair starts the response (for SDAR the empty think block, as
    `enable_thinking=False` writes it)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ModelError("the tokenizer has no chat template; SFT and decoding need one.")
    user_marker = "\u2063DICEPIPE_USER\u2063"
    text = tokenizer.apply_chat_template(
        [
            {"role": "user", "content": user_marker},
            {"role": "assistant", "content": _RESPONSE_SENTINEL},
        ],
        tokenize=False,
    )
    if text.count(user_marker) != 1 or text.count(_RESPONSE_SENTINEL) != 1:
        raise ModelError("the tokenizer's chat template does not render message contents verbatim.")
    before_user, after_user = text.split(user_marker)
    between, turn_end = after_user.split(_RESPONSE_SENTINEL)
    generation = tokenizer.apply_chat_template([{"role": "user", "content": user_marker}],
                                               tokenize=False, add_generation_prompt=True)
    opened = generation.split(user_marker)[-1]
    if empty_think or not between.startswith(opened):
        return ChatFormat(prompt_prefix=before_user, prompt_suffix=between, turn_end=turn_end)
    return ChatFormat(prompt_prefix=before_user, prompt_suffix=opened, turn_end=turn_end,
                      response_lead=between[len(opened):])


def encode_text(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def prompt_ids(tokenizer, user_text: str, fmt: ChatFormat | None = None) -> list[int]:
    """THE rendering of a one-turn conversation (the user's text, then the assistant turn
    opened) to ids, for SFT, RL rollouts, evaluation and the augment `local` author alike.

    By default (`chat_format(tokenizer)`) it is `apply_chat_template(add_generation_prompt=True)`,
    as the release's evaluation renders: for SDAR no think block, which SFT trains as the
    start of the response (`ChatFormat.response_lead`, as LLaMA-Factory's qwen3 template does
    with thinking on). `chat_format(tokenizer, empty_think=True)` puts the template's empty
    `<think>` block into the prompt instead (`enable_thinking=False`). A tokenizer without a
    chat template (a plain causal LM) gets the bare text."""
    if fmt is None:
        if not getattr(tokenizer, "chat_template", None):
            return encode_text(tokenizer, user_text)
        fmt = chat_format(tokenizer)
    return encode_text(tokenizer, fmt.prompt_text(user_text))


def stop_token_ids(tokenizer, fmt: ChatFormat) -> tuple[int, ...]:
    """Ids that end a generation: the special tokens closing an assistant turn, EOS, pad."""
    special = set(tokenizer.all_special_ids)
    ids = [i for i in encode_text(tokenizer, fmt.turn_end) if i in special]
    for extra in (tokenizer.eos_token_id, tokenizer.pad_token_id):
        if extra is not None:
            ids.append(int(extra))
    return tuple(dict.fromkeys(ids))


@dataclass(frozen=True)
class SFTExample:
    input_ids: tuple[int, ...]
    labels: tuple[int, ...]  # IGNORE_INDEX on the prompt, the token itself on the response

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def prompt_len(self) -> int:
        return sum(1 for label in self.labels if label == IGNORE_INDEX)


def encode_sft_example(
    tokenizer, fmt: ChatFormat, prompt: str, response: str, block_size: int, pad_token_id: int
) -> SFTExample:
    """Prompt ids (not trained) + response ids (the template's response lead first) and the
    end of turn (trained), padded to a
    multiple of `block_size` with pad tokens that are trained too: the model learns to
    fill the rest of the last block with pad after the end of turn, which is what stops
    block decoding (as in SDAR's SFT data processor)."""
    prompt = prompt_ids(tokenizer, prompt, fmt)
    lead = fmt.response_lead
    if lead and response.lstrip().startswith(lead.strip().split("\n")[0]):
        lead = ""  # the response writes its own (think) block
    response_ids = encode_text(tokenizer, lead + response + fmt.turn_end)
    ids = prompt + response_ids
    labels = [IGNORE_INDEX] * len(prompt) + response_ids
    pad = (-len(ids)) % block_size
    ids += [pad_token_id] * pad
    labels += [pad_token_id] * pad
    return SFTExample(tuple(ids), tuple(labels))


def encode_prompts(tokenizer, fmt: ChatFormat | None, prompts: Sequence[str]) -> list[list[int]]:
    """`prompt_ids` for each user text (fmt None: the tokenizer's own, or bare text)."""
    if fmt is None and getattr(tokenizer, "chat_template", None):
        fmt = chat_format(tokenizer)
    return [prompt_ids(tokenizer, p, fmt) for p in prompts]
