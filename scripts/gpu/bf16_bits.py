"""Are the bf16 parts of a minite model batch-invariant on this GPU? The minite recipe keeps its last
decoder block and the lm_head in bf16; those GEMMs run on cuBLAS / CUTLASS, whose kernel (tile, split-K)
follows the number of rows. Qwen3-30B-A3B shapes: a few rows computed alone (as the sampler's decode
steps do) against the same rows inside a large batch (as the trainer's forward does), per GEMM: the
count of output elements that differ.

    python3 scripts/gpu/bf16_bits.py
"""

from __future__ import annotations

import torch


def dense(name: str, n: int, k: int, g: torch.Generator) -> None:
    w = (torch.randn(n, k, generator=g, device="cuda") * 0.02).bfloat16()
    x = torch.randn(2048, k, generator=g, device="cuda").bfloat16()
    full = x @ w.T
    cells = []
    for m in (1, 8, 16, 64, 256):
        part = x[:m] @ w.T
        cells.append(f"M={m}: {int((part != full[:m]).sum())}/{part.numel()}")
    print(f"dense bf16 {name} ({n}x{k}) alone vs in 2048 rows: " + ", ".join(cells), flush=True)


def grouped(name: str, n: int, k: int, g: torch.Generator) -> None:
    """torch._grouped_mm (the bf16 experts' path): token 0's 8 expert rows alone vs in 2048 tokens."""
    e, top = 128, 8
    w = (torch.randn(e, k, n, generator=g, device="cuda") * 0.02).bfloat16()
    cpu = torch.Generator().manual_seed(1)
    for tokens in (2048, 64):
        idx = torch.stack([torch.randperm(e, generator=cpu)[:top] for _ in range(tokens)]).cuda()
        x = torch.randn(tokens, k, generator=g, device="cuda").bfloat16()
        ids, perm = torch.sort(idx.reshape(-1), stable=True)
        offs = torch.searchsorted(ids, torch.arange(1, e + 1, device="cuda")).to(torch.int32)
        full = torch._grouped_mm(x[perm // top], w, offs=offs)
        mine = (perm // top) == 0  # token 0's rows in the sorted batch
        ids0, perm0 = torch.sort(idx[0], stable=True)
        offs0 = torch.searchsorted(ids0, torch.arange(1, e + 1, device="cuda")).to(torch.int32)
        alone = torch._grouped_mm(x[:1].expand(top, k).contiguous(), w, offs=offs0)
        diff = int((alone != full[mine]).sum())
        print(
            f"grouped bf16 {name} (E=128, {n}x{k}): token alone vs in {tokens} tokens: {diff}/{alone.numel()}"
        )


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__)
    g = torch.Generator(device="cuda").manual_seed(0)
    for name, n, k in (("q_proj", 4096, 2048), ("k_proj", 512, 2048), ("o_proj", 2048, 4096)):
        dense(name, n, k, g)
    dense("lm_head", 151936, 2048, g)
    grouped("gate_up", 1536, 2048, g)
    grouped("down", 2048, 768, g)


if __name__ == "__main__":
    main()
