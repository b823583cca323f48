"""Process groups, FSDP, compile and activation checkpointing, applied from outside the
model (torchtitan style): the model code knows nothing about how many GPUs there are.

Launch several processes with `torchrun --nproc_per_node N -m dicepipe.cli sft ...` (or
`accelerate launch`); a single plain process needs no process group. A process torchrun
started is a rank even when it is the only one (`--launch torchrun`, params.yaml
`scales.<s>.launch: torchrun`): it starts a process group of one and shards with FSDP, the
real scales' path, at one GPU.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

from .launch import under_torchrun

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    group: bool = False  # a process group is started (torchrun's ranks, one or several)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """Ranks of a process group, sharded with FSDP (even one rank under torchrun)."""
        return self.group or self.world_size > 1


def pick_device(preference: str) -> torch.device:
    if preference == "cuda" or (preference == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def init_distributed(device_preference: str = "auto") -> DistEnv:
    """Read torchrun's environment; start the process group when there are several ranks."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(device_preference)
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    group = world > 1 or under_torchrun()
    if group and not torch.distributed.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        torch.distributed.init_process_group(backend=backend, device_id=device if device.type == "cuda" else None)
    return DistEnv(rank, world, local_rank, device, group)


def parallelize(model, env: DistEnv, *, compile_layers: bool, activation_checkpointing: bool,
                bf16: bool) -> None:
    """Per decoder layer: checkpointing, compile, FSDP shard; then the root (embeddings,
    final norm, output layer) as its own FSDP unit."""
    lm = model.lm
    if activation_checkpointing:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    layers = lm.model.layers
    if compile_layers:
        for layer in layers:
            layer.compile(dynamic=False)
    if env.distributed:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None,
                                      reduce_dtype=torch.float32)
        for layer in layers:
            fully_shard(layer, mp_policy=policy)
        fully_shard(model, mp_policy=policy)


def all_reduce_mean(value: torch.Tensor, env: DistEnv) -> torch.Tensor:
    if env.distributed:
        torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.SUM)
        value = value / env.world_size
    return value


def all_reduce_sum(value: torch.Tensor, env: DistEnv) -> torch.Tensor:
    if env.distributed:
        torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.SUM)
    return value


def barrier(env: DistEnv) -> None:
    if env.distributed:
        torch.distributed.barrier()
