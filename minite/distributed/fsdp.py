"""FSDP2 (`torch.distributed.fsdp.fully_shard`) for a Qwen3-MoE with miniTE numerics applied.

Layout: every decoder layer is one FSDP unit and the root (embeddings, final norm, lm_head) another,
the standard transformer wrapping. The fp32 master weights are sharded (dim 0, one slice per rank);
`MixedPrecisionPolicy(param_dtype=bf16)` casts each shard to bf16 *before* the all-gather, so inside a
layer's forward every module sees whole bf16 parameters: exactly the bf16 copies `p.to(bf16)` that the
single-process trainer's forward runs on (minite.engines.trainer.forward), bit for bit. Hence:

- quantized modules (QuantLinear / QuantExperts) quantize whole weights; a per-tensor weight amax is
  the amax of the full weight and needs no reduction;
- per-tensor *activation/gradient* amaxes do (minite.nn.functional.amax_sync; the trainer turns it on);
- gradients come back in bf16 per rank, are cast to fp32 (`reduce_dtype`) and reduce-scattered as a
  plain SUM (no averaging): the loss is already normalized by the global token count
  (minite.distributed.fsdp_trainer), so the summed gradient is the one-process gradient of the global batch.

`reshard_after_forward=True` frees the gathered weights after each layer's forward and gathers them
again for the backward (ZeRO-3); False keeps them (ZeRO-2-like, more memory, less communication).
`activation_checkpointing=True` keeps only each decoder layer's input and recomputes the layer in the
backward (torch.distributed._composable.checkpoint: parameter names unchanged). The recompute repeats
the same forward numerics (forward quantization is round-to-nearest, the weight cache still holds the
step's weights; under amax_sync every rank recomputes, so the all-reduces stay matched).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from minite.nn.swap import decoder_layers


def device_type() -> str:
    return "cuda" if torch.cuda.is_available() and dist.get_backend() == "nccl" else "cpu"


def make_mesh(world_size: int | None = None):
    """A 1-D data-parallel DeviceMesh over the default process group."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type(), (world_size or dist.get_world_size(),), mesh_dim_names=("dp",))


def fsdp_modules(model: nn.Module) -> list[nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def shard_model(
    model: nn.Module,
    *,
    mesh=None,
    param_dtype: torch.dtype | None = torch.bfloat16,
    reduce_dtype: torch.dtype = torch.float32,
    reshard_after_forward: bool = True,
    activation_checkpointing: bool = False,
) -> nn.Module:
    """fully_shard each decoder layer, then the root, in place. Apply the recipe's numerics first
    (the module swap must see plain parameters); build the optimizer after (FSDP replaces them)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if param_dtype == torch.float32:
        param_dtype = None  # no cast: the masters themselves
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    mesh = mesh if mesh is not None else make_mesh()
    for layer in decoder_layers(model):
        if activation_checkpointing:
            from torch.distributed._composable import checkpoint

            checkpoint(layer)
        fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    for m in fsdp_modules(model):
        # SUM, not AVG: the loss carries the global normalization (and gloo has no AVG/PREMUL_SUM)
        m.set_gradient_divide_factor(1.0)
        m.set_force_sum_reduction_for_comms(True)
    return model


def full_state_dict(model: nn.Module, *, rank0_only: bool = True) -> dict[str, torch.Tensor]:
    """Whole (unsharded) fp32 master weights on CPU; an empty dict on other ranks when `rank0_only`.
    A collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True, broadcast_from_rank0=False)
    sd = get_model_state_dict(model, options=opts)
    if rank0_only and dist.get_rank() != 0:
        return {}
    return sd
