"""Do W4A4 kernel tiles that share BLOCK_K give the same bits on this GPU? Per config, the share of
output elements that differ from a reference config and the largest difference in float32 ulps, for
inputs of uniform magnitude (randn) and with block magnitudes spread over 10^±3 (the worst case for
a tensor core's internal alignment of addends). Grouped (MoE) and dense kernels.

    python3 scripts/gpu/tile_bits.py
"""

from __future__ import annotations

import torch

from minite.kernels.gemm import GemmConfig, nvfp4_matmul
from minite.kernels.grouped_gemm import nvfp4_grouped_matmul
from minite.kernels.quantize import nvfp4_quantize, nvfp4_quantize_batched, nvfp4_quantize_grouped
from minite.numerics import QuantSpec

ROW = QuantSpec(scope="row")
W16 = QuantSpec(block="16x16", scope="tensor")
GROUPED = {
    "128x256 w8 (wgmma, shipped)": GemmConfig(128, 256, 128, num_warps=8, num_stages=3),
    "64x128 w4 (wgmma)": GemmConfig(64, 128, 128, num_warps=4, num_stages=4),
    "64x64 w4 (wgmma)": GemmConfig(64, 64, 128, num_warps=4, num_stages=4),
    "128x128 w8 (wgmma)": GemmConfig(128, 128, 128, num_warps=8, num_stages=4),
    "16x128 w4 (mma.sync)": GemmConfig(16, 128, 128, num_warps=4, num_stages=4),
    "32x64 w4 (mma.sync)": GemmConfig(32, 64, 128, num_warps=4, num_stages=4),
    # swap_ab: (B Aᵀ)ᵀ, the weight rows on the wgmma's 64-row side, 16 token rows on its N side
    "16x128 w4 swap (wgmma)": GemmConfig(16, 128, 128, num_warps=4, num_stages=4, swap_ab=True),
    "16x64 w4 swap (wgmma)": GemmConfig(16, 64, 128, num_warps=4, num_stages=4, swap_ab=True),
    "16x256 w8 swap (wgmma)": GemmConfig(16, 256, 128, num_warps=8, num_stages=3, swap_ab=True),
}
DENSE = {
    "64x64 w4 (shipped batch-invariant)": GemmConfig(64, 64, 128, num_warps=4, num_stages=4),
    "64x128 w4": GemmConfig(64, 128, 128, num_warps=4, num_stages=4),
    "128x128 w8": GemmConfig(128, 128, 128, num_warps=8, num_stages=4),
    "16x64 w4 (mma.sync)": GemmConfig(16, 64, 128, num_warps=4, num_stages=4),
    "16x128 w4 swap (wgmma; M <= 16)": GemmConfig(16, 128, 128, num_warps=4, num_stages=4, swap_ab=True),
    "128x256 w8 (wgmma, large batch-invariant tile)": GemmConfig(128, 256, 128, num_warps=8, num_stages=3),
}
# the same tiles with a K split of 2 (4 K steps a share at K = 2048); the large batch-invariant tile sums
# its shares in one program (serial_split), the others over programs: the same K ranges and order
DENSE_SPLIT = {
    "64x64 w4 split 2 (shipped batch-invariant)": GemmConfig(
        64, 64, 128, num_warps=4, num_stages=4, split_k=2
    ),
    "16x128 w4 swap split 2 (M <= 16)": GemmConfig(
        16, 128, 128, num_warps=4, num_stages=4, swap_ab=True, split_k=2
    ),
    "128x256 w8 serial split 2 (large)": GemmConfig(
        128, 256, 128, num_warps=8, num_stages=3, split_k=2, serial_split=True
    ),
    "128x256 w8 two-pass serial split 2": GemmConfig(
        128, 256, 128, num_warps=8, num_stages=3, split_k=2, serial_split=True, two_pass=True
    ),
}


def data(shape, spread: bool, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(*shape, generator=gen)
    if spread:
        blocks = x.reshape(*shape[:-1], shape[-1] // 16, 16)
        x = (blocks * 10 ** (torch.rand(*blocks.shape[:-1], 1, generator=gen) * 6 - 3)).reshape(shape)
    return x.cuda().bfloat16()


def ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    ia, ib = a.view(torch.int32).long(), b.view(torch.int32).long()
    return int((ia - ib).abs().max())


def compare(name: str, outs: dict[str, torch.Tensor]) -> None:
    ref_name, ref = next(iter(outs.items()))
    cells = []
    for k, out in list(outs.items())[1:]:
        diff = out != ref
        cells.append(f"{k}: {int(diff.sum())}/{diff.numel()} differ, max {ulps(out, ref)} ulp")
    print(f"{name} (vs {ref_name}): " + "; ".join(cells))


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__)
    gen = torch.Generator().manual_seed(0)
    e, top = 128, 8
    for spread in (False, True):
        for n, k in ((1536, 2048), (2048, 768)):
            w = data((e, n, k), spread, gen) * 0.02
            qw = nvfp4_quantize_batched(w, W16)
            for tokens in (4, 64, 512):
                idx = torch.stack([torch.randperm(e, generator=gen)[:top] for _ in range(tokens)]).cuda()
                ids, perm = torch.sort(idx.reshape(-1), stable=True)
                offsets = torch.searchsorted(ids, torch.arange(e + 1, device="cuda"))
                x = data((tokens, k), spread, gen)[perm // top]
                qx = nvfp4_quantize_grouped(x, offsets, ROW)
                outs = {c: nvfp4_grouped_matmul(qx, qw, offsets, config=cfg) for c, cfg in GROUPED.items()}
                compare(f"grouped spread={spread} N={n} K={k} tokens={tokens}", outs)
        for n, k in ((4096, 2048), (2048, 4096)):
            qw = nvfp4_quantize(data((n, k), spread, gen), W16)
            for m in (1, 16, 256):
                qx = nvfp4_quantize(data((m, k), spread, gen), ROW)
                outs = {
                    c: nvfp4_matmul(qx, qw, config=cfg, method="fused")
                    for c, cfg in DENSE.items()
                    if not (cfg.swap_ab and m > cfg.block_m)
                }
                compare(f"dense spread={spread} N={n} K={k} M={m}", outs)
                outs = {
                    c: nvfp4_matmul(qx, qw, config=cfg, method="fused")
                    for c, cfg in DENSE_SPLIT.items()
                    if not (cfg.swap_ab and m > cfg.block_m)
                }
                compare(f"dense split 2 spread={spread} N={n} K={k} M={m}", outs)


if __name__ == "__main__":
    main()
