"""Rollouts: a decoding copy of the policy, groups decoded with the Decoder, and scoring of
each decoded chunk in a thread while the next chunk decodes (same weights: on-policy).

The copy holds the policy's current weights in bf16 on GPU (fp32 on CPU) and is refreshed
before every step's rollouts; under FSDP every rank gathers the full weights into its own
copy and decodes its share of the groups.
"""

from __future__ import annotations

import copy
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass

import torch

from ..model.decode import Decoder, DecodeSettings
from ..model.generate import block_decode_settings
from .data import stable_seed
from .parallel import DistEnv
from ..data.extract import code_from_text
from .rl_reward import Reward, Rollout
from .rl_tasks import Task


def decode_settings(settings: dict, greedy: bool = False) -> DecodeSettings:
    """Rollouts sample (temperature, dynamic threshold); validation decodes greedily as the
    evaluation does (the release's greedy static remasking: top-1 sampling gives every
    masked position confidence 1, so the tie goes to the leftmost, i.e. `sequential`)."""
    return block_decode_settings({**settings, "top_p": 1.0}, greedy=greedy,
                                 strategy="sequential" if greedy else None)


def device_copy(lm, device: torch.device, dtype: torch.dtype):
    """A copy of a transformers model made on `device` in `dtype`, tensor by tensor: every
    rank holds its fp32 master on the host, and a host-side deepcopy would add a second one
    (about 33 GB at 8B per rank). Models that cannot be rebuilt from their config are
    deep-copied as before."""
    config = getattr(lm, "config", None)
    if config is None:
        return copy.deepcopy(lm).to(device, dtype)
    with torch.device("meta"):
        clone = type(lm)(config)
    clone.to_empty(device=device)
    clone.to(dtype)
    with torch.no_grad():
        for name, tensor in lm.named_parameters():
            clone.get_parameter(name).copy_(tensor)
        for name, tensor in lm.named_buffers():  # non-persistent ones too (rotary inv_freq)
            clone.get_buffer(name).copy_(tensor)
    return clone


class RolloutModel:
    """A decoding copy of the policy's language model and its Decoder (kept across steps)."""

    def __init__(self, lm, block_settings, env: DistEnv, *, compile_layers: bool = False):
        dtype = torch.bfloat16 if env.device.type == "cuda" else torch.float32
        self.lm = device_copy(lm, env.device, dtype).eval()
        for p in self.lm.parameters():
            p.requires_grad_(False)
        self.env = env
        self.decoder = Decoder(self.lm, block_settings, compile_layers=compile_layers)

    @torch.no_grad()
    def sync(self, policy) -> None:
        """Copy the policy's current weights in (a gather of every shard under FSDP)."""
        if self.env.distributed:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            state = get_model_state_dict(policy, options=StateDictOptions(full_state_dict=True))
            source = {k.removeprefix("lm."): v for k, v in state.items()}
        else:
            source = dict(policy.lm.named_parameters())
        for name, param in self.lm.named_parameters():
            param.copy_(source[name])


@dataclass
class RolloutTimes:
    generate_s: float = 0.0
    score_s: float = 0.0  # scoring's span: the first chunk sent to the last reward in
    score_wait_s: float = 0.0  # time the step waited for scoring after the last chunk decoded
    overlap_s: float = 0.0  # time in `on_scored`: work done while later chunks still scored
    tokens: int = 0


def _rollouts_of(result, chunk, prompt_ids, group_ids, tokenizer) -> list[Rollout]:
    out = []
    for gen, (task, ids, group) in zip(result.generations, zip(chunk, prompt_ids, group_ids)):
        text = tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        out.append(Rollout(task, group, list(ids), gen.trace_ids, gen.trace_steps, text,
                           len(gen.token_ids), gen.stopped, code_from_text(text, "first", normalise=False)))
    return out


def roll_out(model: RolloutModel, groups: list[tuple[Task, list[int]]], *, group_size: int,
             groups_per_call: int, cfg: DecodeSettings, tokenizer, reward: Reward, seed: int,
             scorer: ThreadPoolExecutor, on_scored=None) -> tuple[list[Rollout], RolloutTimes]:
    """`group_size` rollouts of each (task, prompt ids); returns them with rewards set, in
    group order. Chunks of `groups_per_call` groups decode in one Decoder call; each chunk
    goes to scoring as soon as it is decoded: a reward with `submit` (KernelReward) starts
    its builds at once and returns a future, so chunks never wait on each other's builds;
    a plain callable runs in the `scorer` thread, one chunk after another.
    `on_scored(rollouts)`, if given, gets each chunk's rollouts in this thread once their
    rewards are in (chunks already scored first, then as they finish), while later chunks
    may still score: work that needs one chunk's rewards but not the others' overlaps the
    wait (rl.py: the kept groups' old log-probabilities). Its time is `overlap_s`, not waiting."""
    times = RolloutTimes()
    pending = []
    finished: list[float] = []
    first_sent = None
    for c, start in enumerate(range(0, len(groups), groups_per_call)):
        chunk = groups[start : start + groups_per_call]
        tasks = [task for task, _ in chunk for _ in range(group_size)]
        prompts = [ids for _, ids in chunk for _ in range(group_size)]
        group_ids = [start + g for g in range(len(chunk)) for _ in range(group_size)]
        t0 = time.perf_counter()
        result = model.decoder.generate(prompts, DecodeSettings(**{**cfg.__dict__, "seed": stable_seed(seed, c)}))
        times.generate_s += time.perf_counter() - t0
        rollouts = _rollouts_of(result, tasks, prompts, group_ids, tokenizer)
        times.tokens += sum(len(r.token_ids) for r in rollouts)
        first_sent = time.perf_counter() if first_sent is None else first_sent
        submit = getattr(reward, "submit", None)
        future = submit(rollouts) if submit is not None else scorer.submit(_checked, reward, rollouts)
        future.add_done_callback(lambda _f: finished.append(time.perf_counter()))
        pending.append((rollouts, future))
    t0 = time.perf_counter()
    by_future = {future: rollouts for rollouts, future in pending}
    for future in as_completed(by_future):
        rollouts = by_future[future]
        rewards = future.result()
        if len(rewards) != len(rollouts):
            raise ValueError(f"the reward returned {len(rewards)} values for {len(rollouts)} rollouts")
        for r, value in zip(rollouts, rewards):
            r.reward = float(value)
        if on_scored is not None:
            t1 = time.perf_counter()
            on_scored(rollouts)
            times.overlap_s += time.perf_counter() - t1
    out = [r for rollouts, _future in pending for r in rollouts]
    end = time.perf_counter()
    times.score_wait_s = end - t0 - times.overlap_s
    if first_sent is not None:  # (a done-callback may run just after result() returns)
        times.score_s = (max(finished) if len(finished) == len(pending) else end) - first_sent
    return out, times


def _checked(reward: Reward, rollouts):
    return reward(rollouts)
