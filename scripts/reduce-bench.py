#!/usr/bin/env python3
"""Checks and times leangrad's split column sums (reduce_cols_split4: a
bias gradient summed from a bf16 gradient straight into F32) at GPT-2
small's shapes on the GPU machine, for several numbers of stretches.

The source comes from `go run ./scripts/kernelsrc`. CuPy compiles it with
NVRTC and launches the kernel as kernels/cuda/ops.go's reduce does, with
the stretches its formula gives (auto) and others; PyTorch gives the
float64 reference.

    python3 scripts/reduce-bench.py --source kernels.cu auto 64 128 256

For each shape and number of stretches: the relative error against the
reference, the median device time and the bandwidth of reading the input.
"""
import argparse

import cupy as cp
import numpy as np
import torch
from devtime import rel, timed


def auto_splits(rows, cols, sms):
    """ops.go's reduce: stretches for four columns a lane."""
    fill = sms * 2048
    splits = min((rows + 63) // 64, fill // (8 * cols))
    return max(1, min((rows + 511) // 512, 4 * splits))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True, help="the kernels' CUDA C (go run ./scripts/kernelsrc)")
    ap.add_argument("--shapes", default="16384x768,16384x2304,16384x3072", help="rows x cols, comma-separated")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("splits", nargs="+", help="auto (ops.go's formula) or a number of stretches")
    a = ap.parse_args()
    mod = cp.RawModule(code=open(a.source).read(), options=("--std=c++17",))
    k = mod.get_function("reduce_cols_split4_bf16")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    done = torch.zeros(4096, dtype=torch.int32, device="cuda")
    i32 = np.int32
    ptr = lambda t: np.uint64(t.data_ptr())
    torch.manual_seed(1)
    print("| rows×cols | stretches | blocks | ms | TB/s | rel err |")
    print("|---|---:|---:|---:|---:|---:|")
    for shape in a.shapes.split(","):
        rows, cols = map(int, shape.split("x"))
        x = torch.randn(rows, cols, device="cuda").bfloat16()
        ref = x.double().sum(0)
        tiles = (cols + 127) // 128
        for s in a.splits:
            splits = auto_splits(rows, cols, sms) if s == "auto" else int(s)
            part = torch.empty(splits * cols, device="cuda")
            y = torch.full((cols,), float("nan"), device="cuda")
            run = lambda: k((tiles * splits, 1), (256,), (i32(1), i32(1), i32(rows), i32(cols), i32(splits), i32(1), ptr(x), ptr(part),
                                                          ptr(done), ptr(y)))
            run()
            torch.cuda.synchronize()
            err = rel(y, ref)
            ms = timed(run, a.iters)
            print("| %d×%d | %s (%d) | %d | %.4f | %.2f | %.1e |" % (rows, cols, s, splits, tiles * splits, ms, rows * cols * 2 / ms / 1e9, err),
                  flush=True)


if __name__ == "__main__":
    main()
