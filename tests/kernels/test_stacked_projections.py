"""q/k/v in one W4A4 launch (minite.nn.linear.shared_input_projections on the kernel path): the weights
stacked along N with one global scale per row give each projection the columns its own launch gives,
bit for bit, and the stack is rebuilt when a weight is replaced. Runs the kernels (interpreter or GPU):
the CPU reference path never stacks. Outputs are poisoned with NaN before every launch."""

from dataclasses import replace

import pytest
import torch
from torch import nn

import minite.nn.functional as functional
import minite.nn.linear as linear
from minite.nn import LinearNumerics, QuantLinear, SeedSource
from minite.nn.swap import linear_numerics
from minite.numerics import QuantSpec, dispatch
from minite.recipes import MINITE

pytestmark = pytest.mark.usefixtures("poison")  # conftest: unwritten outputs show

# the minite recipe's linears: per-row activation scales (the batch-invariant path); only fprop runs here
ALIGNED = linear_numerics(MINITE.trainer)


def _kernel_path(monkeypatch, device):
    if device == "cpu":  # the interpreter's kernels on CPU tensors, as on CUDA
        monkeypatch.setattr(functional, "gemm_path", lambda gemm, *ts: "fused")
        monkeypatch.setattr(linear, "gemm_path", lambda gemm, *ts: "fused")
        monkeypatch.setattr(dispatch, "use_kernels", lambda *ts: True)


def _layers(device, dims=(64, 32, 32), k=256):
    out = []
    for n in dims:
        torch.manual_seed(n + k)
        base = nn.Linear(k, n, bias=False)
        with torch.no_grad():  # spread the projections' magnitudes: distinct global scales
            base.weight.mul_(10.0 ** (n % 3))
        out.append(QuantLinear.from_linear(base, ALIGNED, SeedSource(n), f"p{n}").to(device, torch.bfloat16))
    return out


@pytest.mark.parametrize("m", [1, 5, 16, 40])
def test_stacked_launch_gives_each_projections_bits(m, device, monkeypatch):
    _kernel_path(monkeypatch, device)
    layers = _layers(device)
    x = torch.randn(m, 256, generator=torch.Generator().manual_seed(m)).to(device, torch.bfloat16)
    with torch.no_grad():
        want = [lin(x) for lin in layers]
        got = linear.shared_input_projections(x, layers)
    assert getattr(layers[0], "_stacked", None) is not None  # the stacked launch ran
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w)


def test_stack_follows_weight_updates(device, monkeypatch):
    _kernel_path(monkeypatch, device)
    layers = _layers(device)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(1)).to(device, torch.bfloat16)
    with torch.no_grad():
        linear.shared_input_projections(x, layers)
        first = layers[0]._stacked[1]
        linear.shared_input_projections(x, layers)
        assert layers[0]._stacked[1] is first  # unchanged weights: the cached stack
        layers[1].weight.mul_(-2.0)  # an optimizer step: a new quantized copy of that weight
        got = linear.shared_input_projections(x, layers)
        assert layers[0]._stacked[1] is not first
        assert torch.equal(got[1], layers[1](x))


def test_no_stack_off_the_batch_invariant_path(device, monkeypatch):
    """Tensor-scope activations (TE-style), or a K split that would differ for the stack: each projection
    runs its own launch."""
    _kernel_path(monkeypatch, device)
    te = LinearNumerics(fprop_weight=QuantSpec(block="16x16"), fprop_act=QuantSpec())
    layers = _layers(device)
    for lin in layers:
        lin.numerics = te
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(2)).to(device, torch.bfloat16)
    with torch.no_grad():
        linear.shared_input_projections(x, layers)
    assert getattr(layers[0], "_stacked", None) is None
    layers = _layers(device)
    import minite.kernels.gemm as kgemm

    real = kgemm.pick_config

    def split_for_the_stack(m, n, k, *args, **kw):  # N = 128 is the stack only
        cfg = real(m, n, k, *args, **kw)
        return replace(cfg, split_k=cfg.split_k + 1) if n == 128 else cfg

    monkeypatch.setattr(kgemm, "pick_config", split_for_the_stack)
    with torch.no_grad():
        linear.shared_input_projections(x, layers)
    assert getattr(layers[0], "_stacked", None) is None
