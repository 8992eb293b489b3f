"""Compile the W4A4 GEMM kernels for sm_90 without a GPU and print a hash of each one's PTX.

A refactor of kernels/ that leaves these hashes unchanged leaves the H200's instructions, and so every
output bit, unchanged: Triton inlines @triton.jit helpers before it lowers a kernel, so moving a K loop
or an epilogue into a helper changes only the source line table, which the hash leaves out (`.loc`,
`.file`, the debug sections). Runs on any machine with Triton (its bundled ptxas); no driver is needed.

    python scripts/gpu/ptx_fingerprint.py                      # this checkout's kernels/
    python scripts/gpu/ptx_fingerprint.py --kernels-dir /tmp/old/kernels   # another tree's, to compare
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import re
import sys
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

ROOT = Path(__file__).resolve().parents[2]


def load_kernels(kernels_dir: Path):
    """Import `kernels_dir` as minite.kernels (how the installed package maps kernels/)."""
    import minite

    spec = importlib.util.spec_from_file_location(
        "minite.kernels", kernels_dir / "__init__.py", submodule_search_locations=[str(kernels_dir)]
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules["minite.kernels"] = mod
    minite.kernels = mod
    spec.loader.exec_module(mod)
    return mod


_POINTER_TYPES = {name: "*u8" for name in ("aq_ptr", "as_ptr", "bq_ptr", "bs_ptr", "q_ptr", "s_ptr")}
_POINTER_TYPES.update({name: "*i32" for name in ("lock_ptr", "offs_ptr", "poffs_ptr")})


def _signature(fn, constexprs: dict, out_type: str) -> dict[str, str]:
    """Argument types as the launcher would infer them: byte operands (float16 ones for a two-pass
    config, DEQ = -1), int32 counters and offsets, the output (`out_type`), float32 for every other
    pointer, int32 scalars."""
    types = {**_POINTER_TYPES, "out_ptr": out_type}
    if constexprs.get("DEQ") == -1:
        types.update({name: "*fp16" for name in ("aq_ptr", "as_ptr", "bq_ptr", "bs_ptr")})
    default = {True: "*fp32", False: "i32"}
    return {
        name: "constexpr" if name in constexprs else types.get(name, default[name.endswith("_ptr")])
        for name in fn.arg_names
    }


_NUMERIC = re.compile(r"\b(wgmma|mma|fma|div|rcp|ld\.|st\.|atom|cvt\.rn|inline|\w+\.f(16|32)|\w+\.bf16)")


def ptx_hashes(fn, constexprs: dict, out_type: str, num_warps: int, num_stages: int) -> tuple[str, str]:
    """(hash of the whole PTX, hash of its numeric sequence): the PTX without the source line table and
    the debug sections; the numeric sequence is, in program order, every floating-point, MMA, memory and
    atomic instruction with its registers renamed away. Equal whole hashes: the same machine code. Equal
    numeric hashes alone: the same float operations in the same order on the same kind of operands,
    only integer address arithmetic placed differently (which cannot change a bit of the output)."""
    src = ASTSource(fn=fn, signature=_signature(fn, constexprs, out_type), constexprs=constexprs)
    compiled = triton.compile(
        src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": num_stages}
    )
    ptx = compiled.asm["ptx"].split("\t.section\t.debug")[0]
    body = [
        re.sub(r"\$L__tmp\d+", "$L__tmp", ln)
        for ln in ptx.splitlines()
        if not re.match(r"\s*(\.loc|\.file)", ln) and not re.match(r"^\$L__tmp\d+:$", ln)
    ]
    numeric = [re.sub(r"%[a-z]+\d*|\w+_param_", "R", ln.strip()) for ln in body if _NUMERIC.search(ln)]
    return tuple(hashlib.sha256("\n".join(t).encode()).hexdigest()[:16] for t in (body, numeric))


def _consts(cfg, **more) -> dict:
    """A config's compile-time arguments, a superset for every W4A4 kernel (each takes the ones it has);
    bf16 output, per-row A scales, no bias, whole K steps, the GPU decoders."""
    return {
        **dict(A_GS_ROW=True, B_GS_ROW=False, HAS_BIAS=False, ACC_SHIFT=262144.0, EVEN_K=True, OUT_BF16=True),
        **dict(BLOCK_M=getattr(cfg, "block_m", None), BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k),
        **dict(NUM_STAGES=cfg.num_stages, DEQ=-1 if getattr(cfg, "two_pass", False) else cfg.dequant),
        **dict(DEQUANT_ASM=True, ASM=True, E_POW2=128),
        **dict(GROUP_M=getattr(cfg, "group_m", 1), SWAP_AB=getattr(cfg, "swap_ab", False), N_FASTEST=True),
        **dict(SERIAL_SPLIT=getattr(cfg, "serial_split", False)),
        **more,
    }


def gemm_cases(k):
    """(label, kernel, constexprs, warps, stages): the W4A4 GEMM configs the product runs (dense, decode,
    grouped), a split of 4 where the config splits K. A tree with the transposed dense kernel apart
    (`_nvfp4_gemm_swapped_kernel`) compiles that one for the swap_ab config."""
    g, d, gg = k.gemm, k.decode, k.grouped_gemm
    swapped = getattr(g, "_nvfp4_gemm_swapped_kernel", g._nvfp4_gemm_kernel)
    dense = [
        ("bi64", g.BATCH_INVARIANT_CONFIG, 4),
        ("large", g.LARGE_CONFIG, 1),
        ("decode16", g.DECODE_CONFIG, 4),
    ]
    dense += [("bi_few_swap", g.BATCH_INVARIANT_FEW_ROWS_CONFIG, 4)]
    if hasattr(g, "BATCH_INVARIANT_LARGE_CONFIG"):
        dense += [("bi_large", g.BATCH_INVARIANT_LARGE_CONFIG, 4)]
    if hasattr(g, "BATCH_INVARIANT_TWO_PASS_CONFIG"):
        dense += [("bi_two_pass", g.BATCH_INVARIANT_TWO_PASS_CONFIG, 4)]
    cases = [
        (
            label,
            swapped if cfg.swap_ab else g._nvfp4_gemm_kernel,
            _consts(cfg, SPLIT_K=split),
            cfg.num_warps,
            cfg.num_stages,
        )
        for label, cfg, split in dense
    ]
    dc = d.DECODE_KERNEL_CONFIG
    ce = _consts(dc, BLOCK_M=d.DECODE_MAX_M, KS=dc.k_slices, SPLIT_K=4)
    cases.append(("decode_kernel", d._nvfp4_decode_kernel, ce, dc.num_warps, dc.num_stages))
    grouped = [("grouped_swap", gg.GROUPED_SWAP_CONFIG), ("grouped_long", gg.GROUPED_LONG_K_CONFIG)]
    grouped += [("grouped_short", gg.GROUPED_SHORT_K_CONFIG)]
    fn = gg._nvfp4_grouped_gemm_kernel
    cases += [(label, fn, _consts(cfg), cfg.num_warps, cfg.num_stages) for label, cfg in grouped]
    cfg = gg.WGRAD_CONFIG
    cases.append(
        ("grouped_wgrad", gg._nvfp4_grouped_wgrad_kernel, _consts(cfg), cfg.num_warps, cfg.num_stages)
    )
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels-dir", type=Path, default=ROOT / "kernels")
    parser.add_argument("--only", default="", help="comma-separated case labels")
    args = parser.parse_args()
    k = load_kernels(args.kernels_dir.resolve())
    only = {s for s in args.only.split(",") if s}
    for label, fn, ce, warps, stages in gemm_cases(k):
        if only and label not in only:
            continue
        ce = {name: v for name, v in ce.items() if name in fn.arg_names}
        out_type = "*fp32" if label == "grouped_wgrad" else "*i16"
        whole, numeric = ptx_hashes(fn, ce, out_type, warps, stages)
        print(f"{label:16s} ptx {whole}  numeric {numeric}", flush=True)


if __name__ == "__main__":
    main()
