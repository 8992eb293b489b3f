"""Is the fp32 router batch-invariant on this GPU? The minite recipe's router
(minite.nn.moe_layers.AlignedRouter,
fp32 logits, stable top-k) on Qwen3-30B-A3B shapes (hidden 2048, 128 experts, top-8): the first rows'
logits, routing weights and expert ids when they are computed alone (M = 1 / 16 / 64 / 256, as the
sampler's decode steps do) against the same rows inside one 8192-row call (as the trainer's forward does).
Then the logits' time (CUDA graph medians): minite.nn.moe_routing.router_logits_fp32 (the batch-invariant
kernel on CUDA) against its torch reference (fp32 copies + cuBLAS float32 GEMM).

    python3 scripts/gpu/router_bits.py
"""

from __future__ import annotations

import torch
from torch import nn

from minite.bench.timing import bench_graph
from minite.nn.moe_layers import AlignedRouter
from minite.nn.moe_routing import router_logits_fp32, router_logits_fp32_ref


class _Gate(nn.Module):  # the attributes AlignedRouter takes over from transformers' router
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.top_k, self.num_experts, self.norm_topk_prob, self.hidden_dim = (
            8,
            weight.shape[0],
            True,
            weight.shape[1],
        )
        self.weight = nn.Parameter(weight)


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__)
    g = torch.Generator(device="cuda").manual_seed(0)
    for wdtype in (torch.float32, torch.bfloat16):
        w = (torch.randn(128, 2048, generator=g, device="cuda") * 0.02).to(wdtype)
        router = AlignedRouter(_Gate(w), fp32=True, deterministic=True)
        h = torch.randn(8192, 2048, generator=g, device="cuda").bfloat16()
        with torch.no_grad():
            big_logits, big_w, big_i = router(h)
            for m in (1, 16, 64, 256):
                logits, wts, idx = router(h[:m])
                dl = int((logits != big_logits[:m]).sum())
                dw = int((wts != big_w[:m]).sum())
                di = int((idx != big_i[:m]).sum())
                print(
                    f"weight {str(wdtype)[6:]}, M={m} alone vs in 8192: logits differ {dl}/{logits.numel()}, "
                    f"routing weights {dw}/{wts.numel()}, expert ids {di}/{idx.numel()}"
                )

    w = torch.randn(128, 2048, generator=g, device="cuda")
    print("\n| rows | router_logits_fp32 us | torch reference us | reference / kernel |")
    print("|---:|---:|---:|---:|")
    for m in (1, 16, 64, 256, 8192):
        sets = [(torch.randn(m, 2048, generator=g, device="cuda").bfloat16(), w) for _ in range(2)]
        t_k = bench_graph(router_logits_fp32, sets, calls=16) * 1e3
        t_r = bench_graph(router_logits_fp32_ref, sets, calls=16) * 1e3
        print(f"| {m} | {t_k:.1f} | {t_r:.1f} | {t_r / t_k:.2f}x |")
    tiles()


def tiles() -> None:
    """Other constant tiles (BLOCK_R, BLOCK_E, BLOCK_K, warps): us a call, and whether rows alone equal
    the same rows in 8192 (each tile is its own summation order, invariant by construction)."""
    from minite.kernels import router as kr

    g = torch.Generator(device="cuda").manual_seed(1)
    w = torch.randn(128, 2048, generator=g, device="cuda")
    h = torch.randn(8192, 2048, generator=g, device="cuda").bfloat16()
    shipped = (kr.BLOCK_R, kr.BLOCK_E, kr.BLOCK_K, kr.NUM_WARPS)
    print("\n| tile (rows, experts, K, warps) | M=1 us | M=16 us | M=64 us | M=8192 us | alone == in 8192 |")
    print("|---|---:|---:|---:|---:|---|")
    for tile in (shipped, (4, 8, 256, 4), (4, 16, 128, 4), (2, 8, 256, 4), (4, 4, 256, 4), (8, 16, 128, 8)):
        kr.BLOCK_R, kr.BLOCK_E, kr.BLOCK_K, kr.NUM_WARPS = tile
        try:
            full = router_logits_fp32(h, w)
            same = all(torch.equal(router_logits_fp32(h[:m], w), full[:m]) for m in (1, 5, 16, 64))
            times = [bench_graph(router_logits_fp32, [(h[:m], w)], calls=16) * 1e3 for m in (1, 16, 64, 8192)]
            print(f"| {tile} | " + " | ".join(f"{t:.1f}" for t in times) + f" | {same} |", flush=True)
        finally:
            kr.BLOCK_R, kr.BLOCK_E, kr.BLOCK_K, kr.NUM_WARPS = shipped


if __name__ == "__main__":
    main()
