"""Quantized linear as an autograd.Function: fprop, dgrad and wgrad each quantized as the recipe says.

    fprop  y  = x Wᵀ      operands x (M, K) and W (N, K), reduced over K
    dgrad  dx = dy W      operands dy (M, N) and Wᵀ (K, N), reduced over N
    wgrad  dW = dyᵀ x     operands dyᵀ (N, M) and xᵀ (K, M), reduced over M (tokens)

Every GEMM quantizes both operands along its reduction dim (NVFP4 blocks run along K of the MMA) and
calls the reference W4A4 GEMM (`nvfp4_matmul_ref`): exact e2m1·e4m3 products, an exact float64 sum
rounded once to fp32, decode scales in the epilogue. A None spec runs that operand in high precision.
The reference stays the spec.

Execution path (`LinearNumerics.gemm`, from the recipe's `NumericsSpec.gemm`), on CUDA tensors:
- "fused": the Triton kernels (minite.kernels via minite.numerics.dispatch): fused quantize, W4A4 GEMM;
- "emulated": what a Transformer Engine user runs on Hopper (no FP4 GEMM there): the torch reference
  quantizer, both operands dequantized to bf16 *without* their global scales (e2m1·e4m3 has at most 6
  significant bits, so these bf16 values are exact), a cuBLAS bf16 GEMM with fp32 accumulation and
  output, and the decode scales applied in fp32 afterwards, in the reference's order. (Folding s_dec
  into the bf16 operands instead would round every element: not the same numbers.)
Both accumulate in fp32, so they equal the reference up to fp32 summation order (the reference's own
float64 sum is exact and order-free). On CPU every path is the reference call itself (bit for bit);
`force_gemm_path` runs a given path on any device (tests).

Stochastic rounding draws come from a generator seeded per (layer seed, step, call), not from global
RNG state, so a resumed run repeats the same draws.

Data parallelism (`amax_sync`). A per-tensor global scale couples every token of the tensor: on a data
parallel rank it would be the amax of the rank's shard, not of the global batch. Inside
`with amax_sync(group):` the operands whose rows are tokens and whose blocks run along features (fprop
activation x, dgrad gradient dy) take the amax all-reduced (max) over `group` when their scope is
"tensor", so each rank quantizes its tokens exactly as one process would on the whole batch. Per-row
scopes need no communication (a token's scale is its own), and weights are whole on every rank under
FSDP (all-gathered before the forward), so their per-tensor amax is already global. The wgrad operands
run their blocks along the token dim: a rank quantizes its own tokens, as one process does per
micro-batch (gradient accumulation), and nothing is reduced.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from minite.numerics import (
    BLOCK,
    NVFP4Tensor,
    QuantSpec,
    apply_rht,
    dequantize,
    dispatch,
    nvfp4_matmul_ref,
    quantize,
)
from minite.numerics.formats import e2m1_decode, unpack_fp4
from minite.numerics.nvfp4 import decode_scale

GemmPath = Literal["fused", "emulated"]


@dataclass(frozen=True)
class LinearNumerics:
    """Operand specs of the three GEMMs of one linear layer (None: high precision)."""

    fprop_weight: QuantSpec | None = None
    fprop_act: QuantSpec | None = None
    dgrad_grad: QuantSpec | None = None
    dgrad_weight: QuantSpec | None = None
    wgrad_grad: QuantSpec | None = None
    wgrad_act: QuantSpec | None = None
    gemm: GemmPath = "fused"  # execution path on CUDA (module docstring); CPU: the reference

    @property
    def quantized(self) -> bool:
        return self.fprop_weight is not None or self.fprop_act is not None


# --- execution path -------------------------------------------------------------------------------------

_FORCED_PATH: str | None = None  # "reference" | "fused" | "emulated" while `force_gemm_path` is active


@contextlib.contextmanager
def force_gemm_path(path: str | None) -> Iterator[None]:
    """Run every quantized GEMM of this block on `path` ("reference", "emulated", "fused"; None: the
    numerics' own choice), on any device. For tests: on CPU the emulation runs its bf16-exact operands
    through an fp32 matmul (the same products and fp32 sums as cuBLAS's bf16 GEMM)."""
    global _FORCED_PATH
    if path not in (None, "reference", "emulated", "fused"):
        raise ValueError(f"force_gemm_path: unknown path {path!r}")
    prev, _FORCED_PATH = _FORCED_PATH, path
    try:
        yield
    finally:
        _FORCED_PATH = prev


def gemm_path(gemm: str, *tensors: torch.Tensor | None) -> str:
    """The path a GEMM runs: "fused" (Triton kernels), "emulated" (torch quantize + bf16 cuBLAS) or
    "reference" (pure torch; every CPU tensor)."""
    if _FORCED_PATH is not None:
        return _FORCED_PATH
    present = [t for t in tensors if t is not None]
    if not present or not all(t.is_cuda for t in present):
        return "reference"
    if gemm == "emulated":
        return "emulated"
    return "fused" if dispatch.use_kernels(*present) else "reference"


def quantize_operand(
    x: torch.Tensor,
    spec: QuantSpec,
    gemm: str = "fused",
    *,
    amax: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    name: str = "tensor",
) -> NVFP4Tensor:
    """Quantize on the path's quantizer: the fused kernel, or the torch reference (CPU, emulated).

    The emulation on CUDA draws its stochastic-rounding numbers on the GPU from a generator seeded like
    the given CPU one (a CPU generator cannot feed a CUDA tensor)."""
    if gemm_path(gemm, x) == "fused" and x.is_cuda:
        return dispatch.quantize(x, spec, amax=amax, generator=generator, name=name)
    if generator is not None and x.is_cuda and generator.device.type != "cuda":
        generator = torch.Generator(device=x.device).manual_seed(generator.initial_seed())
    return quantize(x, spec, amax=amax, generator=generator, name=name)


def dequantize_unscaled_bf16(t: NVFP4Tensor) -> torch.Tensor:
    """e2m1 · float(block scale) in bf16, without the global scale: exact (<= 6 significant bits;
    NaN block scales stay NaN). Not memoized (an emulating trainer decodes at every GEMM)."""
    vals = e2m1_decode(unpack_fp4(t.qdata))
    *lead, k = vals.shape
    scale = t.scale.float().unsqueeze(-1)
    return (vals.reshape(*lead, k // BLOCK, BLOCK) * scale).reshape(vals.shape).to(torch.bfloat16)


@functools.cache
def _mm_fp32_out(device_type: str) -> bool:
    """Does torch.mm(bf16, bf16, out_dtype=float32) (fp32 accumulation and output) run on this device?"""
    try:
        a = torch.ones(16, 16, dtype=torch.bfloat16, device=device_type)
        return torch.mm(a, a, out_dtype=torch.float32).dtype == torch.float32
    except (RuntimeError, TypeError, NotImplementedError):
        return False


def emulated_matmul(a: NVFP4Tensor, b: NVFP4Tensor) -> torch.Tensor:
    """A (M, K) @ B (N, K)ᵀ -> (M, N) float32 as an emulating trainer computes it: exact bf16 operands,
    one bf16 GEMM with fp32 accumulation and output (cuBLAS; an fp32 matmul of the same values where
    torch.mm has no fp32 output for bf16), then the decode scales as `nvfp4_matmul_ref` applies them."""
    a16, b16 = dequantize_unscaled_bf16(a), dequantize_unscaled_bf16(b)
    if a16.is_cuda and _mm_fp32_out(a16.device.type):
        acc = torch.mm(a16, b16.T, out_dtype=torch.float32)
    else:
        acc = a16.float() @ b16.float().T
    sa, sb = decode_scale(a), decode_scale(b)
    return acc * sa * sb.reshape(1, -1) if sb.ndim else acc * sa * sb


class SeedSource:
    """Deterministic per-call generators for stochastic rounding."""

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)
        self.step = 0
        self.calls = 0

    def set_step(self, step: int) -> None:
        self.step = int(step)
        self.calls = 0

    def next(self) -> torch.Generator:
        self.calls += 1
        g = torch.Generator()
        g.manual_seed((self.seed * 1_000_003 + self.step * 7919 + self.calls) % (2**63 - 1))
        return g


# --- data parallelism: per-tensor amax over the ranks (see the module docstring) -------------------

_AMAX_GROUP: object | None = None  # a torch.distributed ProcessGroup while `amax_sync` is active


@contextlib.contextmanager
def amax_sync(group) -> Iterator[None]:
    """All-reduce (max) per-tensor amaxes of token operands over `group` (None: off) in this block.

    Every rank must run the same sequence of quantized GEMMs (same layers, same experts) while it is
    on; `QuantExperts` loops over the union of the ranks' experts for that reason."""
    global _AMAX_GROUP
    prev, _AMAX_GROUP = _AMAX_GROUP, group
    try:
        yield
    finally:
        _AMAX_GROUP = prev


def amax_sync_group():
    return _AMAX_GROUP


def needs_amax_sync(numerics: LinearNumerics) -> bool:
    """Does a token operand (fprop activation, dgrad gradient) of these numerics use a per-tensor scale?"""
    return any(s is not None and s.scope == "tensor" for s in (numerics.fprop_act, numerics.dgrad_grad))


def _synced_amax(x: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """The amax `quantize` would take over x with scope "tensor", max-reduced over the sync group."""
    import torch.distributed as dist

    if x.numel():
        x32 = apply_rht(x.float(), spec.rht_signs) if spec.rht else x.float()
        amax = torch.where(torch.isfinite(x32), x32, torch.zeros_like(x32)).abs().amax()
    else:
        amax = torch.zeros((), dtype=torch.float32, device=x.device)
    dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=_AMAX_GROUP)
    return amax


def _q(
    x: torch.Tensor,
    spec: QuantSpec | None,
    seeds: SeedSource | None,
    name: str,
    *,
    token_rows: bool = False,
    gemm: str = "fused",
) -> NVFP4Tensor | None:
    """Quantize one GEMM operand. `token_rows`: x is (tokens, features), blocks along features: its
    per-tensor amax is all-reduced under `amax_sync`. Returns None for spec None or an empty x."""
    if spec is None:
        return None
    amax = None
    if token_rows and spec.scope == "tensor" and _AMAX_GROUP is not None:
        amax = _synced_amax(x, spec)  # collective: every rank calls it, also with no tokens
    if x.numel() == 0:
        return None
    gen = seeds.next() if spec.rounding == "stochastic" and seeds is not None else None
    if spec.rounding == "stochastic" and gen is None:
        gen = torch.Generator().manual_seed(0)
    qspec = spec if amax is None else dataclasses.replace(spec, scope="static")
    q = quantize_operand(x, qspec, gemm, amax=amax, generator=gen, name=name)
    q.spec = spec  # the same numbers as scope "tensor" over the global batch
    return q


def qmm(
    a: torch.Tensor,
    b: torch.Tensor,
    spec_a: QuantSpec | None,
    spec_b: QuantSpec | None,
    seeds: SeedSource | None = None,
    *,
    qa: NVFP4Tensor | None = None,
    qb: NVFP4Tensor | None = None,
    name: str = "gemm",
    a_token_rows: bool = False,
    gemm: str = "fused",
    out_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """a (M, K) @ b (N, K)ᵀ -> (M, N) in out_dtype (the float32 result, rounded once), each operand
    quantized along K per its spec.

    `a_token_rows`: a's rows are tokens (fprop x, dgrad dy), see `amax_sync`. `gemm`: the execution
    path on CUDA (module docstring). The fused kernels round to out_dtype in their epilogue (one launch
    fewer than a separate cast, the same bits)."""
    if qa is None:
        qa = _q(a, spec_a, seeds, f"{name}.a", token_rows=a_token_rows, gemm=gemm)
    if a.shape[0] == 0:  # no tokens on this rank (an expert under amax_sync): nothing to multiply
        return torch.zeros((0, b.shape[0]), dtype=out_dtype, device=a.device)
    qb = qb if qb is not None else _q(b, spec_b, seeds, f"{name}.b", gemm=gemm)
    if qa is not None and qb is not None:
        path = gemm_path(gemm, qa.qdata, qb.qdata)
        if path == "emulated":
            return emulated_matmul(qa, qb).to(out_dtype)
        if path == "fused" and dispatch.use_kernels(qa.qdata, qb.qdata):
            return dispatch.matmul(qa, qb, out_dtype)
        return nvfp4_matmul_ref(qa, qb, out_dtype=out_dtype)
    a_hp = dequantize(qa) if qa is not None else a.float()
    b_hp = dequantize(qb) if qb is not None else b.float()
    return (a_hp @ b_hp.T).to(out_dtype)


def _pad_rows(x: torch.Tensor, multiple: int = BLOCK) -> torch.Tensor:
    """Zero-pad dim 0 to a multiple of `multiple` (zeros change neither a sum nor an amax)."""
    pad = (-x.shape[0]) % multiple
    return F.pad(x, (0, 0, 0, pad)) if pad else x


class QuantLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, qweight, numerics, seeds, out_dtype, name):  # noqa: D102
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])
        y = qmm(
            x2,
            weight,
            numerics.fprop_act,
            numerics.fprop_weight,
            seeds,
            qb=qweight,
            name=f"{name}.fprop",
            a_token_rows=True,
            gemm=numerics.gemm,
            out_dtype=out_dtype if bias is None else torch.float32,
        )
        if bias is not None:
            y = (y + bias.float()).to(out_dtype)
        ctx.save_for_backward(x2, weight)
        ctx.numerics, ctx.seeds, ctx.name = numerics, seeds, name
        ctx.has_bias, ctx.x_dtype, ctx.lead = bias is not None, x.dtype, lead
        return y.reshape(*lead, weight.shape[0])

    @staticmethod
    def backward(ctx, dy):  # noqa: D102
        x2, weight = ctx.saved_tensors
        n = ctx.numerics
        dy2 = dy.reshape(-1, dy.shape[-1]).float()
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = qmm(
                dy2,
                weight.T.contiguous(),
                n.dgrad_grad,
                n.dgrad_weight,
                ctx.seeds,
                name=f"{ctx.name}.dgrad",
                a_token_rows=True,
                gemm=n.gemm,
            )
            dx = dx.to(ctx.x_dtype).reshape(*ctx.lead, weight.shape[1])
        if ctx.needs_input_grad[1] and x2.shape[0] == 0:
            dw = torch.zeros_like(weight)
        elif ctx.needs_input_grad[1]:
            dw = qmm(
                _pad_rows(dy2).T.contiguous(),
                _pad_rows(x2.float()).T.contiguous(),
                n.wgrad_grad,
                n.wgrad_act,
                ctx.seeds,
                name=f"{ctx.name}.wgrad",
                gemm=n.gemm,
            ).to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy2.sum(0)
        return dx, dw, db, None, None, None, None, None


def quant_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    numerics: LinearNumerics,
    *,
    qweight: NVFP4Tensor | None = None,
    seeds: SeedSource | None = None,
    name: str = "linear",
) -> torch.Tensor:
    """y = x Wᵀ (+ b) with the recipe's numerics. Output dtype: the autocast dtype when CPU/CUDA
    autocast is on (as nn.Linear would give), else x's dtype."""
    dev = x.device.type
    out_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
    if not numerics.quantized:
        return F.linear(x, weight, bias)
    with torch.autocast(dev, enabled=False):
        return QuantLinearFunction.apply(x, weight, bias, qweight, numerics, seeds, out_dtype, name)
