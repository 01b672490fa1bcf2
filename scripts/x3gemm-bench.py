#!/usr/bin/env python3
"""Checks and times the TF32x3 product kernels (kernels/cuda/src/tf32x3.cu:
x3_gemm_{nn,nt,tn,tt}, F32 products as three TF32 ones) on the GPU machine
at GPT-2 small's shapes (batch 16, context 1024), beside PyTorch's strict F32
products (TF32 off) and TF32 ones.

The source comes from `go run ./scripts/kernelsrc`; each variant rewrites
some of its #defines (X3_STAGES, X3_GROUP, ...) or, with ARCH=sm_90, the
architecture (sm_90a by default: the warpgroup path); with EPI=1 it runs
x3_gemm_epi_nn and _nt, C stored with a bias added (the shapes whose A is
not transposed). NVRTC compiles each
as the Go backend does; the kernels take their X3Gemm by
value, launched through the driver as kernels/cuda/tf32x3.go does, K
whole; then the weight gradients again with K split as x3Splits splits it
on the device: the splits added into C in turn, or, where the source is
one from before that (it has x3_gemm_sum), into partial sums that
x3_gemm_sum adds (Flags is then the partial sums' workspace).

    python3 scripts/x3gemm-bench.py --source kernels.cu base= s4=X3_STAGES=4

For each variant and shape: registers and local bytes, the relative error
against float64, the median device time and TFLOP/s (the F32 product's
flops, counted once).
"""
import argparse
import ctypes
import re

import cupy as cp
import torch
from devtime import nvrtc_module, redefine, rel, timed

I32, I64, U64, F32 = ctypes.c_int32, ctypes.c_int64, ctypes.c_uint64, ctypes.c_float


class X3Gemm(ctypes.Structure):
    """kernels/cuda/tf32x3.go's x3Gemm."""
    _fields_ = [(n, I32) for n in ("M", "N", "K", "Lda", "Ldb", "Ldc")] + \
        [(n, I64) for n in ("StrideA", "StrideB", "StrideC")] + \
        [(n, U64) for n in ("A", "B", "R", "C", "Flags", "Bias", "Aux")] + [("Alpha", F32), ("Beta", F32)] + \
        [(n, I32) for n in ("Op", "Grad", "Splits", "KChunk", "TilesM", "TilesN", "VecA", "VecB", "VecC", "VecC4")]


# name, A transposed, B transposed, M, N, K
SHAPES = [
    ("c_fc", False, True, 16384, 3072, 768),
    ("mlp.c_proj", False, True, 16384, 768, 3072),
    ("c_fc-dx", False, False, 16384, 768, 3072),
    ("c_fc-dw", True, False, 3072, 768, 16384),
    ("attn.c_proj-dw", True, False, 768, 768, 16384),
    ("logits", False, True, 2048, 50304, 768),
]


def x3_splits(m, n, k, slots, tile, bk, min_chunk=256, max_splits=16):
    """kernels/cuda/tf32x3.go's x3Splits, one matrix."""
    tiles = -(-m // tile) * -(-n // tile)
    best, busy = 1, 0.0
    for s in range(1, max_splits + 1):
        if s > 1 and k < s * min_chunk:
            break
        waves = -(-tiles * s // slots)
        if tiles * s / (waves * slots) > busy + 0.02:
            best, busy = s, tiles * s / (waves * slots)
        if tiles >= 2 * slots:
            break
    if best == 1:
        return 1, k
    chunk = -(-(-(-k // best)) // bk) * bk
    return -(-k // chunk), chunk


def define(src, macro):
    return int(re.search(r"#define %s (\d+)" % macro, src).group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True, help="the kernels' CUDA C (go run ./scripts/kernelsrc)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("variants", nargs="+", help="name=[MACRO=VALUE,...]")
    a = ap.parse_args()
    # Only what tf32x3.cu needs: the generated prelude and op tables, common.cuh and itself.
    sections = re.split(r"(?m)^(?=// ---- )", open(a.source).read())
    full = "".join(x for x in sections if re.match(r"// ---- (generated from|common\.cuh|tf32x3\.cu)", x))
    torch.manual_seed(1)
    cases = []
    for name, ta, tb, m, n, k in SHAPES:
        x = torch.randn((k, m) if ta else (m, k), device="cuda")
        w = torch.randn((n, k) if tb else (k, n), device="cuda")
        op = lambda t, tr: t.t() if tr else t
        ref = op(x.double(), ta) @ op(w.double(), tb)
        cases.append((name, ta, tb, m, n, k, x, w, ref))
    print("| variant | shape | regs | local | ms | TFLOP/s | error |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, ta, tb, m, n, k, x, w, ref in cases:
        op = lambda t, tr: t.t() if tr else t
        for tf32 in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            out = op(x, ta) @ op(w, tb)
            ms = timed(lambda: op(x, ta) @ op(w, tb), a.iters)
            label = "PyTorch TF32" if tf32 else "PyTorch strict F32"
            print(f"| {label} | {name} | | | {ms:.4f} | {2 * m * n * k / ms / 1e9:.1f} | {rel(out, ref):.2e} |")
        torch.backends.cuda.matmul.allow_tf32 = False
    for spec in a.variants:
        vname, _, macros = spec.partition("=")
        src, arch, epi = full, "sm_90a", False
        for kv in filter(None, macros.split(",")):
            mac, val = kv.split("=")
            if mac == "ARCH":
                arch = val
                continue
            if mac == "EPI":
                epi = val == "1"
                continue
            src = redefine(src, mac, val, spec)
        tile, bk, stages, threads = (define(src, d) for d in ("X3_TILE", "X3_BK", "X3_STAGES", "X3_THREADS"))
        shared = stages * 2 * tile * (bk + 4) * 4
        if arch == "sm_90a":  # the warpgroup path's two buffers of split B tiles, on 1024 bytes
            shared += 4 * tile * bk * 4 + 1024
        shared = max(shared, (tile * (tile + 8) + tile * tile) * 4)  # x3_gemm_epi's staged tiles
        mod = nvrtc_module(src, arch, "x3_gemm")
        partial = "x3_gemm_sum" in src
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        runs = [(c, False) for c in cases if not (epi and c[1])] + [(c, True) for c in cases if c[1] and not epi]
        for (name, ta, tb, m, n, k, x, w, ref), split in runs:
            f = mod.get_function(("x3_gemm_epi_" if epi else "x3_gemm_") + "nt"[ta] + "nt"[tb])
            bias = torch.randn(n, device="cuda") if epi else torch.zeros(n, device="cuda")
            f.max_dynamic_shared_size_bytes = shared
            c = torch.full((m, n), float("nan"), device="cuda")
            tiles = -(-m // tile) * -(-n // tile)
            splits, chunk = x3_splits(m, n, k, sms, tile, bk) if split else (1, k)
            flags = torch.zeros(splits * m * n if partial else tiles, dtype=torch.float32 if partial else torch.int32,
                                device="cuda")
            p = X3Gemm(M=m, N=n, K=k, Lda=m if ta else k, Ldb=k if tb else n, Ldc=n, A=x.data_ptr(), B=w.data_ptr(),
                       R=c.data_ptr(), C=c.data_ptr(), Flags=flags.data_ptr(), Bias=bias.data_ptr() if epi else 0, Alpha=1,
                       Beta=0, Splits=splits, KChunk=chunk, TilesM=(m + tile - 1) // tile, TilesN=(n + tile - 1) // tile,
                       VecA=1, VecB=1, VecC=1, VecC4=1)
            args = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.pointer(p), ctypes.c_void_p))
            total = mod.get_function("x3_gemm_sum") if partial and splits > 1 else None

            def launch():
                cp.cuda.driver.launchKernel(f.kernel.ptr, tiles, splits, 1, threads, 1, 1, shared, 0, ctypes.addressof(args), 0)
                if total is not None:
                    cp.cuda.driver.launchKernel(total.kernel.ptr, min(-(-m * n // 256), 8 * sms), 1, 1, 256, 1, 1, 0, 0,
                                                ctypes.addressof(args), 0)
            ms = timed(launch, a.iters)
            label = f"{name}, {splits} splits" + (" (partial sums)" if partial else "") if split else name
            print(f"| {vname} | {label} | {f.num_regs} | {f.local_size_bytes} | {ms:.4f} | {2 * m * n * k / ms / 1e9:.1f} "
                  f"| {rel(c, ref + bias.double()):.2e} |")


if __name__ == "__main__":
    main()
