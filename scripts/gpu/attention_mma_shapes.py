"""Compile every path of the fixed attention core for sm_90 (H100/H200) without a GPU and read the PTX:
which MMA instructions each path issues, and the registers / stack (spills) ptxas reports. The bits of a
query do not follow the path only if every forward and decode path runs the same wgmma instruction shapes
and none an mma.sync (results/bench/history/decode_h200.md); exit 1 otherwise.

    python scripts/gpu/attention_mma_shapes.py   # no GPU needed: Triton's CUDA backend ships ptxas
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import minite.kernels.attention as A
import minite.kernels.attention_bwd as B

TARGET = GPUTarget("cuda", 90, 32)
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
PTR = {"kvs_ptr": "*i32", "qs_ptr": "*i32", "cnt_ptr": "*i32", "o_ptr": "*i16"}


def _signature(fn, constexprs: dict) -> dict[str, str]:
    sig = {}
    for n in fn.arg_names:
        if n in constexprs:
            sig[n] = "constexpr"
        elif n in PTR:
            sig[n] = PTR[n]
        elif n.endswith("_ptr"):
            sig[n] = "*fp32" if n in ("lse_ptr", "delta_ptr") else "*bf16"
        elif n in ("m_ws", "l_ws", "a_ws"):
            sig[n] = "*fp32"
        elif n in ("scale2", "scale"):
            sig[n] = "fp32"
        else:
            sig[n] = "i32"
    return sig


def compile_path(name: str, fn, constexprs: dict, warps: int) -> dict:
    k = triton.compile(
        ASTSource(fn, _signature(fn, constexprs), constexprs=constexprs),
        target=TARGET,
        options={"num_warps": warps, "num_stages": 2, "enable_fp_fusion": False},
    )
    ptx = k.asm["ptx"]
    shapes = collections.Counter(
        re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+\.\w+\.\w+\.\w+)", ptx)
    )
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        res = subprocess.run([CUOBJDUMP, "-res-usage", f.name], capture_output=True, text=True).stdout
    row = {
        "path": name,
        "warps": warps,
        "wgmma": sorted(shapes),
        "mma_sync": "mma.sync" in ptx,
        "regs": (re.findall(r"REG:(\d+)", res) or ["?"])[0],
        "stack": (re.findall(r"STACK:(\d+)", res) or ["?"])[0],
    }
    print(f"{name}: {row}", flush=True)
    return row


def main() -> int:
    fwd = {"G": 8, "D": 128, "BLOCK_N": A.BLOCK_N, "SPLIT": A.SPLIT, "BF16_OUT": True, "INTERP": False}
    rows = []
    for name, extra in (
        ("trainer forward, one chunk", dict(KV_START_T=False, Q_START_T=False, SINGLE=True, STORE_LSE=True)),
        ("trainer forward, chunks", dict(KV_START_T=False, Q_START_T=False, SINGLE=False, STORE_LSE=True)),
        ("prefill, one chunk", dict(KV_START_T=True, Q_START_T=False, SINGLE=True, STORE_LSE=False)),
        ("prefill, chunks", dict(KV_START_T=True, Q_START_T=False, SINGLE=False, STORE_LSE=False)),
    ):
        c = {**fwd, **extra, "BLOCK_M": A.FWD_BLOCK_M}
        rows.append(compile_path(name, A._attention_fwd_kernel, c, A.FWD_WARPS))
    dec = {**fwd, "BLOCK_M": A.DEC_BLOCK_M, "KV_START_T": True, "Q_START_T": True}
    rows.append(compile_path("decode", A._attention_decode_kernel, dec, A.DEC_WARPS))
    bwd = {"G": 8, "D": 128, "INTERP": False}
    compile_path("backward dK/dV", B._bwd_dkdv_kernel, {**bwd, "BLOCK_M": 64, "BLOCK_N": 128}, 8)
    compile_path("backward dQ", B._bwd_dq_kernel, {**bwd, "BLOCK_M": 128, "BLOCK_N": 64}, 8)
    shapes = {tuple(r["wgmma"]) for r in rows}
    ok = len(shapes) == 1 and not any(r["mma_sync"] for r in rows) and all(r["wgmma"] for r in rows)
    print(
        f"{'PASS' if ok else 'FAIL'}: forward and decode paths issue the same MMA instructions: "
        f"{sorted(shapes)}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
