#!/usr/bin/env python3
"""Checks and times leangrad's layer-norm kernels (an F32 residual stream
normalised into bf16, as GPT-2's blocks run them) on the GPU machine.

The source comes from `go run ./scripts/kernelsrc`; each variant rewrites
some of its #defines (LN_FWD_BLOCKS, LN_BWD_BLOCKS, LN_REG_COLS, ...);
GRID=n launches n blocks a multiprocessor instead of lnBlocks's. CuPy
compiles each with NVRTC and launches the kernels as
kernels/cuda/transformer.go does; PyTorch gives the float32 reference.

    python3 scripts/ln-bench.py --source kernels.cu base= bwd3=LN_BWD_BLOCKS=3,GRID=3

For each variant: the relative error of y, of dx (accumulated onto a
gradient dx held, as the residual stream's gradient is in GPT-2's
backward), of its bf16 rounding and of dgamma and dbeta against the
reference, whether they equal the first variant's bit for bit, and the
median device times of layernorm_fwd_mixed_bf16 and of the whole
backward: layernorm_bwd_mixed_bf16 and the two kernels that add its rows
of partial sums (one a block, or one a warp for rows longer than
LN_REG_COLS; bwd), and the first of those alone (bwd kernel).
"""
import argparse
import json
import re
import sys

import cupy as cp
import numpy as np
import torch
import torch.nn.functional as F
from devtime import redefine, rel, timed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True, help="the kernels' CUDA C (go run ./scripts/kernelsrc)")
    ap.add_argument("--shape", default="16384,768", help="rows,cols")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--go", help="kernels/cuda/transformer.go, for lnSplits (32 without it)")
    ap.add_argument("variants", nargs="+", help="name=[MACRO=VALUE,...]: each MACRO's #define rewritten")
    a = ap.parse_args()
    rows, cols = map(int, a.shape.split(","))
    full = open(a.source).read()
    warps = int(re.search(r"#define LN_WARPS (\d+)", full).group(1))
    per_sm = int(re.search(r"#define LN_BLOCKS (\d+)", full).group(1))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    blocks = max(1, min((rows + warps - 1) // warps, per_sm * sms))  # lnBlocks
    torch.manual_seed(1)
    splits = int(re.search(r"const lnSplits = (\d+)", open(a.go).read()).group(1)) if a.go else 32
    x = 1 + 2 * torch.randn(rows, cols, device="cuda")
    g = 0.5 + torch.rand(cols, device="cuda")
    b = torch.randn(cols, device="cuda")
    dy = torch.randn(rows, cols, device="cuda").bfloat16()
    prev = torch.randn(rows, cols, device="cuda")
    xr = x.clone().requires_grad_()
    yr = F.layer_norm(xr, (cols,), g, b, 1e-5)
    yr.backward(dy.float())
    ref = {"y": yr.detach(), "dx": xr.grad, "rnd": xr.grad + prev}
    gr, br = g.clone().requires_grad_(), b.clone().requires_grad_()
    F.layer_norm(x, (cols,), gr, br, 1e-5).backward(dy.float())
    ref["dg"], ref["db"] = gr.grad, br.grad
    i32, f32 = np.int32, np.float32
    ptr = lambda t: np.uint64(t.data_ptr())
    results, first = {}, None
    for spec in a.variants:
        name, _, defs = spec.partition("=")
        src, nblocks = full, blocks
        for d in filter(None, defs.split(",")):
            m, val = d.split("=")
            if m == "GRID":
                nblocks = int(val) * sms
                continue
            src = redefine(src, m, val, spec)
        mod = cp.RawModule(code=src, options=("--std=c++17",))
        fwd, bwd = mod.get_function("layernorm_fwd_mixed_bf16"), mod.get_function("layernorm_bwd_mixed_bf16")
        grads = mod.get_function("layernorm_grads")
        y = torch.full((rows, cols), float("nan"), device="cuda").bfloat16()
        mean, rstd = torch.full((rows,), float("nan"), device="cuda"), torch.full((rows,), float("nan"), device="cuda")
        dx = prev.clone()
        rnd = torch.full((rows, cols), float("nan"), device="cuda").bfloat16()
        dg, db = torch.full((cols,), float("nan"), device="cuda"), torch.full((cols,), float("nan"), device="cuda")
        reg_cols = int(re.search(r"#define LN_REG_COLS (\d+)", src).group(1))
        nparts = nblocks if cols <= reg_cols else nblocks * warps  # rows of partial sums
        part = torch.empty(nparts * 2 * cols, device="cuda")
        part2 = torch.empty(splits * 2 * cols, device="cuda")
        run_fwd = lambda: fwd((nblocks,), (32 * warps,), (i32(rows), i32(cols), ptr(x), ptr(g), ptr(b), f32(1e-5), ptr(y), ptr(mean), ptr(rstd)))
        run_kernel = lambda: bwd((nblocks,), (32 * warps,), (i32(rows), i32(cols), ptr(x), ptr(g), ptr(mean), ptr(rstd), ptr(dy), ptr(dx),
                                                            ptr(part), i32(1), ptr(rnd), i32(0)))

        def run_bwd():  # as LayerNormBackward launches them
            run_kernel()
            parts, n = part, nparts
            if nparts > 4 * splits:
                grads(((cols + 31) // 32, splits), (256,), (i32(nparts), i32(cols), i32(splits), i32(2), ptr(part), ptr(part2),
                                                            np.uint64(part2.data_ptr() + 4 * cols), np.uint64(0), i32(2 * cols)))
                parts, n = part2, splits
            grads(((cols + 31) // 32,), (256,), (i32(n), i32(cols), i32(1), i32(2), ptr(parts), ptr(dg), ptr(db), np.uint64(0), i32(0)))

        run_fwd()
        run_bwd()
        torch.cuda.synchronize()
        out = {"y": y.clone(), "dx": dx - prev, "rnd": rnd.float(), "dg": dg.clone(), "db": db.clone()}
        r = {"regs": {"fwd": fwd.num_regs, "bwd": bwd.num_regs}, "spill_bytes": {"fwd": fwd.local_size_bytes, "bwd": bwd.local_size_bytes}}
        r["err"] = {n: rel(v.float(), ref[n]) for n, v in out.items()}
        if first is None:
            first = {n: v.clone() for n, v in out.items()}
        r["same_bits_as_first"] = {n: bool(torch.equal(v, first[n])) for n, v in out.items()}
        # dx grows with each timed call; its values do not change the work.
        r["ms"] = {"fwd": timed(run_fwd, a.iters), "bwd": timed(run_bwd, a.iters), "bwd kernel": timed(run_kernel, a.iters)}
        # bytes each must move at least: x, gamma-free; the backward with its accumulation and rounding
        moved = {"fwd": rows * cols * (4 + 2), "bwd": rows * cols * (4 + 2 + 4 + 4 + 2)}
        r["tb_per_s"] = {k: moved[k] / r["ms"][k] / 1e9 for k in moved}
        results[name] = r
        print(name, json.dumps(r), flush=True)
    print("\n| variant | regs fwd/bwd | spills fwd/bwd | fwd ms | bwd ms (kernel) | fwd TB/s | bwd TB/s | max rel err | bits as first |")
    print("|---|---|---|---:|---:|---:|---:|---:|---|")
    for name, r in results.items():
        same = ",".join(n for n, v in r["same_bits_as_first"].items() if v) or "–"
        print("| %s | %d/%d | %d/%d | %.4f | %.4f (%.4f) | %.2f | %.2f | %.2e | %s |" % (name, r["regs"]["fwd"], r["regs"]["bwd"],
              r["spill_bytes"]["fwd"], r["spill_bytes"]["bwd"], r["ms"]["fwd"], r["ms"]["bwd"], r["ms"]["bwd kernel"], r["tb_per_s"]["fwd"],
              r["tb_per_s"]["bwd"], max(r["err"].values()), same))
    if a.json:
        json.dump(results, open(a.json, "w"), indent=1)
    bad = [n for n, r in results.items() if not all(e < 1e-2 for e in r["err"].values())]
    if bad:
        print("too far from the float32 reference:", ", ".join(bad))
        sys.exit(1)


if __name__ == "__main__":
    main()
