"""The layer methods of the `minite` vLLM quantization method: NVFP4 linears, MoE experts, fp32 router.

Why these shapes and names:
- A quantized linear holds exactly what crosses from the trainer (minite/engines/base.py,
  `WeightUpdate`): `qweight` uint8 (N, K/2), `weight_scale` float8_e4m3fn (N, K/16) and the encode
  global scale. vLLM fuses q/k/v (and gate/up) into one layer while the trainer quantizes each HF
  tensor with its own per-tensor scale, so the global scale is stored per output row,
  `weight_global_scale` float32 (N, 1): every shard keeps its own scale and the stored bytes stay
  bit-identical to what was sent. `nvfp4_matmul_ref` applies a per-row weight scale as the outer
  product it is, so a fused GEMM computes the same dot products as the separate ones.
- A high-precision `<module>.weight` is cast to the model dtype and quantized on load with
  `numerics.fprop_weight`: for the `te_nvfp4` sampler one HF tensor at a time, which is what deploying
  a re-exported checkpoint does (1x16, vLLM flavor; = minite.engines.weight_sync re-export); for the
  `minite` sampler (weight_source "trainer") exactly what the trainer's forward uses for the same
  weights (minite.nn: q/k/v/o one tensor each, an expert's gate and up as one fused tensor). The
  `weight` parameter itself is an empty placeholder that only routes the tensor to the quantizer: no
  bf16 copy is kept.
- Forward: the activation is quantized with `numerics.fprop_act` (`minite.numerics.quantize`: per-row
  scale for `minite`, per-tensor vLLM flavor for `te_nvfp4`) and multiplied with
  `minite.numerics.nvfp4_matmul_ref` (output in the activation dtype), the GEMM minite.nn's quantized
  linears run; on CUDA both go to minite's Triton kernels (`minite.numerics.dispatch`).
- MoE experts run the same linear math per expert in a plain loop (ascending expert ids, silu(gate)*up
  in the model dtype) with the trainer's semantics: for quantized blocks those of minite.nn
  `QuantExperts` (expert output times its routing weight cast to the activation dtype, summed in fp32,
  one cast at the end), for bf16 blocks those of transformers' `Qwen3MoeExperts`, which the trainer
  keeps there (product in the routing weight's dtype, cast, summed in the model dtype). With a
  per-tensor activation scope an expert's GEMM quantizes its own input rows as one tensor.
- Routing: vLLM's router, unless the recipe asks for fp32 routing or deterministic top-k; then the
  method is "monolithic" (it receives the router logits) and routes like transformers' Qwen3-MoE
  router in fp32 (softmax over all experts, top-k, renormalize), with a stable sort so tied experts
  go to the lowest id. That routing also applies to MoE layers of bf16 blocks (experts unquantized).
- The router gate stays high precision; with `fp32_router` its weight is held in fp32 and its logits
  computed in fp32 (`Fp32RouterLinearMethod`).

Weight updates go through vLLM's layerwise reload (`reload_weights`), which restores each layer's
parameters as created here, replays the weight loaders and re-runs `process_weights_after_loading`.
The loaders therefore also run on meta tensors (vLLM counts the loaded elements that way); the
quantize-on-load path does nothing there.

Tensor parallelism is not supported (tp_size must be 1): the loaders address rows of the local
parameter directly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn import Parameter
from vllm.model_executor.layers.fused_moe import FusedMoEMethodBase
from vllm.model_executor.layers.linear import (
    LinearMethodBase,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    UnquantizedLinearMethod,
)
from vllm.model_executor.utils import set_weight_attrs

from minite.nn.linear import linear_invariant
from minite.nn.moe_routing import route_topk, router_logits_fp32
from minite.numerics import BLOCK, NVFP4Tensor, dispatch, nvfp4_matmul_ref, quantize
from minite.numerics.constants import E4M3_DTYPE
from minite.recipes import NumericsSpec

_PACKED_KINDS = ("qweight", "weight_scale", "weight_global_scale")


def _packed_params(rows: int, k: int, lead: tuple[int, ...] = ()) -> dict[str, Parameter]:
    """Empty NVFP4 storage for a (rows, k) weight (per expert when lead=(E,)). The global scale starts
    as NaN so a row that was never loaded is caught in process_weights_after_loading."""
    if k % BLOCK:
        raise ValueError(f"minite NVFP4: reduction dim {k} is not a multiple of {BLOCK}")
    return {
        "qweight": Parameter(torch.empty(*lead, rows, k // 2, dtype=torch.uint8), requires_grad=False),
        "weight_scale": Parameter(
            torch.empty(*lead, rows, k // BLOCK, dtype=E4M3_DTYPE), requires_grad=False
        ),
        "weight_global_scale": Parameter(
            torch.full((*lead, rows, 1), float("nan"), dtype=torch.float32), requires_grad=False
        ),
    }


def _placeholder(rows: int, dtype: torch.dtype) -> Parameter:
    """The empty `weight` parameter that routes a high-precision tensor to the quantizer.

    vLLM's layerwise reload decides that a layer got weights by counting the elements its loaders copy
    on meta tensors (capped at the parameter's `weight_loader_numel`). Quantizing there is pointless, so
    the loader copies one meta element instead (`_count_placeholder_load`) and the placeholder declares
    one loadable element: the layer is then seen as loaded and processed at the end of the reload."""
    p = Parameter(torch.empty(rows, 0, dtype=dtype), requires_grad=False)
    p.weight_loader_numel = 1
    return p


def _count_placeholder_load() -> None:
    torch.empty(1, device="meta").copy_(torch.empty(1, device="meta"))


def _check_loaded(name: str, global_scale: torch.Tensor) -> None:
    if global_scale.is_meta:
        return
    bad = ~(torch.isfinite(global_scale) & (global_scale > 0))
    if bool(bad.any()):
        raise RuntimeError(
            f"minite: {name}: {int(bad.sum())} output row(s) have no NVFP4 weights (never loaded, or a "
            "non-positive/non-finite weight_global_scale); send <module>.weight or the packed triple "
            "(.qweight, .weight_scale, .weight_global_scale) for every module"
        )


def _copy_packed(dst: torch.Tensor, src: torch.Tensor, kind: str, where: str) -> None:
    """Copy one shard of packed data bit for bit; dtypes must match exactly (no silent conversion)."""
    if kind == "weight_global_scale":
        if src.dtype != torch.float32:
            raise TypeError(
                f"{where}: weight_global_scale must be float32 (the encode scale), got {src.dtype}"
            )
        if src.numel() == 1:
            src = src.reshape(1, 1).expand(dst.shape)
        else:
            src = src.reshape(dst.shape)  # per-row scales, one per output row
    elif kind == "weight_scale" and src.dtype == torch.uint8:
        src = src.view(E4M3_DTYPE)  # raw E4M3 bytes
    expected = torch.uint8 if kind == "qweight" else E4M3_DTYPE if kind == "weight_scale" else torch.float32
    if src.dtype != expected:
        raise TypeError(f"{where}: {kind} must be {expected}, got {src.dtype}")
    if tuple(src.shape) != tuple(dst.shape):
        raise ValueError(f"{where}: {kind} has shape {tuple(src.shape)}, expected {tuple(dst.shape)}")
    dst.copy_(src)


def _write_quantized(
    dst: dict[str, torch.Tensor],
    w: torch.Tensor,
    spec,
    where: str,
    expected_shape: tuple[int, int],
    dtype: torch.dtype,
) -> None:
    """Quantize a high-precision (rows, K) weight with `spec` into row slices of the packed params.
    The weight is first cast to the model dtype: a re-export quantizes the bf16 checkpoint, and the
    trainer quantizes the bf16 copies its forward runs on (minite.nn `compute_dtype`)."""
    if tuple(w.shape) != expected_shape:
        raise ValueError(f"{where}: weight has shape {tuple(w.shape)}, expected {expected_shape}")
    w = w.to(device=dst["qweight"].device, dtype=dtype)
    quant = dispatch.quantize if dispatch.use_kernels(w) else quantize  # same bytes either way
    q = quant(w, spec, name=where, check_finite=True)
    dst["qweight"].copy_(q.qdata)
    dst["weight_scale"].copy_(q.scale)
    dst["weight_global_scale"].copy_(
        q.global_scale.float().reshape(-1, 1).expand(dst["weight_global_scale"].shape)
    )


def _nvfp4_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    weight_scale: torch.Tensor,
    global_scale: torch.Tensor,
    numerics: NumericsSpec,
    name: str,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """y = x Wᵀ as the recipe's W4A4 GEMM: quantize x with fprop_act, then nvfp4_matmul_ref."""
    n = qweight.shape[0]
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if x2.shape[0] == 0:
        return x.new_empty(*lead, n)
    w = NVFP4Tensor(qweight, weight_scale, global_scale, numerics.fprop_weight)
    if dispatch.use_kernels(x2, qweight):  # the Triton kernels: same bytes, fp32-summation-order GEMM
        a = dispatch.quantize(x2, numerics.fprop_act, name=name)
        return dispatch.matmul(a, w, out_dtype=x.dtype, bias=bias).reshape(*lead, n)
    a = quantize(x2, numerics.fprop_act, name=name)
    return nvfp4_matmul_ref(a, w, out_dtype=x.dtype, bias=bias).reshape(*lead, n)


# --- linear layers -------------------------------------------------------------------------------------


def _shard_ids(layer: torch.nn.Module, count: int) -> list:
    if isinstance(layer, QKVParallelLinear):
        return ["q", "k", "v"][:count]
    if isinstance(layer, MergedColumnParallelLinear):
        return list(range(count))
    return [None]


class MiniteLinearMethod(LinearMethodBase):
    """NVFP4 W4A4 linear executing the recipe's numerics in pure torch (see module docstring)."""

    # The packed parameters can be filled by quantizing `.weight` at load time (like vLLM's online
    # quantization methods), so vLLM must not insist that each of them appears in the checkpoint by
    # name; process_weights_after_loading checks instead that every row was loaded.
    uses_meta_device = True

    def __init__(self, numerics: NumericsSpec, prefix: str) -> None:
        super().__init__()
        self.numerics = numerics
        self.prefix = prefix

    def create_weights(
        self,
        layer: torch.nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs,
    ) -> None:
        if getattr(layer, "tp_size", 1) != 1:
            raise NotImplementedError(
                f"minite quantization: {self.prefix}: tensor parallelism is not supported"
            )
        k = input_size_per_partition
        n = sum(output_partition_sizes)
        offsets, off = {}, 0
        for sid, size in zip(
            _shard_ids(layer, len(output_partition_sizes)), output_partition_sizes, strict=False
        ):
            offsets[sid] = (off, size)
            off += size
        offsets[None] = (0, n)  # a tensor already fused on disk
        layer.minite_shards = offsets
        params = _packed_params(n, k)
        params["weight"] = _placeholder(n, params_dtype)
        for name, p in params.items():
            layer.register_parameter(name, p)
            set_weight_attrs(p, {"weight_loader": self._loader(layer, name, k, params_dtype)})

    def _loader(self, layer: torch.nn.Module, kind: str, k: int, dtype: torch.dtype) -> Callable:
        prefix, numerics = self.prefix, self.numerics

        def weight_loader(param: torch.Tensor, loaded_weight: torch.Tensor, loaded_shard_id=None) -> None:
            off, size = layer.minite_shards[loaded_shard_id]
            where = prefix if loaded_shard_id is None else f"{prefix}[{loaded_shard_id}]"
            if kind == "weight":
                if param.is_meta:
                    _count_placeholder_load()
                    return
                dst = {name: getattr(layer, name).data.narrow(0, off, size) for name in _PACKED_KINDS}
                _write_quantized(dst, loaded_weight, numerics.fprop_weight, where, (size, k), dtype)
                return
            _copy_packed(param.data.narrow(0, off, size), loaded_weight, kind, where)

        return weight_loader

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        _check_loaded(self.prefix, layer.weight_global_scale)

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return _nvfp4_linear(
            x, layer.qweight, layer.weight_scale, layer.weight_global_scale, self.numerics, self.prefix, bias
        )


class Fp32RouterLinearMethod(UnquantizedLinearMethod):
    """MoE router gate with an fp32 weight and fp32 logits (`NumericsSpec.fp32_router`).

    The weight is stored in fp32 whatever the model dtype (the trainer's master may be fp32), and vLLM's
    CPU repacking of unquantized weights is skipped so the logits are
    `minite.nn.moe_routing.router_logits_fp32`
    (the trainer's: a plain fp32 `F.linear` on CPU, the batch-invariant kernel on CUDA)."""

    def create_weights(
        self,
        layer: torch.nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs,
    ) -> None:
        super().create_weights(
            layer,
            input_size_per_partition,
            output_partition_sizes,
            input_size,
            output_size,
            torch.float32,
            **extra_weight_attrs,
        )

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        return

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        logits = router_logits_fp32(x, layer.weight)  # the trainer's router: the same bits at any batch
        return logits if bias is None else logits + bias.float()


class InvariantLinearMethod(UnquantizedLinearMethod):
    """A linear the recipe keeps in bf16 under `NumericsSpec.bf16_linears: invariant`: the trainer's
    `minite.nn.linear.linear_invariant` (the batch-invariant kernel on CUDA, F.linear on CPU). vLLM's
    merged projections (qkv_proj) give each output the same dot product as the trainer's separate ones:
    the kernel's bits do not depend on the tile nor on the column's position. vLLM's CPU repacking of
    unquantized weights is skipped so the weight stays the plain (N, K) tensor both paths read."""

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        return

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return linear_invariant(x, layer.weight, bias)


# --- MoE experts ---------------------------------------------------------------------------------------


class MiniteMoEMethod(FusedMoEMethodBase):
    """Routed experts in a per-expert torch loop: NVFP4 W4A4 GEMMs (quantized=True) or plain GEMMs in
    the model dtype (quantized=False: a bf16 block whose routing the recipe still controls)."""

    def __init__(self, moe, numerics: NumericsSpec, prefix: str, *, quantized: bool) -> None:
        super().__init__(moe)
        self.numerics = numerics
        self.prefix = prefix
        self.quantized = quantized
        self.uses_meta_device = quantized  # see MiniteLinearMethod
        self._own_routing = numerics.fp32_router or numerics.deterministic_topk

    @property
    def is_monolithic(self) -> bool:
        return self._own_routing

    def create_weights(
        self,
        layer: torch.nn.Module,
        num_experts: int,
        hidden_size: int,
        intermediate_size_per_partition: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs,
    ) -> None:
        if self.moe.moe_parallel_config.use_ep or self.moe.moe_parallel_config.tp_size != 1:
            raise NotImplementedError(f"minite quantization: {self.prefix}: expert/tensor parallelism")
        if not self.moe.is_act_and_mul or self.moe.has_bias:
            raise NotImplementedError(f"minite quantization: {self.prefix}: only gated experts without bias")
        e, h, i = num_experts, hidden_size, intermediate_size_per_partition
        self.hidden, self.intermediate = h, i
        if not self.quantized:
            for name, shape in (("w13_weight", (e, 2 * i, h)), ("w2_weight", (e, h, i))):
                p = Parameter(torch.empty(*shape, dtype=params_dtype), requires_grad=False)
                layer.register_parameter(name, p)
                set_weight_attrs(p, extra_weight_attrs)  # vLLM's own expert loader
            return
        layer.minite_pending_gate_up = {}  # expert -> {"w1"|"w3": weight} until both halves arrived
        for stem, rows, k in (("w13", 2 * i, h), ("w2", h, i)):
            params = _packed_params(rows, k, lead=(e,))
            params["weight"] = _placeholder(e, params_dtype)
            for kind, p in params.items():
                layer.register_parameter(f"{stem}_{kind}", p)
                set_weight_attrs(p, {"weight_loader": self._loader(layer, stem, kind, k, params_dtype)})

    def _loader(self, layer: torch.nn.Module, stem: str, kind: str, k: int, dtype: torch.dtype) -> Callable:
        prefix, numerics, h, i = self.prefix, self.numerics, self.hidden, self.intermediate
        proj = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
        # With the trainer's weights (weight_source "trainer") gate and up of an expert are quantized as
        # one tensor, as minite.nn QuantExperts does (one global scale for the fused gate_up); a
        # re-export quantizes every HF tensor on its own.
        joint_gate_up = numerics.weight_source == "trainer"

        def weight_loader(
            param: torch.Tensor,
            loaded_weight: torch.Tensor,
            weight_name: str,
            shard_id: str,
            expert_id: int,
            return_success: bool = False,
        ) -> bool | None:
            local = layer._map_global_expert_id_to_local_expert_id(expert_id)
            if local == -1:
                return False if return_success else None
            if shard_id not in proj:
                raise ValueError(f"{prefix}: unknown expert shard {shard_id!r}")
            off, size = {"w1": (0, i), "w3": (i, i), "w2": (0, h)}[shard_id]
            where = f"{prefix}.{expert_id}.{proj[shard_id]}"
            if kind == "weight":
                if param.is_meta:
                    _count_placeholder_load()
                    return True if return_success else None
                if joint_gate_up and shard_id in ("w1", "w3"):
                    halves = layer.minite_pending_gate_up.setdefault(local, {})
                    halves[shard_id] = loaded_weight
                    if len(halves) < 2:
                        return True if return_success else None
                    del layer.minite_pending_gate_up[local]
                    loaded_weight = torch.cat((halves["w1"].to(dtype), halves["w3"].to(dtype)))
                    off, size, where = 0, 2 * i, f"{prefix}.{expert_id}.gate_up_proj"
                dst = {
                    name: getattr(layer, f"{stem}_{name}").data[local].narrow(0, off, size)
                    for name in _PACKED_KINDS
                }
                _write_quantized(dst, loaded_weight, numerics.fprop_weight, where, (size, k), dtype)
            else:
                _copy_packed(param.data[local].narrow(0, off, size), loaded_weight, kind, where)
            return True if return_success else None

        return weight_loader

    def get_fused_moe_quant_config(self, layer: torch.nn.Module):
        return None

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        if self.quantized:
            pending = sorted(layer.minite_pending_gate_up)
            layer.minite_pending_gate_up.clear()
            if pending:
                raise RuntimeError(
                    f"minite: {self.prefix}: experts {pending} got only one of gate_proj/up_proj"
                )
            _check_loaded(f"{self.prefix}.w13", layer.w13_weight_global_scale)
            _check_loaded(f"{self.prefix}.w2", layer.w2_weight_global_scale)

    # routing --------------------------------------------------------------------------------------------

    def route(self, layer: torch.nn.Module, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers' Qwen3-MoE routing in fp32; ties go to the lowest expert id when
        `deterministic_topk` (a stable descending sort keeps equal probabilities in id order)."""
        if layer.scoring_func != "softmax":
            raise NotImplementedError(f"{self.prefix}: scoring_func {layer.scoring_func!r}")
        # the function the trainer's AlignedRouter calls: on a GPU the same kernel, hence the same bits
        det = self.numerics.deterministic_topk
        return route_topk(router_logits.float(), layer.top_k, layer.renormalize, det)

    # execution ------------------------------------------------------------------------------------------

    def _expert_gemm(self, layer: torch.nn.Module, stem: str, e: int, x: torch.Tensor) -> torch.Tensor:
        if not self.quantized:
            return F.linear(x, getattr(layer, f"{stem}_weight")[e])
        return _nvfp4_linear(
            x,
            getattr(layer, f"{stem}_qweight")[e],
            getattr(layer, f"{stem}_weight_scale")[e],
            getattr(layer, f"{stem}_weight_global_scale")[e],
            self.numerics,
            f"{self.prefix}.{e}.{stem}",
        )

    def _run_experts(
        self, layer: torch.nn.Module, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        if layer.apply_router_weight_on_input:
            raise NotImplementedError(f"{self.prefix}: apply_router_weight_on_input")
        act = self.numerics.fprop_act
        groupable = act is not None and act.scope != "static" and act.block == "1x16"
        if (
            self.quantized
            and groupable
            and layer.expert_map is None
            and dispatch.use_kernels(x, layer.w13_qweight)
        ):
            # grouped kernels; they must keep the numerics of the loop below (for quantized blocks:
            # routing weight cast to the activation dtype, fp32 sum in expert order, one final cast)
            from minite.kernels.moe import vllm_experts_forward

            return vllm_experts_forward(
                x,
                topk_weights,
                topk_ids,
                NVFP4Tensor(
                    layer.w13_qweight,
                    layer.w13_weight_scale,
                    layer.w13_weight_global_scale,
                    self.numerics.fprop_weight,
                ),
                NVFP4Tensor(
                    layer.w2_qweight,
                    layer.w2_weight_scale,
                    layer.w2_weight_global_scale,
                    self.numerics.fprop_weight,
                ),
                self.numerics.fprop_act,
                self.intermediate,
            )
        # quantized blocks: minite.nn QuantExperts (routing weight cast to the activation dtype, fp32
        # sum); bf16 blocks: transformers' Qwen3MoeExperts (product in the routing weights' dtype, sum
        # in x's dtype)
        out = torch.zeros(x.shape, dtype=torch.float32 if self.quantized else x.dtype, device=x.device)
        ids = topk_ids.long()
        expert_map = layer.expert_map
        i = self.intermediate
        for e in torch.unique(ids).tolist():  # ascending expert id
            local = e if expert_map is None else int(expert_map[e])
            if local < 0:
                continue
            tok, slot = torch.where(ids == e)
            h = self._expert_gemm(layer, "w13", local, x[tok])
            a = F.silu(h[:, :i]) * h[:, i:]
            y = self._expert_gemm(layer, "w2", local, a)
            w = topk_weights[tok, slot, None]
            y = y * w.to(y.dtype) if self.quantized else y * w
            # = out.index_add_(0, tok, y.to(out.dtype)): a token meets each expert at most once, so
            # the indexed add rounds the same way (bf16 index_add_ is very slow on CPU)
            out[tok] = out[tok] + y.to(out.dtype)
        return out.to(x.dtype)

    def apply(
        self,
        layer: torch.nn.Module,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        shared_experts=None,
        shared_experts_input: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if shared_experts is not None:
            raise NotImplementedError(f"{self.prefix}: shared experts are not supported by minite MoE")
        return self._run_experts(layer, x, topk_weights, topk_ids)

    def apply_monolithic(
        self,
        layer: torch.nn.Module,
        x: torch.Tensor,
        router_logits: torch.Tensor,
        input_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        topk_weights, topk_ids = self.route(layer, router_logits)
        return self._run_experts(layer, x, topk_weights, topk_ids)
