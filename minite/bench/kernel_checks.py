"""`minite bench-kernels` correctness at full size, before any timing: quantize bytes bit for bit
against the torch reference, GEMMs within float32 summation error of the float64 product, NaN
propagation and batch invariance, on fresh random data with NaN-poisoned outputs."""

from __future__ import annotations

from typing import Any

import torch

from minite.bench.timing import randn_blocks


class Checks:
    def __init__(self) -> None:
        self.results: list[dict[str, Any]] = []

    def add(self, name: str, ok: bool, detail: str = "") -> None:
        self.results.append({"check": name, "ok": bool(ok), "detail": detail})
        print(f"  [{'ok' if ok else 'FAIL'}] {name} {detail}", flush=True)

    @property
    def all_ok(self) -> bool:
        return all(r["ok"] for r in self.results)


def _same_bits(a, b) -> tuple[bool, str]:
    nq = int((a.qdata != b.qdata).sum())
    ns = int((a.scale.view(torch.uint8) != b.scale.view(torch.uint8)).sum())
    ng = int(
        (
            a.global_scale.view(torch.int32) != b.global_scale.reshape(a.global_scale.shape).view(torch.int32)
        ).sum()
    )
    return nq == 0 and ns == 0 and ng == 0, f"(bytes differing: qdata {nq}, scale {ns}, global {ng})"


def _gemm_error(out: torch.Tensor, a, b, tol: float = 1e-5) -> tuple[bool, str]:
    """|out - exact| <= tol |A||B| elementwise, exact and |A||B| in float64 on the GPU."""
    from minite.numerics import dequantize

    da, db = dequantize(a).double(), dequantize(b).double()
    exact = da @ db.T
    scale = da.abs() @ db.abs().T
    err = (out.double() - exact).abs()
    ratio = float((err / (scale + 1e-300)).max())
    nan = bool(torch.isnan(out).any())
    return (
        not nan
    ) and ratio <= tol, f"(max |err|/(|A||B|) = {ratio:.2e}, tol {tol:g}{', NaN!' if nan else ''})"


def run_checks(n: int, checks: Checks) -> None:
    from minite.kernels import _triton, nvfp4_matmul, nvfp4_quantize
    from minite.kernels.grouped_gemm import nvfp4_grouped_matmul
    from minite.kernels.quantize import nvfp4_quantize_batched, nvfp4_quantize_grouped
    from minite.numerics import QuantSpec, nvfp4_matmul_ref, quantize

    _triton.POISON = 0xFF  # every kernel output starts as 0xFF bytes / NaN
    try:
        x = randn_blocks((n, n), 1)
        for label, spec in (
            ("1x16 row canonical", QuantSpec(scope="row")),
            ("1x16 tensor te", QuantSpec(flavor="te")),
            ("16x16 tensor canonical", QuantSpec(block="16x16")),
            ("1x16 tensor vllm", QuantSpec(flavor="vllm")),
        ):
            ok, detail = _same_bits(nvfp4_quantize(x, spec), quantize(x, spec))
            checks.add(f"quantize {n}x{n} bf16 {label} == torch reference (on GPU)", ok, detail)
        # RHT and transposed output: the reference's rotation is a CPU matmul (summed in index order)
        xs = x[:256].contiguous()
        for label, spec, tr in (
            ("1x16 row rht", QuantSpec(scope="row", rht=True), False),
            ("1x16 row rht transposed", QuantSpec(scope="row", rht=True), True),
        ):
            ref = quantize((xs.T.contiguous() if tr else xs).cpu(), spec)
            got = nvfp4_quantize(xs, spec, transpose=tr)
            ok, detail = _same_bits(
                type(ref)(got.qdata.cpu(), got.scale.cpu(), got.global_scale.cpu(), spec), ref
            )
            checks.add(f"quantize 256x{n} {label} == CPU reference", ok, detail)

        w = randn_blocks((n, n), 2)
        qx = nvfp4_quantize(x, QuantSpec(scope="row"))
        qw = nvfp4_quantize(w, QuantSpec(block="16x16"))
        for method in ("fused", "cublas"):
            ok, detail = _gemm_error(nvfp4_matmul(qx, qw, method=method), qx, qw)
            checks.add(f"W4A4 GEMM {n}^3 method={method} vs exact float64", ok, detail)
        from dataclasses import replace

        from minite.kernels.decode import DECODE_KERNEL_CONFIG

        for nk in (4096, 8192):
            b = nvfp4_quantize(randn_blocks((nk, nk), 4), QuantSpec(block="16x16"))
            for m in (1, 16):
                a = nvfp4_quantize(randn_blocks((m, nk), 3 + m), QuantSpec(scope="row"))
                for dq in (2, 1):
                    cfg = replace(DECODE_KERNEL_CONFIG, dequant=dq)
                    ok, detail = _gemm_error(nvfp4_matmul(a, b, method="decode", decode_config=cfg), a, b)
                    checks.add(f"decode kernel M={m} N=K={nk} dequant={dq} vs exact float64", ok, detail)
            xb16 = randn_blocks((16, nk), 9)
            spec = QuantSpec(scope="row")
            full = nvfp4_matmul(nvfp4_quantize(xb16, spec), b, torch.bfloat16, method="decode")
            same = all(
                torch.equal(
                    nvfp4_matmul(nvfp4_quantize(xb16[i : i + 1], spec), b, torch.bfloat16, method="decode")[
                        0
                    ],
                    full[i],
                )
                for i in (0, 7, 15)
            )
            again = torch.equal(
                nvfp4_matmul(nvfp4_quantize(xb16, spec), b, torch.bfloat16, method="decode"), full
            )
            checks.add(
                f"decode kernel N=K={nk}: rows alone == rows in a batch of 16, reruns identical",
                same and again,
            )
        # a NaN scale byte in one weight row and in one activation row -> NaN column / row, as the reference
        bq = nvfp4_quantize(randn_blocks((4096, 4096), 4), QuantSpec(block="16x16"))
        aq = nvfp4_quantize(randn_blocks((3, 4096), 5), QuantSpec(scope="row"))
        bs = bq.scale.view(torch.uint8).clone()
        bs[77, 100] = 0x7F
        as_ = aq.scale.view(torch.uint8).clone()
        as_[1, 3] = 0xFF
        bq = type(bq)(bq.qdata, bs.view(bq.scale.dtype), bq.global_scale, bq.spec)
        aq = type(aq)(aq.qdata, as_.view(aq.scale.dtype), aq.global_scale, aq.spec)
        ok = True
        for dq in (0, 1, 2):
            out = nvfp4_matmul(
                aq, bq, method="decode", decode_config=replace(DECODE_KERNEL_CONFIG, dequant=dq)
            )
            nan = torch.isnan(out)
            ok = ok and bool(nan[:, 77].all() and nan[1].all()) and int(nan.sum()) == 3 + 4096 - 1
        checks.add("decode kernel: NaN scale bytes give NaN rows/columns (dequant 0, 1, 2)", ok)
        # batch invariance at full size: rows alone, in a batch of 4096, and after other rows
        wb = nvfp4_quantize(randn_blocks((4096, 4096), 5), QuantSpec(block="16x16"))
        xb = randn_blocks((4096, 4096), 6)
        spec = QuantSpec(scope="row")
        full = nvfp4_matmul(nvfp4_quantize(xb, spec), wb, torch.bfloat16, batch_invariant=True)
        ok = True
        for i in (0, 1, 77, 4095):
            alone = nvfp4_matmul(
                nvfp4_quantize(xb[i : i + 1], spec), wb, torch.bfloat16, batch_invariant=True
            )
            mixed = nvfp4_matmul(
                nvfp4_quantize(torch.cat([xb[100:117], xb[i : i + 1]]), spec),
                wb,
                torch.bfloat16,
                batch_invariant=True,
            )
            ok = ok and torch.equal(alone[0], full[i]) and torch.equal(mixed[-1], full[i])
        checks.add("batch-invariant GEMM: rows alone / in 4096 / among other rows bit-identical", ok)
        ref = nvfp4_matmul_ref(nvfp4_quantize(xb[:64], spec), wb)
        ok, detail = _gemm_error(full[:64].float(), nvfp4_quantize(xb[:64], spec), wb, tol=1e-5 + 2**-8)
        checks.add("batch-invariant GEMM (bf16 out) vs exact", ok and ref.shape == (64, 4096), detail)

        # grouped: a few experts against the per-expert reference
        e, d, f = 8, 2048, 768
        counts = torch.tensor([0, 1, 17, 256, 300, 5, 128, 90])
        offs = torch.zeros(e + 1, dtype=torch.int64)
        offs[1:] = counts.cumsum(0)
        offs_d = offs.cuda()
        xg = randn_blocks((int(offs[-1]), d), 7)
        wg = randn_blocks((e, 2 * f, d), 8)
        qa = nvfp4_quantize_grouped(xg, offs_d, QuantSpec(scope="row"))
        qg = nvfp4_quantize_batched(wg, QuantSpec(block="16x16"))
        out = nvfp4_grouped_matmul(qa, qg, offs_d)
        ok, details = True, []
        for j in range(e):
            lo, hi = int(offs[j]), int(offs[j + 1])
            if lo == hi:
                continue
            a_j, w_j = quantize(xg[lo:hi], QuantSpec(scope="row")), quantize(wg[j], QuantSpec(block="16x16"))
            good, det = _gemm_error(out[lo:hi], a_j, w_j)
            same, _ = _same_bits(
                type(a_j)(qa.qdata[lo:hi], qa.scale[lo:hi], qa.global_scale[lo:hi], a_j.spec), a_j
            )
            ok = ok and good and same
            details.append(det)
        checks.add(
            "grouped GEMM (8 experts, counts 0..300) vs per-expert reference",
            ok,
            details[-1] if details else "",
        )
    finally:
        _triton.POISON = None
