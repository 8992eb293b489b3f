"""What a rank of a data-parallel RL job needs beside its FSDP2 learner shard (minite.rl.loop runs the
job; one process is the same loop with world size 1):

- `Ranks`: this process's rank, the world size and the device, and the few collectives the loop takes
  its decisions with (rank 0 decides, every rank follows: `broadcast`, `gather`);
- the model on every rank from one read: rank 0 reads the checkpoint, the other ranks build it on the
  meta device, and the weights are broadcast shard by shard (`materialize`,
  `set_model_state_dict(broadcast_from_rank0=True)`), so a node holds one full copy in CPU memory, not N;
- the colocated vLLM engines and the bit-exact broadcast of a weight update to them.

vLLM under torchrun: vLLM's `distributed_executor_backend="external_launcher"` (the documented way to
run vLLM inside a torchrun job, and how TRL and verl colocate vLLM with a trainer). An in-process engine
cannot run on rank 0 alone: vLLM builds its groups with `torch.distributed.new_group` over the
default (learner's) process group, a collective every rank must join. So every rank builds one engine
in its own process (no extra processes, weight updates by reference) with
`tensor_parallel_size = rl.sampler.tensor_parallel_size` (tp): ranks r·tp .. r·tp+tp-1 form engine
replica r, and there are world/tp replicas (`rl.sampler.data_parallel_size`, if set, must equal
that). Each replica samples and evaluates its contiguous slice of the prompts. The engines' memory:
`rl.sampler.gpu_memory_utilization` (vLLM's: the fraction of the GPU, or on CPU of the node's memory,
per engine); unset, minite.engines.vllm.memory derives it from the device and the engines sharing it
(`memory_kwargs`: a GPU per rank beside its learner shard; on CPU the node's local ranks, times the
engine jobs at once), and VLLM_CPU_KVCACHE_SPACE, if set, wins on CPU.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from minite.configuration import ConfigError


@dataclass(frozen=True)
class Ranks:
    """This process in the job: `rank` of `world` on `device`, in a process group (`minite train-dist`,
    torchrun) or not (`minite train`: one process, every collective the identity). A group of one rank
    is still data parallel: FSDP2 learner, sharded checkpoints, so its job can resume on any number of
    ranks."""

    rank: int = 0
    world: int = 1
    device: torch.device | None = None
    in_group: bool = False

    @property
    def data_parallel(self) -> bool:
        return self.in_group

    @property
    def lead(self) -> bool:
        """Rank 0: the one that scores rewards and writes metrics, summaries and events."""
        return self.rank == 0

    @classmethod
    def current(cls) -> Ranks:
        """The job this process is in: the initialized process group's, else one process."""
        if not (dist.is_available() and dist.is_initialized()):
            return cls()
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
        return cls(dist.get_rank(), dist.get_world_size(), device or torch.device("cpu"), in_group=True)

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if not self.data_parallel:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's `obj`, in rank order, on rank 0 (None elsewhere)."""
        if not self.data_parallel:
            return [obj]
        parts = [None] * self.world if self.lead else None
        dist.gather_object(obj, parts, dst=0)
        return parts

    def barrier(self) -> None:
        if self.data_parallel:
            dist.barrier()


def init_distributed() -> tuple[int, int, torch.device]:
    """init_process_group from torchrun's environment: NCCL + one GPU per rank on CUDA, else gloo."""
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if dist.get_backend() == "nccl":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    return dist.get_rank(), dist.get_world_size(), device


def materialize(model, full: dict[str, torch.Tensor], device: torch.device) -> None:
    """Give a sharded (meta or CPU) model its device storage and rank 0's weights."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if any(p.is_meta for p in model.parameters()):
        model.to_empty(device=device)
        rotary = model.model.rotary_emb  # non-persistent buffers: rebuild them from the config
        fresh = type(rotary)(model.config)
        for name, buf in fresh.named_buffers():
            setattr(rotary, name, buf.to(device))
    else:
        model.to(device)
    left = [n for n, b in model.named_buffers() if b.is_meta]
    if left:
        raise RuntimeError(f"buffers left on the meta device: {left[:3]}")
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full, options=opts)


def vllm_layout(sampler_cfg, world: int) -> tuple[int, int]:
    """(tensor_parallel_size, replicas) of the vLLM engines of a train-dist job of `world` ranks."""
    tp = sampler_cfg.tensor_parallel_size
    if world % tp:
        raise ConfigError(
            f"train-dist: rl.sampler.tensor_parallel_size {tp} does not divide the {world} ranks (every rank "
            "runs a shard of one vLLM engine)"
        )
    replicas = world // tp
    if sampler_cfg.data_parallel_size not in (1, replicas):
        raise ConfigError(
            f"train-dist: rl.sampler.data_parallel_size {sampler_cfg.data_parallel_size} != {world} ranks / "
            f"tensor_parallel_size {tp} = {replicas}: under torchrun every rank is in one engine replica; "
            f"set data_parallel_size to {replicas} or leave it at 1"
        )
    return tp, replicas


def split(n: int, parts: int, part: int) -> slice:
    """Contiguous slice `part` of n items cut into `parts` (sizes differ by at most one)."""
    base, extra = divmod(n, parts)
    lo = part * base + min(part, extra)
    return slice(lo, lo + base + (part < extra))


def memory_kwargs(sampler_cfg, local_world: int) -> dict[str, Any]:
    """How one rank's engine sizes its memory (minite.engines.vllm.memory): the config's
    `rl.sampler.gpu_memory_utilization` when set, else from the engines that share its device: one
    per GPU (each rank has its own), `local_world` on a CPU node, times the engine jobs that run at
    once (MINITE_VLLM_ENGINES); every engine sits beside its rank's learner shard."""
    from minite.engines.vllm.memory import engines_at_once

    cuda = torch.cuda.is_available()
    out: dict[str, Any] = {
        "learner_on_device": cuda,
        "engines": (1 if cuda else local_world) * engines_at_once(),
    }
    if sampler_cfg.gpu_memory_utilization is not None:
        out["gpu_memory_utilization"] = sampler_cfg.gpu_memory_utilization
    return out


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def broadcast_update(update, *, src: int = 0, bucket_bytes: int = 256 << 20):
    """The WeightUpdate of rank `src` on every rank (a collective). Tensors travel as raw bytes
    (any dtype, FP8 scales and packed FP4 included) in buckets of at most `bucket_bytes` (one tensor
    larger than that goes alone), so the copies are bit-exact."""
    from minite.distributed.fsdp_trainer import comm_device
    from minite.engines.base import WeightUpdate

    me = dist.get_rank()
    meta = None
    if me == src:
        meta = (update.version, [(n, t.dtype, tuple(t.shape)) for n, t in update.tensors.items()])
    box = [meta]
    dist.broadcast_object_list(box, src=src)
    version, meta = box[0]
    dev = comm_device()

    def nbytes(entry) -> int:
        _, dtype, shape = entry
        n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        return -(-n // 16) * 16  # 16-byte aligned offsets: every dtype view is legal

    out: dict[str, torch.Tensor] = {}
    i = 0
    while i < len(meta):
        j, size = i + 1, nbytes(meta[i])
        while j < len(meta) and size + nbytes(meta[j]) <= bucket_bytes:
            size += nbytes(meta[j])
            j += 1
        buf = torch.zeros(size, dtype=torch.uint8, device=dev)
        if me == src:
            off = 0
            for entry in meta[i:j]:
                b = _as_bytes(update.tensors[entry[0]])
                buf[off : off + b.numel()].copy_(b)
                off += nbytes(entry)
        dist.broadcast(buf, src=src)
        if me != src:
            host, off = buf.cpu(), 0
            for name, dtype, shape in meta[i:j]:
                n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
                out[name] = host[off : off + n].view(dtype).reshape(shape)
                off += nbytes((name, dtype, shape))
        i = j
    return update if me == src else WeightUpdate(out, version)
