#!/usr/bin/env python3
"""Checks and times leangrad's layer-norm kernels (an F32 residual stream
normalised into bf16, as GPT-2's blocks run them) on the GPU machine.

The source comes from `go run ./scripts/kernelsrc`; each variant rewrites
some of its #defines (LN_FWD_BLOCKS, LN_BWD_BLOCKS, ...). CuPy compiles
each with NVRTC and launches the kernels as kernels/cuda/transformer.go
does; PyTorch gives the float32 reference.

    python3 scripts/ln-bench.py --source kernels.cu base= fwd4=LN_FWD_BLOCKS=4

For each variant: the relative error of y and of dx (accumulated onto a
gradient dx held, as the residual stream's) against the reference,
whether they equal the first variant's bit for bit, and the median device
times of layernorm_fwd_mixed_bf16 and layernorm_bwd_mixed_bf16.
"""
import argparse
import json
import re
import sys

import cupy as cp
import numpy as np
import torch
import torch.nn.functional as F
from devtime import rel, timed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True, help="the kernels' CUDA C (go run ./scripts/kernelsrc)")
    ap.add_argument("--shape", default="16384,768", help="rows,cols")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("variants", nargs="+", help="name=[MACRO=VALUE,...]: each MACRO's #define rewritten")
    a = ap.parse_args()
    rows, cols = map(int, a.shape.split(","))
    full = open(a.source).read()
    warps = int(re.search(r"#define LN_WARPS (\d+)", full).group(1))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    blocks = max(1, min((rows + warps - 1) // warps, 4 * sms))  # lnBlocks
    torch.manual_seed(1)
    x = 1 + 2 * torch.randn(rows, cols, device="cuda")
    g = 0.5 + torch.rand(cols, device="cuda")
    b = torch.randn(cols, device="cuda")
    dy = torch.randn(rows, cols, device="cuda").bfloat16()
    prev = torch.randn(rows, cols, device="cuda")
    xr = x.clone().requires_grad_()
    yr = F.layer_norm(xr, (cols,), g, b, 1e-5)
    yr.backward(dy.float())
    ref = {"y": yr.detach(), "dx": xr.grad}
    i32, f32 = np.int32, np.float32
    ptr = lambda t: np.uint64(t.data_ptr())
    results, first = {}, None
    for spec in a.variants:
        name, _, defs = spec.partition("=")
        src = full
        for d in filter(None, defs.split(",")):
            m, val = d.split("=")
            src, n = re.subn(r"#define %s \S+" % m, "#define %s %s" % (m, val), src)
            if n != 1:
                sys.exit("%s: the source has no #define %s" % (spec, m))
        mod = cp.RawModule(code=src, options=("--std=c++17",))
        fwd, bwd = mod.get_function("layernorm_fwd_mixed_bf16"), mod.get_function("layernorm_bwd_mixed_bf16")
        y = torch.full((rows, cols), float("nan"), device="cuda").bfloat16()
        mean, rstd = torch.full((rows,), float("nan"), device="cuda"), torch.full((rows,), float("nan"), device="cuda")
        dx = prev.clone()
        part = torch.empty(blocks * warps * 2 * cols, device="cuda")
        run_fwd = lambda: fwd((blocks,), (32 * warps,), (i32(rows), i32(cols), ptr(x), ptr(g), ptr(b), f32(1e-5), ptr(y), ptr(mean), ptr(rstd)))
        run_bwd = lambda acc: bwd((blocks,), (32 * warps,), (i32(rows), i32(cols), ptr(x), ptr(g), ptr(mean), ptr(rstd), ptr(dy), ptr(dx), ptr(part), i32(acc)))
        run_fwd()
        run_bwd(1)
        torch.cuda.synchronize()
        out = {"y": y.clone(), "dx": dx - prev}
        r = {"regs": {"fwd": fwd.num_regs, "bwd": bwd.num_regs}, "spill_bytes": {"fwd": fwd.local_size_bytes, "bwd": bwd.local_size_bytes}}
        r["err"] = {n: rel(v.float(), ref[n]) for n, v in out.items()}
        if first is None:
            first = {n: v.clone() for n, v in out.items()}
        r["same_bits_as_first"] = {n: bool(torch.equal(v, first[n])) for n, v in out.items()}
        r["ms"] = {"fwd": timed(run_fwd, a.iters), "bwd": timed(lambda: run_bwd(0), a.iters)}
        moved = {"fwd": rows * cols * (4 + 2), "bwd": rows * cols * (4 + 2 + 4)}  # bytes each must move at least (acc off)
        r["tb_per_s"] = {k: moved[k] / r["ms"][k] / 1e9 for k in moved}
        results[name] = r
        print(name, json.dumps(r), flush=True)
    print("\n| variant | regs fwd/bwd | spills fwd/bwd | fwd ms | bwd ms | fwd TB/s | bwd TB/s | max rel err | bits as first |")
    print("|---|---|---|---:|---:|---:|---:|---:|---|")
    for name, r in results.items():
        same = ",".join(n for n, v in r["same_bits_as_first"].items() if v) or "–"
        print("| %s | %d/%d | %d/%d | %.4f | %.4f | %.2f | %.2f | %.2e | %s |" % (name, r["regs"]["fwd"], r["regs"]["bwd"],
              r["spill_bytes"]["fwd"], r["spill_bytes"]["bwd"], r["ms"]["fwd"], r["ms"]["bwd"], r["tb_per_s"]["fwd"],
              r["tb_per_s"]["bwd"], max(r["err"].values()), same))
    if a.json:
        json.dump(results, open(a.json, "w"), indent=1)
    bad = [n for n, r in results.items() if not all(e < 1e-2 for e in r["err"].values())]
    if bad:
        print("too far from the float32 reference:", ", ".join(bad))
        sys.exit(1)


if __name__ == "__main__":
    main()
